#!/usr/bin/env bash
# Sparse attention patterns against full causal attention, side by side: for each N, one
# `qkv bench --what attention --pattern full` then one `--pattern P` per pattern given, so every
# ratio compares two runs taken seconds apart (the 2-core machine is shared and its load drifts).
#
#   bench/attention_pattern_pairs.sh "N..." "PATTERN[:extra bench flags]..."
#   e.g. bench/attention_pattern_pairs.sh "1024 4096" "strided" "window:--pattern-local 256"
#
# Prints CSV rows pattern,n,seconds,kept_pairs,visited_tiles,ns_per_kept_pair,ratio where ratio is
# the pattern's time per kept pair over full's at the same N in the same pass (full's own row: 1).
# Fused CPU kernel, B 1, H 8, Hkv 8, D 64, float32, THREADS threads (default 2). Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; SKIP_FULL_ABOVE=N drops full above N.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$repo/$build"
qkv="$build/qkv"
[[ -x "$qkv" ]] || { echo "attention_pattern_pairs: $qkv not found (build it, or set BUILD_DIR)" >&2; exit 2; }
[[ $# -ge 2 ]] || { echo "usage: $0 \"N...\" \"PATTERN[:flags]\"..." >&2; exit 2; }
ns=($1)
shift
threads="${THREADS:-2}"
export OMP_WAIT_POLICY=PASSIVE
row() {  # pattern-name n extra-flags... -> "describe,n,seconds,kept,visited,ns_per_pair"
  local name="$1" n="$2"
  shift 2
  "$qkv" bench --what attention --pattern "$name" --kernel fused --hkv 8 --threads "$threads" --n "$n" "$@" --json |
    tail -n 1 | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["results"][0]
print("%s,%d,%.3f,%d,%d,%.2f" % (r["pattern"], r["n"], r["ms"] / 1000, r["kept_pairs"], r["visited_tiles"],
                                 r["ns_per_kept_pair"]))'
}
echo "pattern,n,seconds,kept_pairs,visited_tiles,ns_per_kept_pair,ratio"
for n in "${ns[@]}"; do
  full_ns=""
  if [[ -z "${SKIP_FULL_ABOVE:-}" || "$n" -le "${SKIP_FULL_ABOVE}" ]]; then
    f="$(row full "$n")"
    full_ns="${f##*,}"
    echo "$f,1.00"
  fi
  for spec in "$@"; do
    name="${spec%%:*}"
    flags=""
    [[ "$spec" == *:* ]] && flags="${spec#*:}"
    # shellcheck disable=SC2086
    p="$(row "$name" "$n" $flags)"
    if [[ -n "$full_ns" ]]; then
      echo "$p,$(/usr/bin/python3 -c "print(f'{${p##*,} / $full_ns:.2f}')")"
    else
      echo "$p,"
    fi
  done
done
