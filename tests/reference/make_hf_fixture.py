#!/usr/bin/python3
"""Fixtures for tests/train/test_hf_interop.cpp: tiny models made and saved by Hugging Face `transformers`
(save_pretrained, safetensors), with the loss, logits and greedy continuation `transformers`
computes for them, so the import path is checked against the real thing without Python.

Run: /usr/bin/python3 tests/reference/make_hf_fixture.py   (torch 1.13, transformers 4.36.2)
Writes into tests/reference/hf/:
  gpt2_tiny/          GPT2LMHeadModel (vocab 662 = the gpt2_bpe fixture's tokenizer, whose
                      vocab.json/merges.txt are saved beside it by GPT2TokenizerFast), float32,
                      one model.safetensors; tied head; dropout 0.1 in the config (eval ignores it)
  llama_gqa_tiny/     LlamaForCausalLM, 4 query heads over 2 kv heads, rope_theta 500, untied head,
                      saved in bfloat16 and sharded (model-0000k-of-0000n.safetensors + index);
                      no tokenizer files: its ids are bytes (`qkv import --tokenizer byte`)
  <name>.expected.json  {"text", "ids", "block_size", "loss", "logits_first_window" (the first 4
                      positions of the first window: [4, V] logits, row-major), "prompt_ids", "greedy"}
The loss is qkv eval's: consecutive non-overlapping windows of block_size + 1 ids, mean
cross-entropy of the next-token predictions, computed in float64 (weights as saved, widened).
Weights are drawn wider than GPT-2's init (std 0.2, random norm gains and biases) so every term
moves the numbers.
"""
import json
import os
import shutil

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hf")
TEXT = ("It was the best of times, it was the worst of times; we're told they'll come at 10:30. "
        "Café naïve 東京 😀 — numbers 3.14159 and 2024!\n\n  Indented line\tand tab. ") * 2


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


def window_loss(model, ids, T):
    n = len(ids) // (T + 1)
    total, count = 0.0, 0
    for k in range(n):
        w = torch.tensor(ids[k * (T + 1):(k + 1) * (T + 1)])
        logits = model(w[None, :-1]).logits[0]
        total += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
        count += T
    return total / count


def expected(model, ids, T, name):
    model = model.double().eval()
    torch.set_default_dtype(torch.float64)  # transformers 4.36 builds llama's mask in the default dtype
    with torch.no_grad():
        loss = window_loss(model, ids, T)
        logits = model(torch.tensor(ids[:T])[None]).logits[0, :4]
        prompt = ids[:5]
        out = model.generate(torch.tensor(prompt)[None], do_sample=False, max_new_tokens=12, pad_token_id=0,
                             eos_token_id=None)
    torch.set_default_dtype(torch.float32)
    greedy = out[0, len(prompt):].tolist()
    data = {"transformers_version": transformers.__version__, "torch_version": torch.__version__, "text": TEXT,
            "ids": ids, "block_size": T, "loss": loss,
            "logits_first_window": [float(format(x, ".12g")) for x in logits.reshape(-1).tolist()],
            "prompt_ids": prompt, "greedy": greedy}
    with open(os.path.join(OUT, name + ".expected.json"), "w") as f:
        json.dump(data, f)
        f.write("\n")
    print(f"{name}: {len(ids)} ids, loss {loss:.6f}, greedy {greedy}")


def gpt2():
    d = os.path.join(OUT, "gpt2_tiny")
    shutil.rmtree(d, ignore_errors=True)
    bpe = os.path.join(HERE, "gpt2_bpe")
    tok = GPT2TokenizerFast(vocab_file=os.path.join(bpe, "vocab.json"), merges_file=os.path.join(bpe, "merges.txt"),
                            add_prefix_space=False)
    cfg = GPT2Config(vocab_size=662, n_positions=32, n_embd=32, n_layer=2, n_head=4, activation_function="gelu_new",
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(11)
    model = GPT2LMHeadModel(cfg)
    widen(model, 11)
    model.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    for extra in ("tokenizer.json",):  # keep the files GPT-2 itself ships: vocab.json + merges.txt
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    ids = tok(TEXT)["input_ids"]
    back = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32)
    expected(back, ids, 32, "gpt2_tiny")


def llama():
    d = os.path.join(OUT, "llama_gqa_tiny")
    shutil.rmtree(d, ignore_errors=True)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=500.0,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(12)
    model = LlamaForCausalLM(cfg)
    widen(model, 12)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True, max_shard_size="40KB")
    ids = list(TEXT.encode("utf-8"))
    back = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    expected(back, ids, 32, "llama_gqa_tiny")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gpt2()
    llama()
    for root, _, files in os.walk(OUT):
        for f in sorted(files):
            print(os.path.join(root, f), os.path.getsize(os.path.join(root, f)))
