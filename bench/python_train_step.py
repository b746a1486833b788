#!/usr/bin/python3
"""A training step driven from Python (qkv.train, with a callback on every step) against the same
step driven by the `qkv train` command, on the same config; alternated rounds.

The time of one step is the marginal cost of training more steps: (T(long) - T(short)) /
(long - short steps) for each side, where T is the wall time of the whole run (qkv.train's call in
this process; the command's process from start to exit), so start-up, data loading, the final
validation and checkpoint cancel out. The Python side runs with log_interval = 1 and a callback
that keeps every metrics dict (what a notebook plotting a live loss curve does), so its figure
includes the callback's cost; the command logs at the same interval. Also shown: the median of
metrics.jsonl's ms_per_step (the step alone, timed inside the trainer) for both.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_train_step.py [--config configs/tiny.toml]
       [--set key=value]... [--short 10] [--long 40] [--rounds 3] [--qkv build/qkv] [--json]
Prints the per-step times and python/cli ratio (target: within 3%).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import qkv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def metrics_ms(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["ms_per_step"] for line in f]


def python_run(config, sets, steps, out_dir):
    seen = []
    t0 = time.perf_counter()
    qkv.train(config, [*sets, f"train.max_steps={steps}"], callback=seen.append, out_dir=out_dir, overwrite=True)
    seconds = time.perf_counter() - t0
    assert len(seen) == steps
    return seconds, metrics_ms(out_dir)


def cli_run(binary, config, sets, steps, out_dir):
    args = [binary, "train", "--config", config, "--quiet", "--overwrite"]
    for s in [*sets, f"train.max_steps={steps}", f"train.out_dir={out_dir}"]:
        args += ["--set", s]
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0, metrics_ms(out_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny.toml"))
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--short", type=int, default=10)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build", "qkv"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.long <= a.short:
        sys.exit("--long must exceed --short")
    sets = ["train.log_interval=1", "train.eval_interval=1000000", "train.checkpoint_interval=1000000",
            f"data.path={os.path.join(ROOT, 'data', 'corpus', 'tinyshakespeare.txt')}", *a.sets]
    per_step = {"python": [], "cli": []}
    inner = {"python": [], "cli": []}
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "run")
        runners = {
            "python": lambda n: python_run(a.config, sets, n, out),
            "cli": lambda n: cli_run(a.qkv, a.config, sets, n, out),
        }
        runners["cli"](a.short)  # warm-up: the prepared-data cache, page cache, OpenMP start
        runners["python"](a.short)
        for r in range(a.rounds):
            order = ["python", "cli"] if r % 2 == 0 else ["cli", "python"]
            for side in order:
                short, _ = runners[side](a.short)
                long, ms = runners[side](a.long)
                per_step[side].append((long - short) / (a.long - a.short) * 1000)
                inner[side].append(statistics.median(ms[1:]))
    result = {
        "config": a.config,
        "sets": a.sets,
        "steps": [a.short, a.long],
        "rounds": a.rounds,
        "python_ms_per_step": statistics.median(per_step["python"]),
        "cli_ms_per_step": statistics.median(per_step["cli"]),
        "python_inner_ms_per_step": statistics.median(inner["python"]),
        "cli_inner_ms_per_step": statistics.median(inner["cli"]),
        "rounds_python_ms": per_step["python"],
        "rounds_cli_ms": per_step["cli"],
    }
    result["ratio"] = result["python_ms_per_step"] / result["cli_ms_per_step"]
    # On a shared machine the least disturbed round is the fastest one; and the two sides of a round
    # ran back to back, so their ratio shares that round's load.
    result["min_ratio"] = min(per_step["python"]) / min(per_step["cli"])
    result["paired_ratio"] = statistics.median(p / c for p, c in zip(per_step["python"], per_step["cli"]))
    result["inner_ratio"] = result["python_inner_ms_per_step"] / result["cli_inner_ms_per_step"]
    print(f"per step (marginal wall time): python {result['python_ms_per_step']:.2f} ms, "
          f"cli {result['cli_ms_per_step']:.2f} ms (medians over rounds), ratio {result['ratio']:.3f}; "
          f"fastest rounds' ratio {result['min_ratio']:.3f}, median of per-round ratios {result['paired_ratio']:.3f}")
    print(f"per step (metrics ms_per_step, median): python {result['python_inner_ms_per_step']:.2f} ms, "
          f"cli {result['cli_inner_ms_per_step']:.2f} ms, ratio {result['inner_ratio']:.3f}")
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
