#!/usr/bin/env python3
"""Fixtures for tests/train/test_hf_interop.cpp in the file schema of `transformers` 5: the models of
tests/reference/hf/ (made by transformers 4.36.2, make_hf_fixture.py) loaded and saved again by
transformers 5, so CI tests what 5.x writes without installing it. Only the small files are kept;
the tests put them beside the weights of tests/reference/hf/<name>/, which saving again does not
change (safetensors, same dtype, same names).

Run in a virtual environment with transformers >= 5 and torch 2.x, e.g.
  python3 -m venv /tmp/tf5 && /tmp/tf5/bin/pip install "transformers>=5" torch
  /tmp/tf5/bin/python tests/reference/make_hf5_fixture.py
Writes into tests/reference/hf5/:
  gpt2_tiny/             config.json ("dtype", not "torch_dtype"), tokenizer.json (a
                         TemplateProcessing post_processor adding no token) and tokenizer_config.json
                         of GPT2LMHeadModel + GPT2Tokenizer saved by save_pretrained
  gpt2_tiny/post_processor_add_bos.json   the post_processor transformers 5 writes for that
                         tokenizer with add_bos_token=True (it adds <|endoftext|> in front)
  llama_gqa_tiny/        config.json: RoPE base 500 under "rope_parameters", no top-level rope_theta
  llama_gqa_tiny_llama3/ config.json of the same network with Llama 3's scaled RoPE
                         (rope_parameters.rope_type = "llama3")
and checks that transformers 5 still gives the 4.36 fixture's logits for the saved models.
"""
import json
import os
import shutil
import tempfile

import torch
import transformers
from transformers import GPT2LMHeadModel, GPT2TokenizerFast, LlamaConfig, LlamaForCausalLM

assert int(transformers.__version__.split(".")[0]) >= 5, f"needs transformers >= 5, this is {transformers.__version__}"

HERE = os.path.dirname(os.path.abspath(__file__))
V4 = os.path.join(HERE, "hf")
OUT = os.path.join(HERE, "hf5")
KEEP = ("config.json", "tokenizer.json", "tokenizer_config.json")


def keep_small_files(saved, name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f in KEEP:
        if os.path.exists(os.path.join(saved, f)):
            shutil.copy(os.path.join(saved, f), d)
    return d


def check_logits(model, name):
    e = json.load(open(os.path.join(V4, name + ".expected.json")))
    T = e["block_size"]
    with torch.no_grad():
        logits = model.double()(torch.tensor(e["ids"][:T])[None]).logits[0, :4].reshape(-1)
    worst = float((logits - torch.tensor(e["logits_first_window"], dtype=torch.float64)).abs().max())
    print(f"{name}: transformers {transformers.__version__} logits vs the 4.36 fixture's: max |diff| {worst:.2e}")
    assert worst < 1e-4, name


def gpt2(work):
    bpe = os.path.join(HERE, "gpt2_bpe")
    vocab = json.load(open(os.path.join(bpe, "vocab.json"), encoding="utf-8"))
    merges = [tuple(line.split(" ")) for line in open(os.path.join(bpe, "merges.txt"), encoding="utf-8").read().splitlines()
              if line and not line.startswith("#version")]
    model = GPT2LMHeadModel.from_pretrained(os.path.join(V4, "gpt2_tiny"), dtype=torch.float32)
    saved = os.path.join(work, "gpt2")
    model.save_pretrained(saved)
    GPT2TokenizerFast(vocab=vocab, merges=merges, add_prefix_space=False).save_pretrained(saved)
    d = keep_small_files(saved, "gpt2_tiny")
    check_logits(GPT2LMHeadModel.from_pretrained(saved, dtype=torch.float32).eval(), "gpt2_tiny")
    bos = os.path.join(work, "gpt2_bos")
    GPT2TokenizerFast(vocab=vocab, merges=merges, add_prefix_space=False, add_bos_token=True).save_pretrained(bos)
    with open(os.path.join(d, "post_processor_add_bos.json"), "w") as f:
        json.dump(json.load(open(os.path.join(bos, "tokenizer.json")))["post_processor"], f, indent=2)
        f.write("\n")


def llama(work):
    model = LlamaForCausalLM.from_pretrained(os.path.join(V4, "llama_gqa_tiny"), dtype=torch.bfloat16)
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": 500.0}, model.config.rope_parameters
    saved = os.path.join(work, "llama")
    model.save_pretrained(saved)
    keep_small_files(saved, "llama_gqa_tiny")
    check_logits(LlamaForCausalLM.from_pretrained(saved, dtype=torch.float32).eval(), "llama_gqa_tiny")

    cfg = LlamaConfig.from_pretrained(saved)
    cfg.rope_parameters = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    scaled = os.path.join(work, "llama3")
    cfg.save_pretrained(scaled)
    keep_small_files(scaled, "llama_gqa_tiny_llama3")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    work = tempfile.mkdtemp(prefix="qkv_hf5_")
    try:
        gpt2(work)
        llama(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for root, _, files in sorted(os.walk(OUT)):
        for f in sorted(files):
            print(os.path.join(root, f), os.path.getsize(os.path.join(root, f)))
