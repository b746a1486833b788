#!/usr/bin/env bash
# Sparse attention patterns against full causal attention, side by side: for each N and pattern,
# one `qkv bench --what attention --pattern P --versus-full`, which times full causal attention in
# the same process on the same tensors, alternating with the pattern round by round (the 2-core
# machine is shared and its load drifts by tens of percent within seconds: two runs seconds apart
# compare two different machines).
#
#   bench/attention_pattern_pairs.sh "N..." "PATTERN[:extra bench flags]..."
#   e.g. bench/attention_pattern_pairs.sh "1024 4096" "strided" "window:--pattern-local 256"
#
# Prints CSV rows pattern,n,seconds,kept_pairs,visited_tiles,ns_per_kept_pair,ratio: one row per
# pattern, where ratio is the median over the alternated rounds of the pattern's time per kept pair
# over full's, then one row "full (vs P)" with full's own figures from the same run (ratio 1).
# Fused CPU kernel, B 1, H 8, Hkv 8, D 64, float32, THREADS threads (default 2). Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; SKIP_FULL_ABOVE=N times the patterns alone
# above N (full attention at 16K takes ~10 s a step here); ROUNDS (default: the bench's, about 10 s
# of full steps) sets the alternated rounds.
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
echo "pattern,n,seconds,kept_pairs,visited_tiles,ns_per_kept_pair,ratio"
for n in "${ns[@]}"; do
  versus=(--versus-full)
  [[ -n "${ROUNDS:-}" ]] && versus+=(--rounds "$ROUNDS")
  [[ -n "${SKIP_FULL_ABOVE:-}" && "$n" -gt "${SKIP_FULL_ABOVE}" ]] && versus=()
  for spec in "$@"; do
    name="${spec%%:*}"
    flags=""
    [[ "$spec" == *:* ]] && flags="${spec#*:}"
    # shellcheck disable=SC2086
    "$qkv" bench --what attention --pattern "$name" --kernel fused --hkv 8 --threads "$threads" --n "$n" $flags \
      "${versus[@]}" --json | tail -n 1 | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["results"][0]
row = "%s,%d,%.3f,%d,%d,%.2f" % (r["pattern"], r["n"], r["ms"] / 1000, r["kept_pairs"], r["visited_tiles"],
                                 r["ns_per_kept_pair"])
if r.get("rounds", 0) > 0:
    print("%s,%.2f" % (row, r["ratio_vs_full"]))
    full_kept = r["full_ms"] * 1e6 / r["full_ns_per_kept_pair"]
    print("full (vs %s),%d,%.3f,%d,,%.2f,1.00" % (r["pattern"].split(" ")[0], r["n"], r["full_ms"] / 1000,
                                                 round(full_kept), r["full_ns_per_kept_pair"]))
else:
    print(row + ",")'
  done
done
