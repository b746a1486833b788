#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer and UndefinedBehaviorSanitizer, linked
# with lld) and runs each for SECONDS (default 60) from a seed corpus:
#   fuzz_safetensors_header  the safetensors header parser (data/safetensors.h), whole files;
#   fuzz_cli_numbers         the command line's number parser (app/options.h) against an
#                            independent reading;
#   fuzz_config              the run configuration's parser (train/config.h): TOML text and --set
#                            assignments; accepted configs must round-trip through to_toml;
#   fuzz_tokenizer_files     a Hugging Face directory's tokenizer files (read_hf_tokenizer):
#                            tokenizer.json, vocab.json + merges.txt, qkv_tokenizer.json;
#   fuzz_checkpoint          the checkpoint and prepared-dataset readers on valid HDF5 files that
#                            the input's edits make from real ones through the HDF5 C API (raw
#                            HDF5 bytes are libhdf5's concern, not fuzzed); it links the CMake
#                            build's libqkv_core.a (BUILD_DIR, default build/) and is skipped
#                            without it.
# Every input must end in success or qkv::Error. Prints one line per target "NAME: N executions,
# C crashes"; exit status 1 when a crash was found (the reproducer is left in the work directory),
# 2 when clang++ is missing. Without ld.lld the targets that need it (all but the first two) are
# skipped, each saying so.
# Usage: tests/fuzz/run_fuzz.sh [SECONDS [TARGET...]]   (only the TARGETs named, when any; WORK=dir
# keeps the builds and corpora elsewhere; JOBS=n compiles n files at a time, default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
only=("${@:2}")
work=${WORK:-build/fuzz}
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 2; }

# clang 14 has no _Float16 on x86-64 (tensor/dtype.h's half conversions): there __fp16, its
# storage-only half type, stands in, converting through compiler-rt's builtins with the same
# round-to-nearest-even.
half=() half_link=()
if (($(clang++ -dumpversion | cut -d. -f1) < 15)); then half=(-D_Float16=__fp16) half_link=(-rtlib=compiler-rt); fi
jobs=${JOBS:-2}
# wanted NAME: whether the command line names NAME, or names no target.
wanted() { [[ ${#only[@]} == 0 || " ${only[*]} " == *" $1 "* ]]; }
# with_lld NAME: whether ld.lld is there for NAME's link (below); says NAME is skipped otherwise.
linker=()
command -v ld.lld >/dev/null && linker=(-fuse-ld=lld)
with_lld() {
  [[ ${#linker[@]} != 0 ]] && return 0
  echo "$1: skipped (ld.lld not found: apt-get install lld)"
  return 1
}

# build NAME FILE... [-- LINK_ARG...]: compiles $work/NAME/NAME from the .cpp files when one of
# the files is newer than it, each .cpp on its own ($jobs at a time) with its functions in
# sections of their own, and links with lld's --gc-sections: a parser's file may define functions
# (a model's constructor) that the target never reaches, whose own dependencies then need not
# link. (GNU ld keeps such functions alive through the sanitizers' metadata; lld drops them.)
build() {
  local name=$1 bin="$work/$1/$1" stale=0 files=() link=()
  shift
  while (($#)) && [[ $1 != -- ]]; do files+=("$1"); shift; done
  (($#)) && shift && link=("$@")
  mkdir -p "$work/$name/corpus" "$work/$name/crashes" "$work/$name/obj"
  [[ -x $bin ]] || stale=1
  for s in "${files[@]}"; do [[ $s -nt $bin ]] && stale=1; done
  [[ $stale == 1 ]] || return 0
  local objs=() pids=() s o p
  for s in "${files[@]}"; do
    [[ $s == *.cpp ]] || continue
    o="$work/$name/obj/$(tr / _ <<< "${s%.cpp}").o"
    objs+=("$o")
    clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -fno-sanitize=vptr -fsanitize-address-globals-dead-stripping \
      -ffunction-sections -fdata-sections "${half[@]}" -I. "${cflags[@]}" -c "$s" -o "$o" &
    pids+=($!)
    if ((${#pids[@]} >= jobs)); then
      wait "${pids[0]}"
      pids=("${pids[@]:1}")
    fi
  done
  for p in "${pids[@]}"; do wait "$p"; done
  clang++ -fsanitize=fuzzer,address,undefined "${linker[@]}" -Wl,--gc-sections "${half_link[@]}" "${objs[@]}" "${link[@]}" -o "$bin"
}
cflags=()

# run NAME MAX_LEN [DICT]: runs the target for $seconds over its corpus (with libFuzzer's
# dictionary DICT: tokens its mutations insert) and prints its line.
failed=0
run() {
  local name=$1 dir="$work/$1" log="$work/$1/fuzz.log" status
  set +e
  local dict=()
  [[ -n ${3:-} ]] && dict=(-dict="$3")
  "$dir/$name" -max_total_time="$seconds" -max_len="$2" -timeout=10 -rss_limit_mb=2048 "${dict[@]}" \
    -artifact_prefix="$dir/crashes/" "$dir/corpus" > "$log" 2>&1
  status=$?
  set -e
  local execs crashes
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  # libFuzzer's closing "Done N runs in S second(s)"; else its last status line "#N ...". (Not any
  # "#N": the recommended dictionary it prints at the end holds arbitrary bytes.)
  [[ -z $execs ]] && execs=$(grep -oE '^Done [0-9]+ runs' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  [[ -z $execs ]] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  crashes=$(find "$dir/crashes" -type f | wc -l)
  echo "$name: ${execs:-0} executions, $crashes crashes (${seconds} s; log $log)"
  if [[ $status -ne 0 || $crashes -ne 0 ]]; then
    tail -30 "$log" >&2
    failed=1
  fi
}

# --- the safetensors header parser ---
if wanted fuzz_safetensors_header; then
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
fi

# --- the command line's number parser ---
if wanted fuzz_cli_numbers; then
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
fi

# --- the run configuration's parser ---
if wanted fuzz_config && with_lld fuzz_config; then
# config.cpp validates through the model's rules (nn/transformer.cpp) and a block_sparse layout's
# reader (attention/pattern/pattern.cpp); of those files only the functions it reaches are linked.
# TOML is read by the installed toml++ library, as qkv links it (its parser is not ours to fuzz:
# a header-only build would also turn on its debug assertions, which its release build answers
# with a syntax error).
read -ra cflags <<< "$(pkg-config --cflags tomlplusplus)"
build fuzz_config tests/fuzz/fuzz_config.cpp train/config.cpp train/config.h train/config_schema.h \
  train/model_factory.cpp nn/transformer.cpp attention/pattern/pattern.cpp tensor/value_range.cpp \
  data/input_file.cpp tensor/error.h -- $(pkg-config --libs tomlplusplus)
cflags=()
# Seeds: the shipped configs, and one with overrides after its 0x00 bytes.
cp configs/*.toml configs/bench/*.toml "$work/fuzz_config/corpus/"
printf '[model]\nfamily = "llama"\n\0model.n_head=2\0train.lr=3e-4\0data.tokenizer="bpe"' \
  > "$work/fuzz_config/corpus/overrides"
run fuzz_config 4096
fi

# --- the tokenizer files of a Hugging Face directory ---
if wanted fuzz_tokenizer_files && with_lld fuzz_tokenizer_files; then
read -ra cflags <<< "$(pkg-config --cflags hdf5)"  # tokenizer.cpp's HDF5 reader is linked out
build fuzz_tokenizer_files tests/fuzz/fuzz_tokenizer_files.cpp train/hf_import.cpp train/hf_common.cpp \
  train/hf_common.h train/hf_interop.h \
  data/byte_level_bpe.cpp data/byte_level_bpe.h data/tokenizer.cpp data/tokenizer.h data/bpe.cpp \
  data/input_file.cpp data/input_file.h tensor/error.h
cflags=()
# Seeds: a selector byte (0 tokenizer.json, 1 vocab.json 0x00 merges.txt, 2 qkv_tokenizer.json),
# then the file: GPT-2's format from tests/reference, and qkv's mapping of each stored kind.
corpus=$work/fuzz_tokenizer_files/corpus
{ printf '\x00'; cat tests/reference/gpt2_bpe/tokenizer.json; } > "$corpus/tokenizer_json"
{ printf '\x01'; cat tests/reference/gpt2_bpe/vocab.json; printf '\x00'; cat tests/reference/gpt2_bpe/merges.txt; } \
  > "$corpus/vocab_merges"
i=0
for qkv in '{"kind":"byte","version":1}' '{"kind":"char","version":1,"vocab":["\n"," ","a","b",200]}' \
  '{"kind":"bpe","version":1,"pre_split":"qkv-words-64","merges":[[97,98],[256,99]]}'; do
  printf '\x02{"format":"qkv-tokenizer-mapping","kind":"x","qkv":%s}' "$qkv" > "$corpus/qkv$i"
  i=$((i + 1))
done
run fuzz_tokenizer_files 65536 tests/fuzz/tokenizer_files.dict
fi

# --- the HDF5 readers: checkpoints and prepared datasets ---
# The readers are built here with the sanitizers; the model, tensors and optimizer they load into
# come from the CMake build's library (BUILD_DIR, default build/: run after building qkv), linked
# as its link line for qkv says. Without that library the target is skipped.
if wanted fuzz_checkpoint && with_lld fuzz_checkpoint; then
  build_dir=${BUILD_DIR:-build}
  if [[ -f $build_dir/libqkv_core.a && -f $build_dir/CMakeFiles/qkv.dir/link.txt ]]; then
    # The libraries after "-o qkv" on qkv's link line, the core library by its path (the
    # commands' and the benchmarks' libraries left out: the target calls neither).
    read -ra libs <<< "$(sed -e 's/.* -o qkv //' -e 's/ libqkv_app\.a / /' -e 's/ libqkv_bench\.a / /' \
      -e "s| libqkv_core\.a | $build_dir/libqkv_core.a |" "$build_dir/CMakeFiles/qkv.dir/link.txt")"
    read -ra cflags <<< "$(pkg-config --cflags hdf5) $(pkg-config --cflags tomlplusplus)"
    build fuzz_checkpoint tests/fuzz/fuzz_checkpoint.cpp train/checkpoint.cpp train/checkpoint.h data/h5.cpp \
      data/h5.h data/h5_atomic.cpp data/h5_atomic.h data/h5_driver.cpp data/dataset.cpp data/dataset.h \
      data/tokenizer.cpp data/input_file.cpp tensor/error.h "$build_dir/libqkv_core.a" -- "${libs[@]}"
    cflags=()
    # Seeds: edit programs of a few steps each (the base files are made by the target itself).
    corpus=$work/fuzz_checkpoint/corpus
    printf '\x01' > "$corpus/unchanged_checkpoint"
    printf '\x00' > "$corpus/unchanged_dataset"
    printf '\x01\x05\x00\x00\x08\x00\x0c[model]\nn_layer=2\x01' > "$corpus/config"
    printf '\x01\x03\x00\x00\x02' > "$corpus/hard_link"
    printf '\x01\x07\x03\x00\x04\x05\x03\x04' > "$corpus/dataset"
    run fuzz_checkpoint 4096
  else
    echo "fuzz_checkpoint: skipped (no $build_dir/libqkv_core.a: build qkv first, or set BUILD_DIR)"
  fi
fi

exit $failed
