#!/usr/bin/env bash
# Side-by-side training-step benchmark: qkv vs PyTorch on the same shape, in each mode a PyTorch
# user would pick.
#
#   bench/compare_torch.sh CONFIG [PAIRS]      e.g. bench/compare_torch.sh configs/bench/M.toml 3
#   PYTHON=~/venv-torch2/bin/python bench/compare_torch.sh configs/bench/S.toml   # today's PyTorch
#
# Runs `qkv bench --what step --config CONFIG --threads T --json` and bench/torch_reference.py step
# with the shape read from CONFIG, alternately: each of the PAIRS rounds (default 3) runs, for every
# torch mode, a qkv run and then that torch mode's run (qkv, eager, qkv, compile, qkv, bf16, ...), so
# that machine load drifts over both sides of each ratio alike; all with OMP_WAIT_POLICY=PASSIVE.
# The torch modes (TORCH_MODES, default: every one the installed torch supports, of
# "eager compile bf16"): eager float32, torch.compile of the model + loss (compile time excluded),
# bf16 autocast around forward + loss, against which qkv runs its own bf16 autocast
# (train.dtype = "bf16"; in the other modes the config's dtype); attention through SDPA where torch has it
# (TORCH_ATTN=manual for matmul/mask/softmax/matmul). bench/torch2_venv.sh makes a virtual
# environment with the current PyTorch.
#
# Prints the CPU and the kernels qkv chose (`qkv bench --json`'s environment), qkv's
# `bench --what gemm` step-weighted aggregate (its GEMM kernel and the BLAS's sgemm on the step's
# own shapes, run once per round), and per torch mode the median over the rounds of: ms per step of
# each side, the speed-up qkv/torch (torch ms over qkv ms: above 1, qkv is faster), the CPU-time
# ratio (torch CPU ms over qkv CPU ms, user + system of all threads, far less sensitive to other
# load than the wall clock), and peak RSS. Per-round figures go to stderr. Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; THREADS (default 2); STEPS (timed steps per
# run, default 10); PYTHON (default /usr/bin/python3); TORCH_MODES; TORCH_ATTN (sdpa or manual).
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,26{s/^# \{0,1\}//;p}' "$0"
  exit 0
fi

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

# What this torch supports: the first line its modes, the second its version.
supported="$("$py" "$torch_bench" modes)" || { echo "compare_torch: $py cannot import torch" >&2; exit 2; }
torch_version="$(sed -n 2p <<<"$supported")"
supported="$(sed -n 1p <<<"$supported")"
read -r -a modes <<<"${TORCH_MODES:-$supported}"
((${#modes[@]})) || { echo "compare_torch: TORCH_MODES is empty" >&2; exit 2; }
for m in "${modes[@]}"; do
  [[ " $supported " == *" $m "* ]] ||
    { echo "compare_torch: torch $torch_version ($py) cannot run mode '$m' (it supports: $supported)" >&2; exit 2; }
done
attn_args=()
[[ -n "${TORCH_ATTN:-}" ]] && attn_args=(--attn "$TORCH_ATTN")

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
echo "shape: V=$V L=$L H=$H C=$C T=$T B=$B block_size=$BS, $threads threads, $steps timed steps," \
  "$pairs rounds; torch $torch_version ($py), modes: ${modes[*]}" >&2

export OMP_WAIT_POLICY=PASSIVE
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for ((i = 1; i <= pairs; i++)); do
  "$qkv" bench --what gemm --config "$config" --threads "$threads" --json \
    >"$tmp/gemm.$i" 2>"$tmp/gemm.$i.err" || { cat "$tmp/gemm.$i.err" >&2; exit 1; }
  for m in "${modes[@]}"; do
    qkv_dtype=()
    [[ $m == bf16 ]] && qkv_dtype=(--set 'train.dtype="bf16"')
    "$qkv" bench --what step --config "$config" --threads "$threads" --steps "$steps" "${qkv_dtype[@]}" --json \
      >"$tmp/qkv.$m.$i" 2>"$tmp/qkv.$m.$i.err" || { cat "$tmp/qkv.$m.$i.err" >&2; exit 1; }
    "$py" "$torch_bench" step --layers "$L" --heads "$H" --embd "$C" --seq "$T" --batch "$B" --vocab "$V" \
      --block-size "$BS" --threads "$threads" --steps "$steps" --mode "$m" "${attn_args[@]}" --json \
      >"$tmp/torch.$m.$i" 2>"$tmp/torch.$m.$i.err" || { cat "$tmp/torch.$m.$i.err" >&2; exit 1; }
    echo "round $i: qkv and torch $m done ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
  done
done

"$py" - "$tmp" "$pairs" "$config" "$torch_version" "${modes[@]}" <<'PY'
import json, statistics, sys
tmp, pairs, config, version, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
def last_json(path):
    lines = [l for l in open(path).read().splitlines() if l.strip()]
    return json.loads(lines[-1])
nan = float("nan")
med = lambda xs: statistics.median(xs) if xs else nan

# The machine and the kernels, as qkv reports them (fields a build lacks are left out).
env = last_json(f"{tmp}/gemm.1").get("environment", {})
cpu = env.get("cpu", {})
if cpu:
    feats = cpu.get("features", [])
    feats = " ".join(feats) if isinstance(feats, list) else str(feats)
    print(f"CPU: {cpu.get('brand', '?')} (family {cpu.get('family', '?')}, model {cpu.get('model', '?')})"
          + (f"; features: {feats}" if feats else ""))
kernels = [f"{k} {env[k]}" for k in ("gemm_kernel", "blas_kernel") if env.get(k)]
if kernels:
    print("qkv kernels: " + ", ".join(kernels) + (f" ({env['gemm_kernel_reason']})" if env.get("gemm_kernel_reason") else ""))

# qkv's GEMMs on the step's shapes: its kernel and the BLAS's sgemm, GFLOP/s over the rounds.
agg = []
for i in range(1, pairs + 1):
    rows = [r for r in last_json(f"{tmp}/gemm.{i}")["results"] if r.get("name") == "step-weighted"]
    if rows:
        agg.append(rows[0])
if agg:
    gf = [r["gflops"] for r in agg]
    line = f"qkv bench --what gemm, step-weighted: {med(gf):.1f} GFLOP/s ({min(gf):.1f}-{max(gf):.1f})"
    if agg[0].get("kernel"):
        line += f" on kernel {agg[0]['kernel']}"
    blas = [r["blas_gflops"] for r in agg if r.get("blas_gflops")]
    if blas:
        line += f"; the BLAS's sgemm {med(blas):.1f} GFLOP/s ({min(blas):.1f}-{max(blas):.1f})"
    print(line)

print(f"{config}: torch {version}, {pairs} rounds, medians (range over rounds); speed-up = torch ms / qkv ms, "
      "cpu ratio = torch CPU ms / qkv CPU ms: above 1, qkv is faster")
cols = ["mode", "attn", "qkv ms", "torch ms", "speed-up", "range", "qkv cpu ms", "torch cpu ms", "cpu ratio",
        "range", "qkv GF/s", "torch GF/s", "qkv RSS MB", "torch RSS MB"]
print("  ".join(f"{c:>12}" if j > 1 else f"{c:<8}" for j, c in enumerate(cols)))
for m in modes:
    rs = []
    for i in range(1, pairs + 1):
        q = last_json(f"{tmp}/qkv.{m}.{i}")["results"][0]
        t = last_json(f"{tmp}/torch.{m}.{i}")
        rs.append(dict(q_ms=q["ms_per_step"], t_ms=t["ms_per_step"], q_cpu=q.get("cpu_ms_per_step", nan),
                       t_cpu=t["cpu_ms_per_step"], q_gf=q["gflops"], t_gf=t["gflops"],
                       q_rss=q["peak_rss_bytes"] / 2**20, t_rss=t["peak_rss_bytes"] / 2**20, attn=t.get("attn", "manual"),
                       compile_s=t.get("compile_s")))
        r = rs[-1]
        r["speed"], r["cpu_ratio"] = r["t_ms"] / r["q_ms"], r["t_cpu"] / r["q_cpu"]
        extra = f", compile {r['compile_s']:.1f} s" if r["compile_s"] is not None else ""
        print(f"  round {i} {m}: qkv {r['q_ms']:.1f} ms ({r['q_cpu']:.1f} CPU), torch {r['t_ms']:.1f} ms "
              f"({r['t_cpu']:.1f} CPU){extra}: {r['speed']:.2f}x, cpu {r['cpu_ratio']:.2f}", file=sys.stderr)
    g = lambda k: med([r[k] for r in rs])
    rng = lambda k: f"{min(r[k] for r in rs):.2f}-{max(r[k] for r in rs):.2f}"
    cells = [m, rs[0]["attn"], f"{g('q_ms'):.1f}", f"{g('t_ms'):.1f}", f"{g('speed'):.2f}x", rng("speed"),
             f"{g('q_cpu'):.1f}", f"{g('t_cpu'):.1f}", f"{g('cpu_ratio'):.2f}x", rng("cpu_ratio"),
             f"{g('q_gf'):.1f}", f"{g('t_gf'):.1f}", f"{g('q_rss'):.0f}", f"{g('t_rss'):.0f}"]
    print("  ".join(f"{c:>12}" if j > 1 else f"{c:<8}" for j, c in enumerate(cells)))
PY
