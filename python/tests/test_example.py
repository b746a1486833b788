"""examples/python_tour.py run as a user runs it (a fresh interpreter, another working directory):
it exits 0, writes three PNG images, and what it prints agrees with independent references (the
run's own metrics.jsonl, the `qkv sample` command on its checkpoint)."""
import json
import math
import os
import struct
import subprocess
import sys

import pytest
from PIL import Image

from conftest import BINARY_DIR, SOURCE_DIR

TOUR = SOURCE_DIR / "examples" / "python_tour.py"
PLOTS = ("loss.png", "consistency.png", "attention.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CONSISTENCY = ["kv_decode", "chunked_prefill", "padding_invariance", "packing_invariance", "batch_composition",
               "thread_count", "trainer_vs_sampler", "batched_generation"]


def run_tour(cwd, *args):
    # The interpreter running the tests is the one the module was built for (/usr/bin/python3); the
    # module path is made absolute, as the tour runs in another directory.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    return subprocess.run([sys.executable, str(TOUR), *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """The tour with its defaults, run from an empty directory; (its output directory, its summary)."""
    cwd, out = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("tour") / "out"
    r = run_tour(cwd, "--out", out, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(last) == ["summary"]
    assert not any(cwd.iterdir())  # nothing written outside --out
    return out, last["summary"]


def test_tour_writes_three_png_images(tour):
    out, summary = tour
    assert summary["plots"] == [str(out / name) for name in PLOTS]
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE, name
        # The first chunk is IHDR: width and height (big-endian), then a decoder reads the same size.
        assert data[12:16] == b"IHDR", name
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 300 and height >= 200, (name, width, height)
        with Image.open(out / name) as image:
            image.load()
            assert image.size == (width, height), name


def test_printed_losses_are_the_runs_own(tour):
    out, summary = tour
    with open(out / "run" / "metrics.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert [m["step"] for m in logged] == list(range(1, summary["steps"] + 1))
    assert summary["first_loss"] == logged[0]["loss"] and summary["final_loss"] == logged[-1]["loss"]
    assert summary["final_val_loss"] == logged[-1]["val_loss"]
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["checkpoint"] == str(out / "run" / f"ckpt_{summary['steps']:06d}.h5")


def test_printed_greedy_sample_is_the_commands(tour):
    _, summary = tour
    r = subprocess.run(map(str, [BINARY_DIR / "qkv", "sample", "--checkpoint", summary["checkpoint"], "--prompt",
                        summary["prompt"], "--temperature", "0", "--max-new-tokens", summary["greedy_tokens"],
                        "--numerics", "invariant", "--json"]), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["text"] == summary["greedy"]


def test_checks_the_tour_reports(tour):
    _, summary = tour
    assert summary["sampler_equals_trainer"] and summary["sampled_tokens"] >= 10
    assert summary["attention_gradcheck"]["pass"] and summary["attention_gradcheck"]["max_abs_err"] < 1e-6
    assert summary["model_gradcheck"]["pass"] and summary["model_gradcheck"]["max_abs_err"] < 1e-6
    assert list(summary["consistency"]) == CONSISTENCY
    for name, gaps in summary["consistency"].items():
        assert gaps["invariant"] == 0.0, name
        # Standard: float32 rounding of logits of size ~10, not 0 in general, far below 1e-3.
        assert math.isfinite(gaps["standard"]) and 0.0 <= gaps["standard"] < 1e-3, name
    assert summary["attention_row_sum_err"] < 1e-5
    assert summary["logprob_numpy_gap"] < 1e-5


def test_a_tour_that_cannot_write_its_output_exits_nonzero(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    r = run_tour(tmp_path, "--out", blocker / "out", "--json")
    assert r.returncode != 0
    assert str(blocker) in r.stderr.strip().splitlines()[-1]  # the error names the path, after the import
    assert "summary" not in r.stdout
