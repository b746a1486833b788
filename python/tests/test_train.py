"""qkv.train against the run's own metrics.jsonl and the `qkv train` command on the same config
(bitwise under numerics = invariant on the CPU): the callback, stopping from it, errors."""
import json
import subprocess
import tomllib

import pytest

import qkv
from conftest import BINARY_DIR, SOURCE_DIR

CONFIG = SOURCE_DIR / "configs" / "tiny.toml"
CORPUS = SOURCE_DIR / "data" / "corpus" / "tinyshakespeare.txt"
STEPS = 8
SETS = [f"train.max_steps={STEPS}", "train.log_interval=1", "train.eval_interval=4", "train.eval_batches=1",
        "train.numerics=invariant", f"data.path={CORPUS}"]


def metrics(out_dir):
    with open(out_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def cli_train(out_dir, sets=SETS):
    args = [str(BINARY_DIR / "qkv"), "train", "--config", str(CONFIG), "--quiet"]
    for s in [*sets, f"train.out_dir={out_dir}"]:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    r = cli_train(out)
    assert r.returncode == 0, r.stderr.decode()
    return metrics(out)


def test_callback_gets_every_step_equal_to_metrics_and_cli(tmp_path, cli_run):
    seen = []
    summary = qkv.train(str(CONFIG), SETS, callback=seen.append, out_dir=str(tmp_path))
    assert [m["step"] for m in seen] == list(range(1, STEPS + 1))
    assert seen == metrics(tmp_path)  # every field the run log writes
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "ms_per_step"} <= set(seen[0])
    assert [m["loss"] for m in seen] == [m["loss"] for m in cli_run]  # bitwise
    assert [m.get("val_loss") for m in seen] == [m.get("val_loss") for m in cli_run]
    assert summary["step"] == STEPS and not summary["stopped"]
    assert summary["loss"] == seen[-1]["loss"] and summary["val_loss"] == seen[-1]["val_loss"]
    assert summary["checkpoint"] == str(tmp_path / f"ckpt_{STEPS:06d}.h5")


def test_config_as_dict_or_text_trains_the_same(tmp_path, cli_run):
    cfg = tomllib.loads(CONFIG.read_text())
    dict_run = qkv.train(cfg, SETS, out_dir=str(tmp_path / "dict"))
    # numerics= is the CLI's --numerics (train.numerics).
    no_mode = [s for s in SETS if not s.startswith("train.numerics=")]
    text_run = qkv.train(CONFIG.read_text(), no_mode, numerics="invariant", out_dir=str(tmp_path / "text"))
    assert dict_run["loss"] == text_run["loss"] == cli_run[-1]["loss"]


def test_callback_returning_false_stops_with_a_checkpoint(tmp_path, cli_run):
    seen = []

    def stop_at_3(m):
        seen.append(m["loss"])
        return m["step"] < 3

    summary = qkv.train(str(CONFIG), SETS, callback=stop_at_3, out_dir=str(tmp_path))
    assert summary["stopped"] and summary["step"] == 3 and len(seen) == 3
    assert len(metrics(tmp_path)) == 3
    ckpt = tmp_path / "ckpt_000003.h5"
    assert summary["checkpoint"] == str(ckpt)
    assert qkv.load(str(ckpt)).step == 3
    # The stop was clean: resuming from its checkpoint finishes as the uninterrupted CLI run did.
    rest = []
    qkv.train(str(CONFIG), SETS, callback=rest.append, out_dir=str(tmp_path), resume=str(ckpt))
    assert seen + [m["loss"] for m in rest] == [m["loss"] for m in cli_run]


def test_a_resume_that_changes_the_global_batch_needs_change_global_batch(tmp_path):
    qkv.train(str(CONFIG), [*SETS, "train.max_steps=2"], out_dir=str(tmp_path))
    ckpt = tmp_path / "ckpt_000002.h5"
    batch = tomllib.loads(CONFIG.read_text())["train"]["batch_size"]
    other = [*SETS, f"train.batch_size={batch * 2}"]
    with pytest.raises(RuntimeError, match=f"{batch} rows in the run being resumed but {batch * 2} now"):
        qkv.train(str(CONFIG), other, out_dir=str(tmp_path), resume=str(ckpt))
    with pytest.raises(RuntimeError, match="change_global_batch=True needs resume"):
        qkv.train(str(CONFIG), other, out_dir=str(tmp_path / "new"), change_global_batch=True)
    summary = qkv.train(str(CONFIG), other, out_dir=str(tmp_path), resume=str(ckpt), change_global_batch=True)
    assert summary["step"] == STEPS
    # Any split of the same global batch resumes without the flag.
    split = [*SETS, f"train.batch_size={batch // 2}", "train.grad_accum=2"]
    qkv.train(str(CONFIG), [*SETS, "train.max_steps=2"], out_dir=str(tmp_path / "b"))
    assert qkv.train(str(CONFIG), split, out_dir=str(tmp_path / "b"),
                     resume=str(tmp_path / "b" / "ckpt_000002.h5"))["step"] == STEPS


def test_exception_in_callback_propagates_after_a_clean_stop(tmp_path):
    class Boom(Exception):
        pass

    def boom(m):
        if m["step"] == 2:
            raise Boom("from the callback")

    with pytest.raises(Boom, match="from the callback"):
        qkv.train(str(CONFIG), SETS, callback=boom, out_dir=str(tmp_path))
    assert (tmp_path / "ckpt_000002.h5").exists() and len(metrics(tmp_path)) == 2
    # The run released its directory: another run may take it over.
    assert qkv.train(str(CONFIG), SETS, out_dir=str(tmp_path), overwrite=True)["step"] == STEPS


@pytest.mark.parametrize("bad", ["train.max_steps=-1", "train.nope=1"])
def test_bad_override_raises_the_cli_message(tmp_path, bad):
    with pytest.raises(qkv.Error) as e:
        qkv.train(str(CONFIG), [*SETS, bad], out_dir=str(tmp_path))
    r = cli_train(tmp_path, [*SETS, bad])
    assert r.returncode == 2
    assert "qkv: " + str(e.value) == r.stderr.decode().strip().splitlines()[-1]


def test_ctrl_c_stops_at_a_logged_step_with_a_checkpoint(tmp_path):
    import os
    import signal
    import threading
    # SIGINT from another thread while the run goes on (the GIL released, no callback to notice it).
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            qkv.train(str(CONFIG), [*SETS, "train.max_steps=2000"], out_dir=str(tmp_path))
    finally:
        timer.cancel()
    last = metrics(tmp_path)[-1]["step"]
    assert last < 2000 and (tmp_path / f"ckpt_{last:06d}.h5").exists()
