"""qkv.load / qkv.Model against independent references: Hugging Face transformers (logits of
random gpt2 and llama models), a float64 numpy log-softmax (loss), and the `qkv` command on the
same checkpoint (eval --per-token, sample, gradcheck, error messages)."""
import json
import subprocess
import threading

import numpy as np
import pytest

import qkv
from conftest import BINARY_DIR, SOURCE_DIR

CORPUS = SOURCE_DIR / "data" / "corpus" / "tinyshakespeare.txt"
TOKENIZER_DIR = SOURCE_DIR / "tests" / "reference" / "gpt2_bpe"
HF_TOL = 1e-6  # tests/interop/hf_interop_check.py's relative bound on the loss
# Elementwise, relative to the largest |logit|: transformers' own float32 forward is 1.4e-6 away
# from its float64 one on the llama below, so float32 logits get a few times that.
LOGIT_TOL = 5e-6


def cli(*args, check=True):
    r = subprocess.run([str(BINARY_DIR / "qkv"), *map(str, args)], capture_output=True)
    if check:
        assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    return r


def cli_json(*args):
    return json.loads(cli(*args, "--json").stdout.decode("utf-8", "replace").strip().splitlines()[-1])


def cli_error(*args):
    r = cli(*args, check=False)
    assert r.returncode == 2
    line = r.stderr.decode().strip().splitlines()[-1]
    assert line.startswith("qkv: ")
    return line[len("qkv: "):]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny char model trained a few steps by the CLI (train.numerics = invariant)."""
    out = tmp_path_factory.mktemp("run")
    cli("train", "--config", SOURCE_DIR / "configs" / "tiny.toml", "--set", "train.max_steps=4", "--set",
        f"data.path={CORPUS}", "--set", f"train.out_dir={out}", "--set", "train.numerics=invariant", "--set",
        "train.eval_batches=1", "--quiet")
    return str(out / "ckpt_000004.h5")


@pytest.fixture(scope="module")
def wide_ckpt(tmp_path_factory):
    """The same, 256 wide: products whose K (256 and 1024) exceeds the k block of the standard
    mode's GEMM kernels, so standard and invariant logits differ on any CPU (at 32 wide, OpenBLAS's
    AVX-512 kernel sums in the invariant chain's order and the two modes give the same bits)."""
    out = tmp_path_factory.mktemp("run_wide")
    cli("train", "--config", SOURCE_DIR / "configs" / "tiny.toml", "--set", "train.max_steps=2", "--set",
        f"data.path={CORPUS}", "--set", f"train.out_dir={out}", "--set", "train.numerics=invariant", "--set",
        "train.eval_batches=1", "--set", "model.n_embd=256", "--quiet")
    return str(out / "ckpt_000002.h5")


@pytest.fixture(scope="module")
def model(ckpt):
    return qkv.load(ckpt)


def widen(model, seed):
    """Random weights of a useful size (transformers' init makes near-uniform logits)."""
    import torch
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


def hf_logits64(hf, ids):
    """transformers' logits in float64 (from the same float32 weights)."""
    import torch
    torch.set_default_dtype(torch.float64)  # transformers 4.36 builds llama's mask in the default dtype
    try:
        with torch.no_grad():
            return hf.eval().double()(torch.tensor(ids)).logits.numpy()
    finally:
        torch.set_default_dtype(torch.float32)


def next_token_loss(logits, ids):
    lp = log_softmax64(logits[:, :-1])
    return -np.take_along_axis(lp, ids[:, 1:, None], axis=-1).mean()


def assert_logits_close(ours, ref, ids):
    ours = np.asarray(ours.numpy(), dtype=np.float64)
    assert ours.shape == ref.shape
    err = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    assert err <= LOGIT_TOL, f"max |qkv - transformers| / max |transformers| = {err:.3g}"
    assert next_token_loss(ours, ids) == pytest.approx(next_token_loss(ref, ids), rel=HF_TOL)


def test_logits_match_transformers_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    # From the directory: transformers 5 ignores vocab_file= and merges_file= (an empty vocabulary).
    tok = transformers.GPT2TokenizerFast.from_pretrained(str(TOKENIZER_DIR))
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=len(tok), n_positions=24, n_embd=48, n_layer=2,
                                                              n_head=4, activation_function="gelu_new"))
    widen(hf, 21)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    m = qkv.load(str(tmp_path))
    assert (m.vocab_size, m.block_size) == (len(tok), 24)
    assert m.config["model"]["family"] == "gpt2" and m.config["model"]["n_embd"] == 48
    ids = np.random.default_rng(0).integers(0, len(tok), size=(2, 24))
    assert_logits_close(m.logits(ids), hf_logits64(hf, ids), ids)
    # The directory's tokenizer is HF's: the same ids, and text back.
    text = "It was the best of times, it was the worst"
    assert m.tokenizer.encode(text) == tok(text)["input_ids"]
    assert m.tokenizer.decode(m.tokenizer.encode(text)) == text


def test_logits_match_transformers_llama_gqa(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=24, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False))
    widen(hf, 22)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    m = qkv.load(str(tmp_path))
    assert m.config["model"]["family"] == "llama" and m.config["model"]["n_kv_head"] == 2
    assert repr(m).startswith("<qkv.Model llama n_layer=2 n_embd=48 vocab_size=256 block_size=24")
    assert m.tokenizer is None  # no tokenizer files: ids only
    ids = np.random.default_rng(1).integers(0, 256, size=(3, 20))
    assert_logits_close(m.logits(ids), hf_logits64(hf, ids), ids)
    with pytest.raises(qkv.Error, match="has none; give token ids"):
        m.generate("text", max_new_tokens=1)
    # Its ids are bytes: said as `qkv import --tokenizer byte` says it.
    b = qkv.load(str(tmp_path), tokenizer="byte")
    assert b.tokenizer.kind == "byte" and b.tokenizer.encode("ROMEO:") == list(b"ROMEO:")
    assert b.generate("ROMEO:", max_new_tokens=6, temperature=0) == m.generate(list(b"ROMEO:"), max_new_tokens=6,
                                                                                 temperature=0)


def log_softmax64(z):
    z = z.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def test_loss_equals_float64_log_softmax_of_logits(model):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, model.vocab_size, size=(3, 32))
    targets = rng.integers(0, model.vocab_size, size=(3, 32))
    targets[1, 5:9] = -100  # ignored
    lp = log_softmax64(np.asarray(model.logits(ids).numpy()))
    keep = targets != -100
    rows = np.nonzero(keep)
    ref = -lp[rows[0], rows[1], targets[keep]].mean()
    assert model.loss(ids, targets) == pytest.approx(ref, rel=1e-6)
    # A list of ids is one sequence (B = 1).
    seq = ids[0].tolist()
    assert model.logits(seq).shape == (1, 32, model.vocab_size)
    assert model.loss(seq[:-1], seq[1:]) == pytest.approx(
        -log_softmax64(np.asarray(model.logits(seq[:-1]).numpy()))[0, np.arange(31), seq[1:]].mean(), rel=1e-6)


def test_token_logprobs_equal_cli_eval_per_token(model, ckpt):
    ids = np.random.default_rng(3).integers(0, model.vocab_size, size=80)
    ours = model.token_logprobs(ids)
    cli_lp = cli_json("eval", "--checkpoint", ckpt, "--ids", ",".join(map(str, ids)), "--per-token")["per_token"]
    # Windows of block_size + 1 = 33 tokens score 32 each (their first is context), the last 14 score 13.
    assert ours.dtype == np.float64 and ours.shape == (32 + 32 + 13,)
    assert np.array_equal(ours, np.array(cli_lp["logprob"]))  # bit for bit
    # A batch scores each row as the one window it is: the same values as the row alone.
    rows = ids[:66].reshape(2, 33)
    batch = model.token_logprobs(rows)
    assert batch.shape == (2, 32)
    assert np.array_equal(batch[0], ours[:32]) and np.array_equal(batch[1], ours[32:64])


def test_generate_equals_cli_sample(model, ckpt):
    prompt = "ROMEO:"
    ids = model.tokenizer.encode(prompt)
    greedy = cli_json("sample", "--checkpoint", ckpt, "--prompt", prompt, "--temperature", "0", "--max-new-tokens",
                      "20")
    assert greedy["prompt_tokens"] == ids  # the tokenizer gives the CLI's ids
    assert model.generate(ids, max_new_tokens=20, temperature=0) == greedy["tokens"]
    assert model.generate(prompt, max_new_tokens=20, temperature=0) == greedy["tokens"]
    drawn = cli_json("sample", "--checkpoint", ckpt, "--prompt", prompt, "--temperature", "0.9", "--top-k", "20",
                     "--seed", "7", "--max-new-tokens", "20", "--logprobs")
    tokens, logprobs = model.generate(ids, max_new_tokens=20, temperature=0.9, top_k=20, seed=7, logprobs=True)
    assert tokens == drawn["tokens"]
    assert np.array_equal(logprobs, np.array(drawn["logprobs"]))
    assert model.tokenizer.decode(greedy["tokens"]) == greedy["text"]


def test_batched_generate_equals_each_prompt_alone(ckpt):
    m = qkv.load(ckpt, numerics="invariant")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, m.vocab_size, size=n).tolist() for n in (1, 7, 3, 12, 5)]
    batch = m.generate(prompts, max_new_tokens=12, temperature=0, batch_size=3)
    assert len(batch) == 5 and all(len(b) == 12 for b in batch)
    assert batch == [m.generate(p, max_new_tokens=12, temperature=0) for p in prompts]


def test_tokenizer_round_trip(model):
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    ids = model.tokenizer.encode(text)
    assert model.tokenizer.vocab_size == model.vocab_size == 65
    assert all(0 <= i < 65 for i in ids) and len(ids) == len(text)  # char tokenizer
    assert model.tokenizer.decode(ids) == text


def test_errors_carry_the_cli_message(model, ckpt, tmp_path):
    missing = str(tmp_path / "missing.h5")
    with pytest.raises(qkv.Error) as e:
        qkv.load(missing)
    assert str(e.value) == cli_error("sample", "--checkpoint", missing)
    with pytest.raises(qkv.Error) as e:
        model.token_logprobs([0, 70, 1])
    assert "--" + str(e.value) == cli_error("eval", "--checkpoint", ckpt, "--ids", "0,70,1")
    with pytest.raises(qkv.Error, match="token ids must be integers"):
        model.logits(np.zeros(4, dtype=np.float32))
    with pytest.raises(qkv.Error, match="33 tokens is more than the model's block_size of 32"):
        model.logits(list(range(33)))
    with pytest.raises(qkv.Error, match="is a checkpoint, which holds its tokenizer"):
        qkv.load(ckpt, tokenizer="byte")
    with pytest.raises(qkv.Error, match="numerics 'fast' is not one of"):
        qkv.load(ckpt, numerics="fast")
    with pytest.raises(qkv.Error, match=r"threads = 0 is outside \[1, "):
        qkv.load(ckpt, threads=0)
    with pytest.raises(qkv.Error, match="prompts: an empty list"):
        model.generate([], max_new_tokens=2)
    with pytest.raises(qkv.Error, match="temperature"):
        model.generate([1], max_new_tokens=2, temperature=-1)


def test_parameters_share_the_weights(ckpt):
    m = qkv.load(ckpt)
    params = m.parameters()
    assert "transformer.h.1.attn.c_attn.weight" in params and "lm_head.weight" not in params  # tied head
    wte = np.asarray(params["transformer.wte.weight"].numpy())
    assert wte.shape == (65, 32)
    ids = [5, 9, 2, 40]
    before = np.asarray(m.logits(ids).numpy()).astype(np.float64)
    # The final LayerNorm's bias adds to every position's hidden state, so the (tied) head adds
    # wte @ delta to every row of logits.
    delta = np.linspace(-0.5, 0.5, 32).astype(np.float32)
    np.asarray(params["transformer.ln_f.bias"].numpy())[...] += delta
    after = np.asarray(m.logits(ids).numpy()).astype(np.float64)
    assert np.allclose(after - before, (wte.astype(np.float64) @ delta)[None, None, :], atol=1e-4)


def test_gradcheck_equals_cli(model, ckpt):
    ours = model.gradcheck(directions=1, elements=1)
    assert ours["pass"] and ours["deterministic"]
    assert len(ours["directions"]) == 1 and len(ours["params"]) == len(model.parameters())
    theirs = cli_json("gradcheck", "--config", SOURCE_DIR / "configs" / "tiny.toml", "--set", f"data.path={CORPUS}",
                      "--set", "model.vocab_size=65", "--directions", "1", "--elements", "1")
    assert ours["loss"] == theirs["loss"]


def test_two_models_in_two_modes_run_at_once_on_two_threads(wide_ckpt):
    """The numerics mode and thread count are each model's own, set on the calling thread for each
    call (python/src/model.h, ModelScope): used at once from two Python threads, a standard and an
    invariant model each give the bits it gives alone."""
    std = qkv.load(wide_ckpt, numerics="standard", threads=1)
    inv = qkv.load(wide_ckpt, numerics="invariant", threads=2)
    assert (std.numerics, std.threads, inv.numerics, inv.threads) == ("standard", 1, "invariant", 2)
    assert "numerics=invariant threads=2" in repr(inv)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, std.vocab_size, size=(8, 32))
    seq = rng.integers(0, std.vocab_size, size=80)
    prompt = ids[0, :5].tolist()
    cut = 13

    def results(m):
        return {"logits": np.array(m.logits(ids).numpy()), "prefix": np.array(m.logits(ids[:, :cut]).numpy()),
                "logprobs": m.token_logprobs(seq), "tokens": m.generate(prompt, max_new_tokens=8, temperature=0)}

    alone = {"standard": results(std), "invariant": results(inv)}
    # What tells the modes apart: the two models' bits differ (the wide model's products are summed
    # in other orders by the two modes), so a call run in the other model's mode gives other bits
    # than its model's alone. Invariant also keeps a prefix's logits bitwise those rows of the
    # whole sequence's; standard may or may not, by its GEMM kernel's blocking on this CPU.
    assert not np.array_equal(alone["standard"]["logits"], alone["invariant"]["logits"])
    assert np.array_equal(alone["invariant"]["prefix"], alone["invariant"]["logits"][:, :cut])

    start = threading.Barrier(2)
    failures = {"standard": [], "invariant": []}

    def use(m, rounds=100):
        try:
            start.wait()
            for i in range(rounds):
                got = results(m)
                for key, want in alone[m.numerics].items():
                    same = np.array_equal(got[key], want) if key != "tokens" else got[key] == want
                    if not same:
                        failures[m.numerics].append(f"round {i}: {key}")
        except Exception as e:  # noqa: BLE001 (reported below)
            failures[m.numerics].append(repr(e))

    threads = [threading.Thread(target=use, args=(m,)) for m in (std, inv)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == {"standard": [], "invariant": []}
