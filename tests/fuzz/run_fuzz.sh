#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer and UndefinedBehaviorSanitizer) and runs
# each for SECONDS (default 60) from a seed corpus:
#   fuzz_safetensors_header  the safetensors header parser (data/safetensors.h), whole files;
#   fuzz_cli_numbers         the command line's number parser (app/options.h) against an
#                            independent reading.
# Prints one line per target "NAME: N executions, C crashes"; exit status 1 when a crash was found
# (the reproducer is left in the work directory), 2 when clang is missing.
# Usage: tests/fuzz/run_fuzz.sh [SECONDS]   (WORK=dir to keep the builds and corpora elsewhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
work=${WORK:-build/fuzz}
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }

# build NAME SOURCE...: compiles $work/NAME/NAME from the sources when one is newer than it.
build() {
  local name=$1 bin="$work/$1/$1" stale=0
  shift
  mkdir -p "$work/$name/corpus" "$work/$name/crashes"
  [[ -x $bin ]] || stale=1
  for s in "$@"; do [[ $s -nt $bin ]] && stale=1; done
  if [[ $stale == 1 ]]; then
    local cpp=()
    for s in "$@"; do [[ $s == *.cpp ]] && cpp+=("$s"); done
    clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
      "${cpp[@]}" -o "$bin"
  fi
}

# run NAME MAX_LEN: runs the target for $seconds over its corpus and prints its line.
failed=0
run() {
  local name=$1 dir="$work/$1" log="$work/$1/fuzz.log" status
  set +e
  "$dir/$name" -max_total_time="$seconds" -max_len="$2" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$dir/crashes/" "$dir/corpus" > "$log" 2>&1
  status=$?
  set -e
  local execs crashes
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  [[ -z $execs ]] && execs=$(grep -oE '#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(find "$dir/crashes" -type f | wc -l)
  echo "$name: ${execs:-0} executions, $crashes crashes (${seconds} s; log $log)"
  if [[ $status -ne 0 || $crashes -ne 0 ]]; then
    tail -30 "$log" >&2
    failed=1
  fi
}

# --- the safetensors header parser ---
build fuzz_safetensors_header tests/fuzz/fuzz_safetensors_header.cpp data/safetensors.cpp data/safetensors.h \
  data/input_file.cpp data/input_file.h tensor/error.h
# Seeds: a valid file, and the hand-corrupted headers of tests/data/test_safetensors.cpp's kind.
seed() {  # seed NAME HEADER [BUFFER_BYTES]
  local header=$2 n=${#2} buf=${3:-0} file="$work/fuzz_safetensors_header/corpus/$1"
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $(((n >> 8) & 255)) \
    $(((n >> 16) & 255)) $(((n >> 24) & 255)))" > "$file"
  printf '%s' "$header" >> "$file"
  head -c "$buf" /dev/zero >> "$file"
}
seed valid '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[8,12]}}' 12
seed overlap '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
seed gap '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}' 12
seed dup '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}' 12
seed big '{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}' 8
seed empty '{"e":{"dtype":"I64","shape":[0,5],"data_offsets":[0,0]}}' 0
run fuzz_safetensors_header 4096

# --- the command line's number parser ---
build fuzz_cli_numbers tests/fuzz/fuzz_cli_numbers.cpp app/options.cpp app/options.h tensor/value_range.cpp \
  tensor/value_range.h tensor/error.h
# Seeds: two range bytes, then the text of an argument.
i=0
for text in 0 +7 -5 100 9223372036854775807 18446744073709551621 '' ' 1' 1e3 0.25 nan inf -inf 1e999 0x10 \
  12abc 1e-300; do
  printf '\x03\x05%s' "$text" > "$work/fuzz_cli_numbers/corpus/seed$i"
  i=$((i + 1))
done
run fuzz_cli_numbers 64

exit $failed
