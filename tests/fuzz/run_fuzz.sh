#!/usr/bin/env bash
# Builds the libFuzzer target for the safetensors header parser with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer) and runs it for SECONDS (default 60) from a seed corpus of valid and
# corrupted files. Prints one line "fuzz_safetensors_header: N executions, C crashes"; exit status 1
# when a crash was found (the reproducer is left in the work directory), 2 when clang is missing.
# Usage: tests/fuzz/run_fuzz.sh [SECONDS]   (WORK=dir to keep the build and corpus elsewhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
work=${WORK:-build/fuzz}
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }
mkdir -p "$work/corpus" "$work/crashes"
bin="$work/fuzz_safetensors_header"
sources=(tests/fuzz/fuzz_safetensors_header.cpp data/safetensors.cpp data/safetensors.h tensor/error.h)
stale=0
[[ -x $bin ]] || stale=1
for s in "${sources[@]}"; do [[ $s -nt $bin ]] && stale=1; done
if [[ $stale == 1 ]]; then
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
    tests/fuzz/fuzz_safetensors_header.cpp data/safetensors.cpp -o "$bin"
fi

# Seeds: a valid file, and the hand-corrupted headers of tests/test_safetensors.cpp's kind.
seed() {  # seed NAME HEADER [BUFFER_BYTES]
  local header=$2 n=${#2} buf=${3:-0}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $(((n >> 8) & 255)) \
    $(((n >> 16) & 255)) $(((n >> 24) & 255)))" > "$work/corpus/$1"
  printf '%s' "$header" >> "$work/corpus/$1"
  head -c "$buf" /dev/zero >> "$work/corpus/$1"
}
seed valid '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[8,12]}}' 12
seed overlap '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
seed gap '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}' 12
seed dup '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}' 12
seed big '{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}' 8
seed empty '{"e":{"dtype":"I64","shape":[0,5],"data_offsets":[0,0]}}' 0

log="$work/fuzz.log"
set +e
"$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/crashes/" "$work/corpus" > "$log" 2>&1
status=$?
set -e
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
[[ -z $execs ]] && execs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
crashes=$(find "$work/crashes" -type f | wc -l)
echo "fuzz_safetensors_header: ${execs:-0} executions, $crashes crashes (${seconds} s; log $log)"
if [[ $status -ne 0 || $crashes -ne 0 ]]; then
  tail -30 "$log" >&2
  exit 1
fi
