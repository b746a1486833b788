#!/usr/bin/env bash
# Attention alone, qkv vs PyTorch: causal forward + backward, B=1, H=8, D=64, float32.
#
#   bench/compare_attention.sh [N...]          default N = 256 1024 4096, Hkv 8 and 2
#   PYTHON=~/venv-torch2/bin/python bench/compare_attention.sh 1024 4096      # today's PyTorch
#
# For each N in turn, runs `qkv bench --what attention --n N --json` (reference and fused kernels,
# Hkv 8 and 2), then bench/torch_reference.py attention --n N --hkv HKV in each torch attention form
# (TORCH_ATTN, default sdpa where torch has it — F.scaled_dot_product_attention(is_causal=True),
# PyTorch's CPU flash kernel — else manual matmul/mask/softmax/matmul; TORCH_ATTN="sdpa manual"
# runs both), all with OMP_WAIT_POLICY=PASSIVE on THREADS threads (default 2). Then prints per
# (N, Hkv, torch form): the times (and PyTorch's CPU time, user + system of all threads), the
# fused kernel's speed-up over PyTorch (torch ms / fused ms: above 1, qkv is faster) and each
# one's extra memory (qkv: allocator peak above what was in use; PyTorch: peak RSS growth).
# bench/torch2_venv.sh makes a virtual environment with the current PyTorch. Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; PYTHON (default /usr/bin/python3); THREADS;
# TORCH_ATTN.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,17{s/^# \{0,1\}//;p}' "$0"
  exit 0
fi

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

# What this torch offers: line 2 its version, line 3 its attention forms (the default first).
info="$("$py" "$torch_bench" modes)" || { echo "compare_attention: $py cannot import torch" >&2; exit 2; }
torch_version="$(sed -n 2p <<<"$info")"
available="$(sed -n 3p <<<"$info")"
read -r -a forms <<<"${TORCH_ATTN:-${available%% *}}"
for f in "${forms[@]}"; do
  [[ " $available " == *" $f "* ]] ||
    { echo "compare_attention: torch $torch_version ($py) has no attention form '$f' (it has: $available)" >&2; exit 2; }
done
echo "torch $torch_version ($py), attention: ${forms[*]}; $threads threads" >&2

export OMP_WAIT_POLICY=PASSIVE
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for n in "${ns[@]}"; do
  "$qkv" bench --what attention --threads "$threads" --n "$n" --json >"$tmp/qkv.$n" 2>"$tmp/qkv.$n.err" \
    || { cat "$tmp/qkv.$n.err" >&2; exit 1; }
  echo "qkv N=$n done ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
  for hkv in 8 2; do
    for f in "${forms[@]}"; do
      "$py" "$torch_bench" attention --n "$n" --hkv "$hkv" --attn "$f" --threads "$threads" --json \
        >"$tmp/torch.$n.$hkv.$f" 2>&1 || { cat "$tmp/torch.$n.$hkv.$f" >&2; exit 1; }
      echo "torch $f N=$n hkv=$hkv done ($(cut -d' ' -f1-3 /proc/loadavg) load)" >&2
    done
  done
done

"$py" - "$tmp" "$torch_version" "${forms[*]}" "${ns[@]}" <<'PY'
import json, sys
tmp, version, forms, ns = sys.argv[1], sys.argv[2], sys.argv[3].split(), [int(n) for n in sys.argv[4:]]
def last_json(path):
    return json.loads([l for l in open(path).read().splitlines() if l.strip()][-1])
nan = float("nan")
mb = lambda b: b / 2**20
cpu = last_json(f"{tmp}/qkv.{ns[0]}").get("environment", {}).get("cpu", {})
if cpu:
    print(f"CPU: {cpu.get('brand', '?')} (family {cpu.get('family', '?')}, model {cpu.get('model', '?')}); "
          f"features: {' '.join(cpu.get('features', []))}")
print(f"torch {version}; speed-up = torch ms / qkv fused ms (above 1, qkv is faster)")
print(f"{'N':>6}{'Hkv':>5}{'torch':>8}{'torch ms':>10}{'torch cpu':>11}{'ref ms':>9}{'fused ms':>10}{'speed-up':>10}"
      f"{'torch MB':>10}{'ref MB':>9}{'fused MB':>10}")
for n in ns:
    qkv = {(r["kernel"], r["hkv"]): r for r in last_json(f"{tmp}/qkv.{n}")["results"] if r.get("n") == n}
    for hkv in (8, 2):
        f, r = qkv.get(("fused", hkv)), qkv.get(("reference", hkv))
        for form in forms:
            t = last_json(f"{tmp}/torch.{n}.{hkv}.{form}")
            print(f"{n:6d}{hkv:5d}{form:>8}{t['ms']:10.1f}{t.get('cpu_ms', nan):11.1f}{(r['ms'] if r else nan):9.1f}"
                  f"{(f['ms'] if f else nan):10.1f}{(t['ms'] / f['ms'] if f else nan):9.2f}x"
                  f"{mb(t['peak_bytes']):10.0f}{(mb(r['peak_bytes']) if r else nan):9.1f}"
                  f"{(mb(f['peak_bytes']) if f else nan):10.1f}")
PY
