#!/usr/bin/env bash
# Attention alone, qkv vs PyTorch: causal forward + backward, B=1, H=8, D=64, float32.
#
#   bench/compare_attention.sh [N...]          default N = 256 1024 4096, Hkv 8 and 2
#
# Runs `qkv bench --what attention --json` (reference and fused kernels) and
# bench/torch_reference.py attention --n N --hkv HKV (PyTorch's manual matmul/mask/softmax/matmul),
# both with OMP_WAIT_POLICY=PASSIVE on THREADS threads (default 2), then prints per (N, Hkv): the
# times, the fused kernel's speed-up over PyTorch and each one's extra memory (qkv: allocator
# peak above what was in use; PyTorch: peak RSS growth). Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; PYTHON (default /usr/bin/python3).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$repo/$build"
threads="${THREADS:-2}"
py="${PYTHON:-/usr/bin/python3}"
qkv="$build/qkv"
torch_bench="$repo/bench/torch_reference.py"
ns=("$@")
[[ ${#ns[@]} -gt 0 ]] || ns=(256 1024 4096)

[[ -x "$qkv" ]] || { echo "compare_attention: $qkv not found (build it, or set BUILD_DIR)" >&2; exit 2; }
[[ -f "$torch_bench" ]] || { echo "compare_attention: $torch_bench not found" >&2; exit 2; }

export OMP_WAIT_POLICY=PASSIVE
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

nargs=()
for n in "${ns[@]}"; do nargs+=(--n "$n"); done
"$qkv" bench --what attention --threads "$threads" "${nargs[@]}" --json >"$tmp/qkv" 2>"$tmp/qkv.err" \
  || { cat "$tmp/qkv.err" >&2; exit 1; }
for n in "${ns[@]}"; do
  for hkv in 8 2; do
    "$py" "$torch_bench" attention --n "$n" --hkv "$hkv" --threads "$threads" --json >"$tmp/torch.$n.$hkv" 2>&1 \
      || { cat "$tmp/torch.$n.$hkv" >&2; exit 1; }
    echo "torch N=$n hkv=$hkv done ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
  done
done

"$py" - "$tmp" "${ns[@]}" <<'PY'
import json, sys
tmp, ns = sys.argv[1], [int(n) for n in sys.argv[2:]]
def last_json(path):
    return json.loads([l for l in open(path).read().splitlines() if l.strip()][-1])
qkv = {(r["kernel"], r["n"], r["hkv"]): r for r in last_json(f"{tmp}/qkv")["results"]}
print(f"{'N':>6}{'Hkv':>5}{'torch ms':>10}{'ref ms':>9}{'fused ms':>10}{'speed-up':>12}"
      f"{'torch MB':>10}{'ref MB':>9}{'fused MB':>10}")
for n in ns:
    for hkv in (8, 2):
        t = last_json(f"{tmp}/torch.{n}.{hkv}")
        f = qkv.get(("fused", n, hkv))
        r = qkv.get(("reference", n, hkv))
        mb = lambda b: b / 2**20
        print(f"{n:6d}{hkv:5d}{t['ms']:10.1f}{(r['ms'] if r else float('nan')):9.1f}{f['ms']:10.1f}"
              f"{t['ms'] / f['ms']:11.1f}x{mb(t['peak_bytes']):10.0f}"
              f"{(mb(r['peak_bytes']) if r else float('nan')):9.1f}{mb(f['peak_bytes']):10.1f}")
PY
