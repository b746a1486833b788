#!/usr/bin/python3
"""The PyTorch side of qkv's side-by-side benchmarks (PyTorch 2.x from PyPI, or 1.13 and later).

  torch_reference.py step --layers L --heads H --embd C --seq T --batch B --vocab V
                          [--block-size N] [--steps S] [--threads K] [--json]
                          [--mode eager|compile|bf16] [--attn sdpa|manual]
  torch_reference.py attention --n N --hkv HKV [--attn sdpa|manual] [--threads K] [--json]
  torch_reference.py modes        three lines: the step modes this torch supports, its version,
                                  and its attention forms (the default first)

bench/torch2_venv.sh makes a virtual environment with today's PyTorch for it.

`step` times what `qkv bench --what step` times on a gpt2-family config: one training step of a
GPT-2-shaped model (learned positions, pre-LayerNorm blocks, causal attention (--attn), GELU
with the tanh approximation, 4C MLP, final LayerNorm, LM head tied to the token embedding, every
Linear and LayerNorm with a bias, dropout 0) on one fixed batch of uniformly random tokens:
zero_grad, forward, cross-entropy, backward, AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
decay 0.1 on the matrices only). Initialisation: N(0, 0.02), residual output projections
N(0, 0.02 / sqrt(2L)), zero biases. Untimed warm-up steps (3; 5 with
--mode compile), then the median of S timed steps, in wall-clock and in process CPU time
(user + system, all threads).

What a PyTorch user would pick:
  --attn sdpa     attention through F.scaled_dot_product_attention(is_causal=True), on the CPU
                  PyTorch's flash kernel (the default where torch has it, 2.0 and later);
  --attn manual   matmul + mask + softmax + matmul (the default on torch 1.13).
  --mode eager    plain float32 (the default);
  --mode compile  torch.compile of the model + loss (TorchInductor); compilation happens in the
                  warm-up steps, whose time is reported apart (compile_s) and not in the median;
  --mode bf16     torch.autocast("cpu", dtype=torch.bfloat16) around forward + loss, with the
                  float32 master weights, backward and AdamW as in eager.
A mode or attention form this torch lacks is refused with one line on stderr and exit status 2.

Model FLOPs per step, the same count qkv reports (fwd + bwd = 3x fwd, causal attention halved):
    6 B T N_nonemb + 6 B T C V + 6 L B T^2 C,  N_nonemb = 12 L C^2 + 13 L C + 2 C.

`attention` times causal attention alone, forward + backward, on B = 1, 8 query heads of width 64,
HKV key/value heads (GQA), float32; the same work as `qkv bench --what attention`. --attn sdpa
(the default where torch has it) runs F.scaled_dot_product_attention(is_causal=True), PyTorch's CPU
flash kernel, with enable_gqa where torch has it and the shared heads repeated otherwise;
--attn manual the matmul/mask/softmax/matmul form with repeat_interleave. It reports the median
time and the growth of the peak RSS (for the manual form, the N x N scores and their gradient).

With --json the last stdout line is one JSON object. Run with OMP_WAIT_POLICY=PASSIVE on a
2-core machine so idle OpenMP threads do not spin against the timed work.
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


def refuse(message):
    """A mode this torch cannot run: one line on stderr, exit status 2."""
    print(f"torch_reference: {message} (torch {torch.__version__})", file=sys.stderr)
    sys.exit(2)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def bf16_autocast_works():
    if not hasattr(torch, "autocast"):
        return False
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    except Exception:  # noqa: BLE001 - any failure means the mode is unavailable
        return False


def supported_modes():
    """The --mode values this torch can run, in the order compare_torch.sh runs them."""
    modes = ["eager"]
    if hasattr(torch, "compile"):
        modes.append("compile")
    if bf16_autocast_works():
        modes.append("bf16")
    return modes


def check_choices(a):
    """Resolves --attn's default and refuses what this torch lacks."""
    if a.attn is None:
        a.attn = "sdpa" if has_sdpa() else "manual"
    if a.attn == "sdpa" and not has_sdpa():
        refuse("--attn sdpa needs F.scaled_dot_product_attention (PyTorch 2.0 or later)")
    mode = getattr(a, "mode", "eager")
    if mode == "compile" and not hasattr(torch, "compile"):
        refuse("--mode compile needs torch.compile (PyTorch 2.0 or later)")
    if mode == "bf16" and not bf16_autocast_works():
        refuse("--mode bf16 needs torch.autocast on the CPU with bfloat16")


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def timed(fn, warmup, repeats):
    """Median wall-clock and process-CPU seconds of fn() over `repeats` calls after `warmup`
    untimed ones, and the wall-clock seconds the warm-up took."""
    w0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    warmup_s = time.perf_counter() - w0
    wall, cpu = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), warmup_s


# ---- the training step ----

class Block(nn.Module):
    def __init__(self, C, H, attn):
        super().__init__()
        self.H, self.sdpa = H, attn == "sdpa"
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)        # GPT-2's c_attn
        self.attn_out = nn.Linear(C, C)       # c_proj of the attention
        self.fc = nn.Linear(C, 4 * C)
        self.fc_out = nn.Linear(4 * C, C)     # c_proj of the MLP

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = (t.reshape(B, T, self.H, C // self.H).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(C // self.H)
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.attn_out(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, N, L, H, C, attn):
        super().__init__()
        self.tok = nn.Embedding(V, C)
        self.pos = nn.Embedding(N, C)
        self.blocks = nn.ModuleList(Block(C, H, attn) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                continue
            std = 0.02 / math.sqrt(2 * L) if name.endswith(("attn_out.weight", "fc_out.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)

    def forward(self, ids, targets):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.tok.weight.t()   # head tied to the token embedding
        # The loss in float32, under autocast too.
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def bench_step(a):
    L, H, C, T, B, V = a.layers, a.heads, a.embd, a.seq, a.batch, a.vocab
    N = a.block_size or T
    if C % H or T > N:
        sys.exit(f"torch_reference: bad shape (n_embd {C} % n_head {H}, seq {T} > block size {N})")
    torch.manual_seed(a.seed)
    model = GPT(V, N, L, H, C, a.attn).train()
    params = sum(p.numel() for p in model.parameters())
    non_embedding = params - V * C - N * C
    assert non_embedding == 12 * L * C * C + 13 * L * C + 2 * C, "the model is not GPT-2-shaped"
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1},
                             {"params": vectors, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    ids, targets = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    # The model + loss as the mode runs them; backward and AdamW stay eager in every mode.
    forward = torch.compile(model) if a.mode == "compile" else model
    last = {}

    def step():
        opt.zero_grad(set_to_none=True)
        if a.mode == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(ids, targets)
        else:
            loss = forward(ids, targets)
        loss.backward()
        opt.step()
        last["loss"] = loss.item()

    # torch.compile traces and compiles forward and backward in the first step; the later warm-up
    # steps let any recompilation happen before the timed ones.
    warmup = 5 if a.mode == "compile" else 3
    wall, cpu, warmup_s = timed(step, warmup, a.steps)
    flops = 6 * B * T * non_embedding + 6 * B * T * C * V + 6 * L * B * T * T * C
    result = {"name": "torch-step", "mode": a.mode, "attn": a.attn, "ms_per_step": wall * 1e3,
              "cpu_ms_per_step": cpu * 1e3, "tokens_per_s": B * T / wall, "gflops": flops / wall * 1e-9,
              "flops_per_step": flops, "params": params, "non_embedding_params": non_embedding,
              "peak_rss_bytes": peak_rss_bytes(), "threads": torch.get_num_threads(), "final_loss": last["loss"],
              "warmup_steps": warmup, "warmup_s": warmup_s, "torch": torch.__version__}
    if a.mode == "compile":
        result["compile_s"] = warmup_s - warmup * wall  # the warm-up beyond steady-state steps
    print(f"torch {torch.__version__} {a.mode}, attention {a.attn}, {result['threads']} threads: V={V} L={L} H={H} "
          f"C={C} T={T} B={B} block_size={N}; {wall * 1e3:.1f} ms/step ({cpu * 1e3:.1f} ms CPU), "
          f"{B * T / wall:.0f} tokens/s, {result['gflops']:.1f} GFLOP/s, peak RSS "
          f"{result['peak_rss_bytes'] / 2**20:.0f} MiB, {warmup} warm-up steps in {warmup_s:.1f} s")
    return result


# ---- attention alone ----

def bench_attention(a):
    H, D, N, Hkv = 8, 64, a.n, a.hkv
    if Hkv < 1 or H % Hkv:
        sys.exit(f"torch_reference: --hkv {Hkv} must divide the 8 query heads")
    torch.manual_seed(0)
    q = torch.randn(1, H, N, D, requires_grad=True)
    k = torch.randn(1, Hkv, N, D, requires_grad=True)
    v = torch.randn(1, Hkv, N, D, requires_grad=True)
    d_out = torch.randn(1, H, N, D)
    gqa_kwarg = False
    if a.attn == "sdpa" and Hkv != H:
        try:  # enable_gqa: PyTorch 2.5 and later
            F.scaled_dot_product_attention(q[:, :, :2].detach(), k[:, :, :2].detach(), v[:, :, :2].detach(),
                                           is_causal=True, enable_gqa=True)
            gqa_kwarg = True
        except TypeError:
            pass
    future = None if a.attn == "sdpa" else torch.ones(N, N, dtype=torch.bool).triu(1)

    def shared(t):
        return t if Hkv == H or gqa_kwarg else t.repeat_interleave(H // Hkv, dim=1)

    def step():
        kk, vv = shared(k), shared(v)
        if a.attn == "sdpa":
            out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                 **({"enable_gqa": True} if gqa_kwarg else {}))
        else:
            weights = (q @ kk.transpose(-1, -2) / math.sqrt(D)).masked_fill(future, float("-inf")).softmax(dim=-1)
            out = weights @ vv
        out.backward(d_out)
        q.grad = k.grad = v.grad = None

    before = peak_rss_bytes()
    wall, cpu, _ = timed(step, 1, 5 if N <= 1024 else 3)
    result = {"name": "torch-attention", "kernel": "torch", "attn": a.attn, "n": N, "hkv": Hkv, "ms": wall * 1e3,
              "cpu_ms": cpu * 1e3, "peak_bytes": peak_rss_bytes() - before, "threads": torch.get_num_threads(),
              "torch": torch.__version__}
    print(f"torch {torch.__version__} attention ({a.attn}) N={N} hkv={Hkv}: {wall * 1e3:.1f} ms "
          f"({cpu * 1e3:.1f} ms CPU), peak RSS growth {result['peak_bytes'] / 2**20:.0f} MiB")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step", help="one GPT-2-shaped training step")
    for name, default in (("layers", 4), ("heads", 4), ("embd", 128), ("seq", 64), ("batch", 12), ("vocab", 65)):
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--block-size", type=int, default=0, help="position-embedding rows (default: --seq)")
    s.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up steps")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--mode", choices=("eager", "compile", "bf16"), default="eager",
                   help="eager float32, torch.compile of model + loss, or bf16 autocast (default eager)")
    t = sub.add_parser("attention", help="causal attention forward + backward")
    t.add_argument("--n", type=int, required=True)
    t.add_argument("--hkv", type=int, default=8)
    sub.add_parser("modes", help="print the step modes, the torch version and the attention forms")
    for p in (s, t):
        p.add_argument("--attn", choices=("sdpa", "manual"), default=None,
                       help="F.scaled_dot_product_attention or matmul/mask/softmax/matmul "
                            "(default sdpa where torch has it)")
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--json", action="store_true", help="print the figures as one JSON line last")
    a = ap.parse_args()
    if a.what == "modes":
        print(" ".join(supported_modes()))
        print(torch.__version__)
        print("sdpa manual" if has_sdpa() else "manual")
        return
    check_choices(a)
    torch.set_num_threads(a.threads)
    result = bench_step(a) if a.what == "step" else bench_attention(a)
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
