#!/usr/bin/env bash
# Growth of attention's time over N, one machine state: for each pattern, one
# `qkv bench --what attention --pattern P --interleave-n`, which times every N round-robin in the
# same process (each round a warm-up and a timed step per N; the median over rounds). Run one N
# after another instead and the 2-core machine's load, drifting by tens of percent within
# seconds, moves the slope over 1K-16K by ±0.05 or more from one pass to the next.
#
#   bench/attention_pattern_slopes.sh "N..." "PATTERN[:extra bench flags]..."
#   e.g. bench/attention_pattern_slopes.sh "1024 2048 4096 8192 16384" strided "window:--pattern-local 256"
#
# Prints CSV rows pattern,n,seconds,kept_pairs,ns_per_kept_pair, then per pattern one row
# "slope,<pattern>,<least-squares slope of log seconds over log N>,<the same for kept pairs>".
# Where a pattern's kept pairs per query row vary over the N by 1.5x or more (strided: l + N/2s,
# from 47 at 1K to 191 at 16K), also "rowcost,<pattern>,<a>,<c>,<share at first N>,<share at
# last N>": the least-squares fit of the time per query row (the bench's B 1 x H 8 x N rows) as
# a * kept pairs per row + c, so a is the ns a kept pair costs at any N and c the ns per row that
# does not shrink as rows keep more pairs (the walk's per-row and per-tile work, and the rows'
# memory traffic); the shares are c's part of the time. With c > 0 the time grows more slowly
# than the kept pairs (docs/perf.md, "Strided's slope and the cost per row").
# Fused CPU kernel, B 1, H 8, Hkv 8, D 64, float32, THREADS threads (default 2). Builds nothing.
# Environment: BUILD_DIR (default build) locates qkv; ROUNDS (default: the bench's, about 20 s).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-build}"
[[ "$build" = /* ]] || build="$repo/$build"
qkv="$build/qkv"
[[ -x "$qkv" ]] || { echo "attention_pattern_slopes: $qkv not found (build it, or set BUILD_DIR)" >&2; exit 2; }
[[ $# -ge 2 ]] || { echo "usage: $0 \"N...\" \"PATTERN[:flags]\"..." >&2; exit 2; }
read -r -a ns <<<"$1"
shift
threads="${THREADS:-2}"
rounds=()
[[ -n "${ROUNDS:-}" ]] && rounds=(--rounds "$ROUNDS")
export OMP_WAIT_POLICY=PASSIVE
echo "pattern,n,seconds,kept_pairs,ns_per_kept_pair"
for spec in "$@"; do
  name="${spec%%:*}"
  flags=""
  [[ "$spec" == *:* ]] && flags="${spec#*:}"
  # shellcheck disable=SC2086
  "$qkv" bench --what attention --pattern "$name" --kernel fused --hkv 8 --threads "$threads" --n "${ns[@]}" $flags \
    --interleave-n "${rounds[@]}" --json | tail -n 1 | /usr/bin/python3 -c '
import json, math, sys
rows = json.load(sys.stdin)["results"]
for r in rows:
    print("%s,%d,%.4f,%d,%.2f" % (r["pattern"], r["n"], r["ms"] / 1000, r["kept_pairs"], r["ns_per_kept_pair"]))
def slope(ys):
    xs = [math.log(r["n"]) for r in rows]
    ys = [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
if len(rows) > 1:
    print("slope,%s,%.3f,%.3f" % (rows[0]["pattern"], slope([r["ms"] for r in rows]),
                                 slope([r["kept_pairs"] for r in rows])))
query_rows = [1 * 8 * r["n"] for r in rows]  # B 1, H 8: the bench defaults
per_row = [(r["kept_pairs"] / q, r["ms"] * 1e6 / q) for r, q in zip(rows, query_rows)]
xs = [x for x, _ in per_row]
if len(rows) > 2 and max(xs) >= 1.5 * min(xs):
    mx, my = sum(xs) / len(xs), sum(y for _, y in per_row) / len(xs)
    a = sum((x - mx) * (y - my) for x, y in per_row) / sum((x - mx) ** 2 for x in xs)
    c = my - a * mx
    print("rowcost,%s,%.2f,%.0f,%.2f,%.2f" % (rows[0]["pattern"], a, c, c / per_row[0][1], c / per_row[-1][1]))'
done
