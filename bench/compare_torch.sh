#!/usr/bin/env bash
# Side-by-side training-step benchmark: qkv vs the PyTorch reference on the same shape.
#
#   bench/compare_torch.sh CONFIG [PAIRS]      e.g. bench/compare_torch.sh configs/bench/M.toml 3
#
# Runs `qkv bench --what step --config CONFIG --threads T --json` and
# bench/torch_reference.py step with the shape read from CONFIG, alternately (qkv, torch,
# qkv, torch, ...: PAIRS pairs, default 3), both with OMP_WAIT_POLICY=PASSIVE, so that machine
# load drifts over both alike. Prints per pair and the median: qkv tokens/s, torch tokens/s,
# their ratio, and each one's peak RSS; also the sgemm rate of OpenBLAS on the step's own GEMM
# shapes (`qkv bench --what gemm`, run right after each qkv step run) and qkv's model GFLOP/s as a
# fraction of it; and each side's median CPU time per step (user + system, all threads), whose
# ratio is far less sensitive to other load on the machine than the wall-clock one. Builds nothing.
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
torch_bench="$repo/bench/torch_reference.py"

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
[[ -n "${B:-}" ]] || { echo "compare_torch: could not read the shape from $config" >&2; exit 2; }
echo "shape: V=$V L=$L H=$H C=$C T=$T B=$B block_size=$BS, $threads threads, $steps timed steps, $pairs pairs" >&2

export OMP_WAIT_POLICY=PASSIVE
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for ((i = 1; i <= pairs; i++)); do
  "$qkv" bench --what step --config "$config" --threads "$threads" --steps "$steps" --json \
    >"$tmp/qkv.$i" 2>"$tmp/qkv.$i.err" || { cat "$tmp/qkv.$i.err" >&2; exit 1; }
  "$qkv" bench --what gemm --config "$config" --threads "$threads" --json \
    >"$tmp/gemm.$i" 2>"$tmp/gemm.$i.err" || { cat "$tmp/gemm.$i.err" >&2; exit 1; }
  "$py" "$torch_bench" step --layers "$L" --heads "$H" --embd "$C" --seq "$T" --batch "$B" --vocab "$V" \
    --block-size "$BS" --threads "$threads" --steps "$steps" --json \
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
    t_cpu = t["cpu_ms_per_step"]
    g = [r for r in last_json(f"{tmp}/gemm.{i}")["results"] if r["name"] == "step-weighted"][0]
    rows.append(dict(q_cpu=q.get("cpu_ms_per_step", float("nan")), t_cpu=t_cpu, gemm=g["gflops"], q_ms=q["ms_per_step"], q_tok=q["tokens_per_s"], q_gf=q["gflops"],
                     q_rss=q["peak_rss_bytes"] / 2**20, t_ms=t["ms_per_step"], t_tok=t["tokens_per_s"],
                     t_gf=t["gflops"], t_rss=t["peak_rss_bytes"] / 2**20))
for r in rows:
    r["ratio"] = r["q_tok"] / r["t_tok"]
    r["frac"] = r["q_gf"] / r["gemm"]
    r["cpu_ratio"] = r["t_cpu"] / r["q_cpu"]
print(config)
cols = [  # (header, key, format); each column as wide as its header + 1
    ("qkv ms", "q_ms", ".1f"), ("torch ms", "t_ms", ".1f"), ("qkv tok/s", "q_tok", ".0f"),
    ("torch tok/s", "t_tok", ".0f"), ("ratio", "ratio", ".2f"), ("qkv GF/s", "q_gf", ".1f"),
    ("torch GF/s", "t_gf", ".1f"), ("sgemm GF/s", "gemm", ".1f"), ("of sgemm", "frac", ".0%"),
    ("qkv cpu ms", "q_cpu", ".1f"), ("torch cpu ms", "t_cpu", ".1f"), ("cpu ratio", "cpu_ratio", ".2f"),
    ("qkv RSS MB", "q_rss", ".0f"), ("torch RSS MB", "t_rss", ".0f")]
print(f"{'':8}" + "".join(f"{h:>{len(h) + 2}}" for h, _, _ in cols))
def line(name, r):
    print(f"{name:8}" + "".join(f"{format(r[k], f):>{len(h) + 2}}" for h, k, f in cols))
for i, r in enumerate(rows, 1):
    line(f"pair {i}", r)
med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
line("median", med)
PY
