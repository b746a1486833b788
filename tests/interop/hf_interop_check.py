#!/usr/bin/python3
"""qkv <-> Hugging Face `transformers`, against the real thing (ctest label "interop").

  export: train a tiny gpt2, a tiny llama (GQA, 4 query heads over 2 kv heads) and the llama with a
          sliding window of 8 (exported as MistralForCausalLM) with `qkv train`,
          `qkv export` them, load with AutoModelForCausalLM.from_pretrained, and require HF's loss
          on a text (qkv eval's windows, computed in float64 from the float32 weights) to equal
          `qkv eval`'s within 1e-6 relative, and HF's greedy continuation to equal `qkv sample
          --temperature 0`'s. A gpt2_bpe model's exported tokenizer must give HF's ids.
          A byte model's exported tokenizer files must give the bytes as ids.
  import: make random GPT2LMHeadModel (with the GPT-2-style tokenizer of tests/reference/gpt2_bpe)
          and LlamaForCausalLM (GQA, RoPE base 500000, bf16, sharded; byte ids) in Python,
          save_pretrained, `qkv import`, and require the same two equalities; a llama saved with a
          linearly scaled RoPE must be refused naming the key.
Works with transformers 4.36 and 5.x (whose save_pretrained writes "rope_parameters" and "dtype",
always safetensors, and whose GPT2TokenizerFast takes the vocabulary itself, not file names).
Usage: /usr/bin/python3 tests/interop/hf_interop_check.py QKV_BINARY
Exit status: 0 all passed, 1 a check failed, 77 skipped (no torch/transformers; it says so).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast,
                              LlamaConfig, LlamaForCausalLM)
except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
    print(f"SKIP: {sys.executable} cannot import torch and transformers ({e}); "
          "scripts/test.sh installs them (python3-torch, pip transformers==4.36.2)")
    sys.exit(77)

V5 = int(transformers.__version__.split(".")[0]) >= 5
# transformers 5 renamed from_pretrained's torch_dtype to dtype and always saves safetensors.
FLOAT32 = {"dtype": torch.float32} if V5 else {"torch_dtype": torch.float32}
SAFE = {} if V5 else {"safe_serialization": True}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QKV = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "qkv")
TOL = 1e-6
failures = []
report = []


def qkv(*args):
    r = subprocess.run([QKV, *args, "--json"], capture_output=True)  # a byte model may print any bytes
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        raise RuntimeError(f"qkv {' '.join(args)} failed ({r.returncode}): {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def qkv_refusal(*args):
    r = subprocess.run([QKV, *args], capture_output=True)
    return r.returncode, r.stderr.decode("utf-8", "replace").strip()


def gpt2_tokenizer(bpe_dir):
    """The GPT-2-style tokenizer of vocab.json + merges.txt in `bpe_dir`, as a fast HF tokenizer."""
    vocab, merges = os.path.join(bpe_dir, "vocab.json"), os.path.join(bpe_dir, "merges.txt")
    if not V5:
        return GPT2TokenizerFast(vocab_file=vocab, merges_file=merges)
    pairs = [tuple(line.split(" ")) for line in open(merges, encoding="utf-8").read().splitlines()
             if line and not line.startswith("#version")]
    return GPT2TokenizerFast(vocab=json.load(open(vocab, encoding="utf-8")), merges=pairs, add_prefix_space=False)


def window_loss(model, ids, T):
    n = len(ids) // (T + 1)
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(n):
            w = torch.tensor(ids[k * (T + 1):(k + 1) * (T + 1)])
            logits = model(w[None, :-1]).logits[0]
            total += float(torch.nn.functional.cross_entropy(logits.double(), w[1:], reduction="sum"))
            count += T
    return total / count


def hf_reference(hf_dir, ids, T, prompt_ids, n_new):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **FLOAT32).eval()
    loss32 = window_loss(model, ids, T)
    with torch.no_grad():
        out = model.generate(torch.tensor(prompt_ids)[None], do_sample=False, max_new_tokens=n_new, pad_token_id=0,
                             eos_token_id=None)
    greedy = out[0, len(prompt_ids):].tolist()
    torch.set_default_dtype(torch.float64)  # transformers 4.36 builds llama's mask in the default dtype
    try:
        loss64 = window_loss(model.double(), ids, T)
    finally:
        torch.set_default_dtype(torch.float32)
    return loss32, loss64, greedy


def compare(name, ckpt, hf_dir, text_path, ids, prompt, prompt_ids, T):
    q = qkv("eval", "--checkpoint", ckpt, "--data", text_path)
    s = qkv("sample", "--checkpoint", ckpt, "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "20")
    loss32, loss64, greedy = hf_reference(hf_dir, ids, T, prompt_ids, 20)
    rel = abs(q["loss"] - loss64) / abs(loss64)
    report.append(f"{name}: qkv eval {q['loss']:.9f}, transformers float64 {loss64:.9f} (float32 {loss32:.9f}), "
                  f"relative difference {rel:.2e}; greedy {'equal' if s['tokens'] == greedy else 'DIFFERENT'}")
    if q["tokens"] != (len(ids) // (T + 1)) * T:
        failures.append(f"{name}: qkv scored {q['tokens']} tokens, HF {(len(ids) // (T + 1)) * T} (tokenization differs)")
    if not rel <= TOL:
        failures.append(f"{name}: loss differs by {rel:.2e} relative (> {TOL})")
    if s["tokens"] != greedy:
        failures.append(f"{name}: greedy tokens differ: qkv {s['tokens']} transformers {greedy}")


def widen(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and ("ln_" in name or "norm" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith("bias"):
                p.copy_(0.1 * r)
            else:
                p.copy_(0.2 * r)


def main():
    work = tempfile.mkdtemp(prefix="qkv_interop_")
    try:
        corpus = open(os.path.join(ROOT, "data", "corpus", "tinyshakespeare.txt"), encoding="utf-8").read()
        train_txt, eval_txt = os.path.join(work, "train.txt"), os.path.join(work, "eval.txt")
        open(train_txt, "w", encoding="utf-8").write(corpus[:60000])
        eval_text = corpus[200000:203000] + " Café 東京 😀 we're 2024!\n"
        open(eval_txt, "w", encoding="utf-8").write(eval_text)
        T = 32

        # ---- export: qkv-trained models into transformers ----
        # A llama with a sliding window (8 < T) exports as MistralForCausalLM(sliding_window = 8).
        for name, family, kv, window in (("gpt2", "gpt2", 4, 0), ("llama", "llama", 2, 0),
                                          ("mistral", "llama", 2, 8)):
            cfg = os.path.join(work, f"{name}.toml")
            open(cfg, "w").write(f"""[model]
family = "{family}"
n_layer = 2
n_head = 4
n_kv_head = {kv}
n_embd = 32
block_size = {T}
window = {window}
[data]
path = "{train_txt}"
tokenizer = "byte"
separator = "none"
[train]
batch_size = 8
max_steps = 40
lr = 3e-3
eval_interval = 1000
out_dir = "{os.path.join(work, 'run_' + name)}"
""")
            ckpt = qkv("train", "--config", cfg, "--quiet")["checkpoint"]
            hf_dir = os.path.join(work, f"hf_{name}")
            e = qkv("export", "--checkpoint", ckpt, "--out", hf_dir)
            ids = list(eval_text.encode("utf-8"))
            compare(f"export {name} ({e['architecture']})", ckpt, hf_dir, eval_txt, ids, "ROMEO:", list(b"ROMEO:"), T)
            # The byte tokenizer is exported as GPT-2 files of the 256 byte tokens and no merge.
            if AutoTokenizer.from_pretrained(hf_dir)(eval_text)["input_ids"] != ids:
                failures.append(f"export {name}: the exported byte tokenizer does not give the bytes as ids")

        # ---- import: transformers-made models into qkv ----
        bpe = os.path.join(ROOT, "tests", "reference", "gpt2_bpe")
        tok = gpt2_tokenizer(bpe)
        g = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=T, n_embd=48, n_layer=2, n_head=4,
                                       activation_function="gelu_new", bos_token_id=0, eos_token_id=0))
        widen(g, 21)
        gdir = os.path.join(work, "hf_random_gpt2")
        g.save_pretrained(gdir, **SAFE)
        tok.save_pretrained(gdir)
        gckpt = os.path.join(work, "random_gpt2.h5")
        qkv("import", "--from", gdir, "--out", gckpt)
        prompt = "It was the best"
        compare("import GPT2LMHeadModel + GPT-2 BPE", gckpt, gdir, eval_txt, tok(eval_text)["input_ids"], prompt,
                tok(prompt)["input_ids"], T)
        # The gpt2_bpe tokenizer survives qkv export: HF's tokenizer from the exported files gives the same ids.
        gout = os.path.join(work, "hf_reexport_gpt2")
        qkv("export", "--checkpoint", gckpt, "--out", gout)
        if AutoTokenizer.from_pretrained(gout)(eval_text)["input_ids"] != tok(eval_text)["input_ids"]:
            failures.append("re-exported gpt2_bpe tokenizer gives different ids in transformers")

        l = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False))
        widen(l, 22)
        ldir = os.path.join(work, "hf_random_llama")
        l.to(torch.bfloat16).save_pretrained(ldir, max_shard_size="60KB", **SAFE)
        lckpt = os.path.join(work, "random_llama.h5")
        qkv("import", "--from", ldir, "--out", lckpt, "--tokenizer", "byte")
        compare("import LlamaForCausalLM GQA bf16 sharded", lckpt, ldir, eval_txt, list(eval_text.encode("utf-8")),
                "ROMEO:", list(b"ROMEO:"), T)

        # A scaled RoPE, as this version writes it (4.x: rope_scaling; 5.x: rope_parameters), is refused by key.
        scaling = ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}} if V5 else
                   {"rope_scaling": {"type": "linear", "factor": 2.0}})
        sdir = os.path.join(work, "hf_scaled_llama")
        LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=T, **scaling).save_pretrained(sdir)
        key = "rope_parameters.rope_type" if V5 else "rope_scaling.type"
        rc, err = qkv_refusal("import", "--from", sdir, "--out", os.path.join(work, "scaled.h5"), "--tokenizer", "byte")
        report.append(f"import a linearly scaled RoPE: exit {rc}, {err.splitlines()[-1] if err else 'no message'}")
        if rc == 0 or f'"{key}" = "linear"' not in err:
            failures.append(f"a linearly scaled RoPE was not refused naming {key}: exit {rc}, {err[-500:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for line in report:
        print(line)
    if failures:
        for f in failures:
            print("FAIL:", f)
        sys.exit(1)
    print("interop: all checks passed")


if __name__ == "__main__":
    main()
