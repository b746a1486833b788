#!/usr/bin/env bash
# Side-by-side training-step benchmark: qkv vs the PyTorch reference on the same shape.
#
#   bench/compare_torch.sh CONFIG [PAIRS]      e.g. bench/compare_torch.sh configs/bench/M.toml 3
#
# Runs `qkv bench --what step --config CONFIG --threads T --json` and
# ../shared/bench/torch_gpt_bench.py with the shape read from CONFIG, alternately (qkv, torch,
# qkv, torch, ...: PAIRS pairs, default 3), both with OMP_WAIT_POLICY=PASSIVE, so that machine
# load drifts over both alike. Prints per pair and the median: qkv tokens/s, torch tokens/s,
# their ratio, and each one's peak RSS; also the sgemm rate of OpenBLAS on the step's own GEMM
# shapes (`qkv bench --what gemm`, run right after each qkv step run) and qkv's model GFLOP/s as a
# fraction of it. Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; THREADS (default 2); STEPS (timed steps per
# run, default 10); PYTHON (default /usr/bin/python3, Debian's python3-torch).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${1:?usage: bench/compare_torch.sh CONFIG [PAIRS]}"
pairs="${2:-3}"
build="${BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$repo/$build"
threads="${THREADS:-2}"
steps="${STEPS:-10}"
py="${PYTHON:-/usr/bin/python3}"
qkv="$build/qkv"
torch_bench="$repo/../shared/bench/torch_gpt_bench.py"

[[ -x "$qkv" ]] || { echo "compare_torch: $qkv not found (build it, or set BUILD_DIR)" >&2; exit 2; }
[[ -f "$torch_bench" ]] || { echo "compare_torch: $torch_bench not found" >&2; exit 2; }
[[ -f "$config" ]] || { echo "compare_torch: config $config not found" >&2; exit 2; }

# The shape: [model] n_layer n_head n_embd vocab_size block_size, [train] seq_len batch_size.
read -r L H C V BS T B < <("$py" - "$config" <<'PY'
import re, sys
sec, kv = None, {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    m = re.fullmatch(r"\[([^\]]+)\]", line)
    if m:
        sec = m.group(1).strip()
        continue
    m = re.fullmatch(r"([A-Za-z_]+)\s*=\s*(.+)", line)
    if m:
        kv[f"{sec}.{m.group(1)}"] = m.group(2).strip()
def get(key, default=None):
    if key in kv:
        return int(kv[key])
    if default is None:
        sys.exit(f"compare_torch: {sys.argv[1]} has no {key}")
    return default
bs = get("model.block_size")
print(get("model.n_layer"), get("model.n_head"), get("model.n_embd"), get("model.vocab_size"), bs,
      get("train.seq_len", bs), get("train.batch_size"))
PY
)
echo "shape: V=$V L=$L H=$H C=$C T=$T B=$B block_size=$BS, $threads threads, $steps timed steps, $pairs pairs" >&2

export OMP_WAIT_POLICY=PASSIVE
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for ((i = 1; i <= pairs; i++)); do
  "$qkv" bench --what step --config "$config" --threads "$threads" --steps "$steps" --json \
    >"$tmp/qkv.$i" 2>"$tmp/qkv.$i.err" || { cat "$tmp/qkv.$i.err" >&2; exit 1; }
  "$qkv" bench --what gemm --config "$config" --threads "$threads" --json \
    >"$tmp/gemm.$i" 2>"$tmp/gemm.$i.err" || { cat "$tmp/gemm.$i.err" >&2; exit 1; }
  "$py" "$torch_bench" --layers "$L" --heads "$H" --embd "$C" --seq "$T" --batch "$B" --vocab "$V" \
    --block_size "$BS" --threads "$threads" --steps "$steps" --json \
    >"$tmp/torch.$i" 2>"$tmp/torch.$i.err" || { cat "$tmp/torch.$i.err" >&2; exit 1; }
  echo "pair $i done ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
done

"$py" - "$tmp" "$pairs" "$config" <<'PY'
import json, statistics, sys
tmp, pairs, config = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def last_json(path):
    lines = [l for l in open(path).read().splitlines() if l.strip()]
    return json.loads(lines[-1])
rows = []
for i in range(1, pairs + 1):
    q = last_json(f"{tmp}/qkv.{i}")["results"][0]
    t = last_json(f"{tmp}/torch.{i}")
    g = [r for r in last_json(f"{tmp}/gemm.{i}")["results"] if r["name"] == "step-weighted"][0]
    rows.append(dict(gemm=g["gflops"], q_ms=q["ms_per_step"], q_tok=q["tokens_per_s"], q_gf=q["gflops"],
                     q_rss=q["peak_rss_bytes"] / 2**20, t_ms=t["ms_per_step"], t_tok=t["tokens_per_s"],
                     t_gf=t["gflops"], t_rss=t["maxrss_mb"]))
for r in rows:
    r["ratio"] = r["q_tok"] / r["t_tok"]
    r["frac"] = r["q_gf"] / r["gemm"]
hdr = f"{'':8}{'qkv ms':>9}{'torch ms':>10}{'qkv tok/s':>11}{'torch tok/s':>12}{'ratio':>7}{'qkv GF/s':>10}{'torch GF/s':>11}{'qkv RSS MB':>12}{'torch RSS MB':>13}{'sgemm GF/s':>11}{'of sgemm':>9}"
print(f"{config}")
print(hdr)
def line(name, r):
    print(f"{name:8}{r['q_ms']:9.1f}{r['t_ms']:10.1f}{r['q_tok']:11.0f}{r['t_tok']:12.0f}{r['ratio']:7.2f}"
          f"{r['q_gf']:10.1f}{r['t_gf']:11.1f}{r['q_rss']:12.0f}{r['t_rss']:13.0f}{r['gemm']:11.1f}{r['frac']:8.0%}")
for i, r in enumerate(rows, 1):
    line(f"pair {i}", r)
med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
line("median", med)
PY
