#!/usr/bin/env bash
# Sensitivity check of the emulated [cuda] suite (manual; ~10 minutes on 2 cores): each mutant
# plants one bug in the CUDA sources of a copy of the tree, builds it with QKV_CUDA=EMULATE and
# runs the [cuda] cases named; every mutant must make them fail (a wrong value, an emulator abort,
# a crash on a host access to device memory, or a refused launch).
# The last three plant the stable-softmax bugs in the CPU kernels that the same build's
# [large_logits] cases must catch (no other [attention], [leakcheck] or [gradcheck] case does: their
# logits stay far below exp's float32 overflow).
# Usage: tests/emulation/run_cuda_mutants.sh [WORK_DIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d)}
tree="$work/tree"
build="$work/build"
mkdir -p "$work"
rm -rf "$tree" && mkdir -p "$tree"
(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tree")
cmake -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=EMULATE -DQKV_MPI=OFF > "$work/cmake.log" 2>&1 ||
  { echo "configure failed ($work/cmake.log)"; exit 1; }
missed=0

# mutant NAME FILE SED_SCRIPT CATCH_SPEC (a test-name pattern without commas: Catch splits on them)
mutant() {
  local name=$1 file=$2 script=$3 spec=$4
  cp "$root/$file" "$tree/$file"
  sed -i -e "$script" "$tree/$file"
  if cmp -s "$root/$file" "$tree/$file"; then
    echo "$name: the sed script changed nothing (the source moved on?)"
    missed=$((missed + 1))
    return
  fi
  if ! cmake --build "$build" -j2 --target qkv_tests > "$work/$name.build.log" 2>&1; then
    echo "$name: does not build ($work/$name.build.log)"
    missed=$((missed + 1))
  elif timeout 600 "$build/tests/qkv_tests" "$spec" > "$work/$name.log" 2>&1 ||
      grep -q "No tests ran" "$work/$name.log"; then
    echo "$name: NOT caught, or no test ran ($work/$name.log)"
    missed=$((missed + 1))
  else
    echo "$name: caught: $(grep -E -m1 'emulator|FAILED|Segmentation|SIGSEGV|failed:|cuda\]' "$work/$name.log")"
  fi
  cp "$root/$file" "$tree/$file"
}

mutant missing_barrier tensor/cuda/reduce.cu \
  '0,/red\[threadIdx.x\] += red\[threadIdx.x + s\];/{n;/__syncthreads/d}' \
  "CUDA reductions and softmax match the CPU kernels along any dims and strides"
mutant cublas_operands_swapped tensor/cuda/matmul.cu \
  's/c.sgemm_strided_batched(c.handle, op(tb), op(ta)/c.sgemm_strided_batched(c.handle, op(ta), op(tb)/' \
  "cuBLAS matmul and linear match the CPU GEMMs*"
mutant host_reads_device_memory tensor/cuda/elementwise.cu \
  's|^    fill_kernel<T><<<|    if (n > 0) (void)*static_cast<volatile char*>(t.raw_data());\n&|' \
  "device round trip keeps every dtype's bits*"
mutant shared_memory_over_default attention/cuda/fused_attention.cu \
  's/> 48 \* 1024) t \/= 2;/> 96 * 1024) t \/= 2;/' \
  "CUDA fused attention matches the CPU fused kernel*"
mutant shuffle_partner tensor/cuda/kernel_util.cuh \
  '0,/__shfl_xor_sync(0xffffffffu, v, o)/s//__shfl_xor_sync(0xffffffffu, v, o \/ 2 + 1)/' \
  "CUDA embedding*"
mutant adamw_slice_search tensor/cuda/adamw.cu \
  's/if (first_block\[mid\] <= b) lo = mid;/if (first_block[mid] < b) lo = mid;/' \
  "*AdamW over all parameters in one launch*"

# CPU attention kernels: the row maximum not subtracted before exp (tests/attention/test_attention_large_logits.cpp)
mutant fused_forward_no_max_subtraction attention/cpu/fused_forward.cpp \
  's/tile::exp_shift_sum(sr, bk, m_new)/tile::exp_shift_sum(sr, bk, T(0))/; s/const T alpha = m\[r\] == ninf ? T(0) : tile::exp_fast(m\[r\] - m_new);/const T alpha = T(1);/; s/lb\[r\] = m\[r\] + std::log(l\[r\]);/lb[r] = std::log(l[r]);/' \
  "[large_logits]"
mutant fused_backward_unshifted_exp attention/cpu/fused_backward.cpp \
  's/else tile::exp_shift(sr, bk, lse);/else { tile::exp_shift(sr, bk, T(0)); tile::scale_row(sr, bk, tile::exp_fast(-lse)); }/' \
  "[large_logits]"
mutant cpu_softmax_no_max_subtraction tensor/cpu/reduce.cpp \
  's/const T e = exp_t<T>(x\[i\] - m);/const T e = exp_t<T>(x[i]);/' \
  "[large_logits]"

echo "$missed mutant(s) not caught"
exit $((missed > 0))
