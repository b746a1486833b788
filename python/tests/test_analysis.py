"""The analysis tools as functions (python/src/analysis.cpp) against independent references: the
`qkv` command's --json output on the same checkpoint / config, and attention weights recomputed in
numpy from the checkpoint's own parameters."""
import json
import subprocess

import h5py
import numpy as np
import pytest

import qkv
from conftest import BINARY_DIR, SOURCE_DIR

CORPUS = str(SOURCE_DIR / "data" / "corpus" / "tinyshakespeare.txt")
TINY = str(SOURCE_DIR / "configs" / "tiny.toml")
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 3
CONSISTENCY = ["kv_decode", "chunked_prefill", "padding_invariance", "packing_invariance", "batch_composition",
               "thread_count", "trainer_vs_sampler", "batched_generation"]


def cli(*args, ok=True):
    """The last stdout line of `qkv ARGS --json`, parsed."""
    p = subprocess.run([str(BINARY_DIR / "qkv"), *args, "--json"], capture_output=True, text=True, timeout=120)
    assert (p.returncode in (0, 1)) == ok, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def same_types(a, b):
    """Whether a and b are equal in types too (1 == 1.0 == True for ==): json.loads' types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    return a == b


def cli_error(*args):
    out = cli(*args, ok=False)
    assert out["exit"] == 2
    return out["error"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny checkpoint whose data.path is absolute (the CLI and the module then load the same corpus)."""
    out = tmp_path_factory.mktemp("ckpt")
    subprocess.run([str(BINARY_DIR / "qkv"), "train", "--config", TINY, "--set", "train.max_steps=5",
                    "--set", f'train.out_dir="{out}"', "--set", f'data.path="{CORPUS}"', "--overwrite", "--quiet"],
                   check=True, capture_output=True, timeout=120)
    return str(out / "best.h5")


@pytest.fixture(scope="module")
def model(ckpt):
    return qkv.load(ckpt)


# ---- leakcheck / consistency ----

def test_leakcheck_equals_the_cli_json(ckpt, model):
    got = qkv.leakcheck(model)
    want = cli("leakcheck", "--checkpoint", ckpt)
    assert got == want and same_types(got, want)
    names = [c["name"] for c in got["checks"]]
    assert "kv_decode" in names and "data.val_ngram_share" in names and got["failed"] == 0


def test_leakcheck_runs_only_the_families_asked_for(ckpt, model):
    got = qkv.leakcheck(model, checks=["train_vs_inference", "mask", "data"], consistency=False)
    want = cli("leakcheck", "--checkpoint", ckpt)
    kept = [c for c in want["checks"]
            if c["name"] in ("kv_decode", "chunked_prefill", "greedy_generation") or
            c["name"].startswith(("mask.", "data."))]
    assert got["checks"] == kept
    assert "consistency" not in got
    assert "skipped" not in got  # permutation_equivariance's reason belongs to a family not asked for
    only_data = qkv.leakcheck(model, checks="data", consistency=False)
    assert [c["name"] for c in only_data["checks"]] == ["data.val_ngram_share", "data.duplicated_docs"]


def test_invariant_consistency_checks_measure_exactly_zero(model):
    got = qkv.leakcheck(model, checks=["train_vs_inference", "padding", "packing_invariance", "batch_composition",
                                       "thread_count", "trainer_vs_sampler", "batched_generation"],
                        numerics="invariant")
    rows = {c["name"]: c for c in got["checks"]}
    for name in CONSISTENCY:
        assert rows[name]["value"] == 0.0 and rows[name]["threshold"] == 0.0, name
        assert rows[name]["per_position"] and set(rows[name]["per_position"]) == {0.0}, name
        assert rows[name]["diverges_at"] is None
    # Under standard the same checks get the float32 rounding bound instead of 0.
    std = {c["name"]: c for c in qkv.leakcheck(model, checks="train_vs_inference", numerics="standard",
                                               consistency=False)["checks"]}
    assert std["kv_decode"]["threshold"] > 0


def test_consistency_gives_both_modes_with_gaps_as_numpy(model):
    got = qkv.consistency(model)
    assert list(got) == CONSISTENCY
    listed = {row["name"]: row for row in qkv.leakcheck(model, checks="thread_count")["consistency"]}
    for name, row in got.items():
        inv, std = row["invariant"], row["standard"]
        assert inv["max_abs_delta"] == 0.0 and inv["diverges_at"] is None
        assert isinstance(inv["per_position"], np.ndarray) and inv["per_position"].dtype == np.float64
        assert not inv["per_position"].any()
        assert std["per_position"].max() == std["max_abs_delta"]  # the value is the largest gap by position
        for mode in ("standard", "invariant"):  # the same numbers as leakcheck's JSON rows
            want = listed[name][mode]
            assert row[mode]["per_position"].tolist() == want["per_position"]
            assert row[mode]["max_abs_delta"] == want["max_abs_delta"]


def test_leakcheck_refuses_an_unknown_check_naming_it_and_the_accepted(model):
    with pytest.raises(qkv.Error) as e:
        qkv.leakcheck(model, checks=["kv_decode_typo"])
    msg = str(e.value)
    assert "'kv_decode_typo'" in msg and "train_vs_inference" in msg and "data" in msg and "\n" not in msg
    with pytest.raises(qkv.Error, match="numerics 'fast' is not one of: standard"):
        qkv.leakcheck(model, numerics="fast")
    with pytest.raises(qkv.Error, match=r"ngram must be an integer in \[1, 1048576\]; got 0"):
        qkv.leakcheck(model, ngram=0)


# ---- attention maps ----

def layer0_weights(ckpt, ids):
    """softmax(q kᵀ / sqrt(hd) + causal mask) of layer 0, from the checkpoint's parameters (gpt2
    family: learned positions, LayerNorm, fused c_attn [C, C + 2·Hkv·hd] as x @ W + b, GQA)."""
    with h5py.File(ckpt, "r") as f:
        p = {k: np.asarray(v, dtype=np.float64) for k, v in f["model"].items()}
    n_head, n_kv, n = 4, 2, len(ids)
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][:n]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mu) / np.sqrt(var + 1e-5) * p["transformer.h.0.ln_1.weight"] + p["transformer.h.0.ln_1.bias"]
    qkv_ = h @ p["transformer.h.0.attn.c_attn.weight"] + p["transformer.h.0.attn.c_attn.bias"]
    C = x.shape[1]
    hd = C // n_head
    q = qkv_[:, :C].reshape(n, n_head, hd).transpose(1, 0, 2)
    k = qkv_[:, C:C + n_kv * hd].reshape(n, n_kv, hd).transpose(1, 0, 2)
    k = np.repeat(k, n_head // n_kv, axis=0)  # query head h reads kv head h // (Hq / Hkv)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def test_attention_map_is_softmax_of_the_checkpoints_q_k(ckpt, model):
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 65, size=20)]
    maps = qkv.attention_map(model, ids)
    assert maps.shape == (2, 4, 20, 20) and maps.dtype == np.float32
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    assert not np.triu(maps, k=1).any()  # causal: nothing above the diagonal, exactly
    np.testing.assert_allclose(maps[0], layer0_weights(ckpt, ids), atol=2e-6)
    # A layer / head selects its slice (the axis goes), from ids as numpy too.
    np.testing.assert_array_equal(qkv.attention_map(model, np.array(ids), layer=1), maps[1])
    np.testing.assert_array_equal(qkv.attention_map(model, ids, head=2), maps[:, 2])
    np.testing.assert_array_equal(qkv.attention_map(model, ids, layer=0, head=3), maps[0, 3])


def test_attention_map_of_a_text_reads_its_last_block_size_tokens(ckpt, model, tmp_path):
    want = cli("attention-map", "--checkpoint", ckpt, "--text", TEXT, "--out", str(tmp_path / "m.png"))
    maps = qkv.attention_map(model, TEXT)
    assert maps.shape == (2, 4, want["tokens"], want["tokens"]) and want["tokens"] == 32


def test_attention_map_errors_name_the_argument(ckpt, model, tmp_path):
    with pytest.raises(qkv.Error, match=r"^\[attention-map\] layer 2 is outside \[0, 2\)$"):
        qkv.attention_map(model, [1, 2], layer=2)
    with pytest.raises(qkv.Error, match=r"^\[attention-map\] head -1 is outside \[0, 4\)$"):
        qkv.attention_map(model, [1, 2], head=-1)
    with pytest.raises(qkv.Error, match=r"token 65 is outside the vocabulary of 65"):
        qkv.attention_map(model, [1, 65])
    with pytest.raises(qkv.Error, match="ids must hold integers"):
        qkv.attention_map(model, [0.5, 1.0])
    # Past block_size as ids: the analysis function's own refusal, as the CLI words it.
    with pytest.raises(qkv.Error, match=r"the text is 33 tokens; need 1 to block_size = 32"):
        qkv.attention_map(model, [1] * 33)


# ---- heads ----

def test_heads_equals_the_cli_json_plus_grids(ckpt, model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    want = cli("heads", "--checkpoint", ckpt, "--data", str(text), "--windows", "3", "--length", "24")
    # Both run in the checkpoint's train.numerics.
    got = qkv.heads(qkv.load(ckpt), TEXT, windows=3, length=24)
    grids, mean_maps = got.pop("score_grids"), got.pop("mean_maps")
    assert got == want and same_types(got, want)
    for h in want["heads"]:
        for name, v in h["scores"].items():
            assert grids[name][h["layer"], h["head"]] == v
        assert grids["label_score"][h["layer"], h["head"]] == h["label_score"]
    assert mean_maps.shape == (2, 4, 24, 24)
    np.testing.assert_allclose(mean_maps.sum(-1), 1.0, atol=1e-5)
    with pytest.raises(qkv.Error, match=r"^\[heads\] ids has 1 tokens; need at least 2$"):
        qkv.heads(model, [3])
    with pytest.raises(qkv.Error, match=r"peak_threshold must be a finite number in \(0, 1\]; got 0$"):
        qkv.heads(model, TEXT, peak_threshold=0.0)


# ---- cost ----

def test_cost_equals_the_cli_json_for_a_path_text_or_dict(tmp_path):
    sets = ["model.n_layer=3", f'data.path="{CORPUS}"']
    want = cli("cost", "--config", TINY, "--set", sets[0], "--set", sets[1], "--context", "24")
    got = qkv.cost(TINY, sets, context=24)
    assert got == want and same_types(got, want) and got["params"] > 0 and got["context"] == 24
    # The same config as TOML text and as a dict of sections: the same figures ("config" is no path).
    text = open(TINY).read()
    del want["config"]
    as_text = qkv.cost(text, sets, context=24)
    assert as_text.pop("config") is None and as_text == want
    as_dict = qkv.cost({"model": {"n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32, "block_size": 32,
                                  "dropout": 0.0},
                        "data": {"path": CORPUS, "tokenizer": "char", "separator": "none"},
                        "train.batch_size": 8}, context=24)
    assert as_dict.pop("config") is None and as_dict == want


def test_cost_errors_carry_the_cli_message(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(qkv.Error) as e:
        qkv.cost(missing)
    assert str(e.value) == cli_error("cost", "--config", missing)
    with pytest.raises(qkv.Error) as e:
        qkv.cost(TINY, ["model.n_head=5"])
    assert str(e.value) == cli_error("cost", "--config", TINY, "--set", "model.n_head=5")
    with pytest.raises(qkv.Error, match=r"context must be an integer in \[0, 1048576\]; got -1"):
        qkv.cost(TINY, context=-1)
    with pytest.raises(qkv.Error, match="config: key model.n_layer has a value of type list"):
        qkv.cost({"model": {"n_layer": [2]}})


# ---- study ----

STUDY = dict(lengths=[8, 16], budget_tokens=8 * 32 * 2, decode_tokens=2, eval_tokens=64, checks=False)


def test_study_matches_the_cli_on_a_two_step_run(tmp_path):
    sets = [f'data.path="{CORPUS}"']
    want = cli("study", "--config", TINY, "--set", sets[0], "--variants", "full", "--lengths", "8,16",
               "--budget-tokens", "512", "--decode-tokens", "2", "--eval-tokens", "64", "--no-checks",
               "--report", str(tmp_path / "cli"))
    lines = []
    got = qkv.study(TINY, "full", sets, progress=lines.append, **STUDY)
    assert lines and got["report"] is None
    assert [v["name"] for v in got["variants"]] == ["full"]
    g, w = got["variants"][0], want["variants"][0]
    # Timings differ run to run; what the training and the measurements compute does not.
    for key in ("val_loss", "steps", "train_tokens", "params", "overrides", "edges", "checks"):
        assert g[key] == w[key], key
    assert [c["val_loss"] for c in g["curve"]] == [c["val_loss"] for c in w["curve"]]
    for gl, wl in zip(g["lengths"], w["lengths"]):
        assert (gl["length"], gl["val_loss"], gl["kv_cache_bytes"]) == (wl["length"], wl["val_loss"], wl["kv_cache_bytes"])
    # The base config as TOML text: written to a file for the run, reported by what it was.
    as_text = qkv.study(open(TINY).read(), "full", sets, **STUDY)
    assert as_text["base"] == "config text" and as_text["variants"][0]["val_loss"] == g["val_loss"]
    # A kept work directory resumes the finished variant.
    d = str(tmp_path / "py")
    qkv.study(TINY, ["full"], sets, dir=d, **STUDY)
    again = qkv.study(TINY, ["full"], sets, dir=d, **STUDY)
    assert again["variants"][0]["resumed"] and again["variants"][0]["val_loss"] == g["val_loss"]


def test_study_refuses_a_bad_variant_with_the_cli_message():
    with pytest.raises(qkv.Error) as e:
        qkv.study(TINY, "full,sparse", **STUDY)
    assert str(e.value) == cli_error("study", "--config", TINY, "--variants", "full,sparse", "--report", "/tmp/unused")
