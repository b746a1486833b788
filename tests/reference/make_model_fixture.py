#!/usr/bin/python3
"""Golden end-to-end fixtures for tests/nn/test_model_golden.cpp: a tiny "gpt2" and a tiny "llama"
decoder written here in plain torch (no `transformers`), computed in float64.

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/reference/make_model_fixture.py
Writes tests/reference/golden_gpt2.json and tests/reference/golden_llama.json next to itself.

The two models are written from the math, independently of the C++ code:
  block(x)  = h + mlp(norm2(h)),  h = x + attn(norm1(x))            (pre-norm)
  attn      = softmax(q k^T / sqrt(hd) + causal -inf) v, per head; GQA: query head h reads kv head
              h // (Hq / Hkv) (repeat_interleave of K/V along the head axis)
  gpt2      = token + learned position embeddings, LayerNorm with bias (biased variance, eps 1e-5),
              GELU tanh 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), fused c_attn whose output
              rows are [q | k | v], biases everywhere, tied head (logits = ln_f(x) wte^T)
  llama     = RoPE rotate-half on q and k (theta 10000, angle p * theta^(-2f/hd) for f < hd/2,
              dim f paired with f + hd/2), RMSNorm x / sqrt(mean(x^2) + eps) * w, SwiGLU
              down(silu(gate(x)) * up(x)), no biases, untied lm_head
  loss      = mean cross-entropy over all B*T targets

File format (one JSON object):
  config      the qkv [model] keys the C++ side must use (ffn_hidden is the resolved value; for
              llama it comes from ffn_multiple_of = 16: int(2*4C/3) = 42 rounded up to 48)
  ids, targets  [B, T] int lists
  params      list of {name, shape, decay, value, grad}: every parameter by its qkv / Hugging Face
              name in qkv's layout (Linear weights [out, in], i.e. NOT GPT-2 Conv1D's [in, out]),
              row-major. `value` holds float32-representable numbers (the init is drawn in
              float32 and widened) written with 9 significant digits, which round-trips float32
              exactly, so C++ loads bit-identical parameters. `grad` is d loss / d param at the
              initial parameters (float64, 12 significant digits). `decay` is true for 2-d tensors.
  logits      [B, T, V] at the initial parameters (float64, 12 significant digits)
  loss        the initial loss (float64, 17 significant digits)
  adamw       the optimizer settings, and `losses`: 11 values, losses[k] the loss after k steps of
              torch.optim.AdamW (float64 parameters, two groups: weight_decay on the 2-d tensors,
              0 on the rest; no clipping) on the same batch, k = 0..10.
Weights are drawn with larger spreads than GPT-2's 0.02 (0.1-0.3), norm gains around 1 and
biases nonzero, so every term of the forward and backward moves the numbers.
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)

B, T = 2, 8
ADAMW = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "steps": 10}


# ---- building blocks, written from their formulas ----

def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased, as LayerNorm defines it
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + torch.exp(-x))


def rope(x, theta):
    # x [B, H, T, hd]; positions 0..T-1
    hd, n = x.shape[-1], x.shape[-2]
    half = hd // 2
    f = torch.arange(half, dtype=torch.float64)
    inv = theta ** (-2.0 * f / hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]  # [T, hd/2]
    cos = torch.cat([torch.cos(ang), torch.cos(ang)], -1)
    sin = torch.cat([torch.sin(ang), torch.sin(ang)], -1)
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def causal_attention(q, k, v):
    # q [B, Hq, T, hd], k/v [B, Hkv, T, hd]
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    n = q.shape[-2]
    future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    s = s.masked_fill(future, float("-inf"))
    p = torch.exp(s - s.max(-1, keepdim=True).values)
    p = p / p.sum(-1, keepdim=True)
    return p @ v


def split_heads(x, h):
    b, t, c = x.shape
    return x.reshape(b, t, h, c // h).transpose(1, 2)


def merge_heads(x):
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def cross_entropy(logits, targets):
    lp = logits - torch.logsumexp(logits, -1, keepdim=True)
    return -lp.gather(-1, targets[..., None]).mean()


# ---- the two families ----

def gpt2_forward(P, cfg, ids):
    L, Hq, Hkv, C = cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"]
    hd, eps = C // Hq, cfg["norm_eps"]
    x = P["transformer.wte.weight"][ids] + P["transformer.wpe.weight"][torch.arange(ids.shape[1])]
    for l in range(L):
        p = lambda n: P[f"transformer.h.{l}.{n}"]
        a = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), eps)
        qkv = linear(a, p("attn.c_attn.weight"), p("attn.c_attn.bias"))
        q, k, v = qkv.split([Hq * hd, Hkv * hd, Hkv * hd], -1)
        y = merge_heads(causal_attention(split_heads(q, Hq), split_heads(k, Hkv), split_heads(v, Hkv)))
        x = x + linear(y, p("attn.c_proj.weight"), p("attn.c_proj.bias"))
        m = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), eps)
        m = gelu_tanh(linear(m, p("mlp.c_fc.weight"), p("mlp.c_fc.bias")))
        x = x + linear(m, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"))
    x = layer_norm(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
    return x @ P["transformer.wte.weight"].t()


def llama_forward(P, cfg, ids):
    L, Hq, Hkv, C = cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["n_embd"]
    eps, theta = cfg["norm_eps"], cfg["rope_theta"]
    x = P["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = lambda n: P[f"model.layers.{l}.{n}"]
        a = rms_norm(x, p("input_layernorm.weight"), eps)
        q = rope(split_heads(linear(a, p("self_attn.q_proj.weight")), Hq), theta)
        k = rope(split_heads(linear(a, p("self_attn.k_proj.weight")), Hkv), theta)
        v = split_heads(linear(a, p("self_attn.v_proj.weight")), Hkv)
        x = x + linear(merge_heads(causal_attention(q, k, v)), p("self_attn.o_proj.weight"))
        m = rms_norm(x, p("post_attention_layernorm.weight"), eps)
        m = silu(linear(m, p("mlp.gate_proj.weight"))) * linear(m, p("mlp.up_proj.weight"))
        x = x + linear(m, p("mlp.down_proj.weight"))
    x = rms_norm(x, P["model.norm.weight"], eps)
    return linear(x, P["lm_head.weight"])


def gpt2_shapes(cfg):
    V, C, F, hd = cfg["vocab_size"], cfg["n_embd"], cfg["ffn_hidden"], cfg["n_embd"] // cfg["n_head"]
    qkv = (cfg["n_head"] + 2 * cfg["n_kv_head"]) * hd
    s = [("transformer.wte.weight", [V, C]), ("transformer.wpe.weight", [cfg["block_size"], C])]
    for l in range(cfg["n_layer"]):
        h = f"transformer.h.{l}."
        s += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
              (h + "attn.c_attn.weight", [qkv, C]), (h + "attn.c_attn.bias", [qkv]),
              (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
              (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
              (h + "mlp.c_fc.weight", [F, C]), (h + "mlp.c_fc.bias", [F]),
              (h + "mlp.c_proj.weight", [C, F]), (h + "mlp.c_proj.bias", [C])]
    return s + [("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]


def llama_shapes(cfg):
    V, C, F, hd = cfg["vocab_size"], cfg["n_embd"], cfg["ffn_hidden"], cfg["n_embd"] // cfg["n_head"]
    kv = cfg["n_kv_head"] * hd
    s = [("model.embed_tokens.weight", [V, C])]
    for l in range(cfg["n_layer"]):
        h = f"model.layers.{l}."
        s += [(h + "input_layernorm.weight", [C]),
              (h + "self_attn.q_proj.weight", [C, C]), (h + "self_attn.k_proj.weight", [kv, C]),
              (h + "self_attn.v_proj.weight", [kv, C]), (h + "self_attn.o_proj.weight", [C, C]),
              (h + "post_attention_layernorm.weight", [C]),
              (h + "mlp.gate_proj.weight", [F, C]), (h + "mlp.up_proj.weight", [F, C]),
              (h + "mlp.down_proj.weight", [C, F])]
    return s + [("model.norm.weight", [C]), ("lm_head.weight", [V, C])]


def init_params(shapes, seed):
    """float32 draws widened to float64: the C++ side loads exactly these numbers."""
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in shapes:
        r = torch.randn(*shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight") or ".ln_" in name:
            t = 1.0 + 0.1 * r if name.endswith(".weight") else 0.1 * r  # gains near 1, biases small
        elif name.endswith(".bias"):
            t = 0.1 * r
        elif "wte" in name or "embed_tokens" in name or "wpe" in name or "lm_head" in name:
            t = 0.3 * r
        else:
            t = 0.2 * r
        P[name] = t.float().double().requires_grad_(True)
    return P


def fmt(values, digits):
    return "[" + ",".join(format(float(v), f".{digits}g") for v in values) + "]"


def run(family, cfg, seed):
    torch.manual_seed(seed)
    forward = gpt2_forward if family == "gpt2" else llama_forward
    shapes = gpt2_shapes(cfg) if family == "gpt2" else llama_shapes(cfg)
    P = init_params(shapes, seed)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)

    logits = forward(P, cfg, ids)
    loss = cross_entropy(logits, targets)
    loss.backward()
    init_values = {n: P[n].detach().clone() for n, _ in shapes}
    grads = {n: P[n].grad.detach().clone() for n, _ in shapes}
    logits0, loss0 = logits.detach().clone(), float(loss)

    decay = [P[n] for n, s in shapes if len(s) >= 2]
    no_decay = [P[n] for n, s in shapes if len(s) < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            foreach=False)
    losses = [loss0]
    for _ in range(ADAMW["steps"]):
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy(forward(P, cfg, ids), targets)
        loss.backward()
        losses.append(float(loss))

    lines = ["{", f' "family": "{family}",', f' "torch_version": "{torch.__version__}",',
             f' "config": {json.dumps(cfg)},', f' "ids": {json.dumps(ids.tolist())},',
             f' "targets": {json.dumps(targets.tolist())},',
             f' "adamw": {json.dumps(dict(ADAMW, losses=[float(format(x, ".17g")) for x in losses]))},',
             f' "loss": {loss0!r},', f' "logits_shape": {list(logits0.shape)},',
             f' "logits": {fmt(logits0.reshape(-1).tolist(), 12)},', ' "params": [']
    for i, (name, shape) in enumerate(shapes):
        lines.append(f'  {{"name": "{name}", "shape": {shape}, "decay": {"true" if len(shape) >= 2 else "false"},'
                     f' "value": {fmt(init_values[name].reshape(-1).tolist(), 9)},'
                     f' "grad": {fmt(grads[name].reshape(-1).tolist(), 12)}}}' + ("," if i + 1 < len(shapes) else ""))
    lines += [" ]", "}"]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"golden_{family}.json")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    json.load(open(path))  # the file must parse
    print(f"wrote {path} ({os.path.getsize(path)} bytes): loss {loss0:.6f} -> {losses[-1]:.6f}")


GPT2 = {"family": "gpt2", "vocab_size": 37, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 16,
        "block_size": T, "ffn_hidden": 64, "norm_eps": 1e-5, "rope_theta": 10000.0}
LLAMA = {"family": "llama", "vocab_size": 37, "n_layer": 2, "n_head": 4, "n_kv_head": 1, "n_embd": 16,
         "block_size": T, "ffn_hidden": 48, "ffn_multiple_of": 16, "norm_eps": 1e-5, "rope_theta": 10000.0}

def self_check():
    """The hand-written pieces agree with torch's own (guards the reference itself)."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(7)
    x, w, b = (torch.randn(3, 5, 16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g))
    assert torch.allclose(layer_norm(x, w, b, 1e-5), F.layer_norm(x, (16,), w, b, 1e-5), atol=1e-12)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-12)
    assert torch.allclose(silu(x), F.silu(x), atol=1e-12)
    logits, tg = torch.randn(10, 37, generator=g), torch.randint(0, 37, (10,), generator=g)
    assert abs(float(cross_entropy(logits, tg)) - float(F.cross_entropy(logits, tg))) < 1e-12
    # attention: per query row, the softmax over visible keys of one head, by explicit loops
    q, k, v = torch.randn(1, 4, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    out = causal_attention(q, k, v)
    for h in range(4):
        for i in range(5):
            s = torch.stack([q[0, h, i] @ k[0, h // 2, j] / 2.0 for j in range(i + 1)])
            ref = (torch.softmax(s, 0)[:, None] * v[0, h // 2, : i + 1]).sum(0)
            assert torch.allclose(out[0, h, i], ref, atol=1e-12)
    # RoPE: a rotation of each (f, f + hd/2) pair by p * theta^(-2f/hd)
    y = rope(q, 10000.0)
    p, f = 3, 1
    a = p * 10000.0 ** (-2.0 * f / 4)
    x0, x1 = q[0, 0, p, f], q[0, 0, p, f + 2]
    assert abs(float(y[0, 0, p, f] - (x0 * math.cos(a) - x1 * math.sin(a)))) < 1e-12
    assert abs(float(y[0, 0, p, f + 2] - (x1 * math.cos(a) + x0 * math.sin(a)))) < 1e-12


if __name__ == "__main__":
    self_check()
    run("gpt2", GPT2, 1234)
    run("llama", LLAMA, 5678)
