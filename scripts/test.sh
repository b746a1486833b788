#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest).
# QUICK=1 skips the tests tagged [slow]. The bitwise-exact cases then run once more under each
# OpenBLAS kernel the CPU can run (below). Then the GPU tests ([cuda]) run again on the host CUDA
# emulator (tests/emulation/README.md), so they run on machines without a GPU too: a second build,
# QKV_CUDA=EMULATE, in build-emulated/. CUDA_EMULATION=0 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
build_dir=${BUILD_DIR:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--test-dir "$build_dir" --output-on-failure --timeout 900)
if [[ ${QUICK:-0} == 1 ]]; then
  args+=(-LE slow)
fi
ctest "${args[@]}"

# The bitwise-exact cases ([exact]) again under every OpenBLAS kernel this CPU can run: a
# machine's environment may set OPENBLAS_CORETYPE, and another kernel rounds GEMM tails
# differently, so an exactness that rests on one kernel's rounding must fail here first.
# BLAS_KERNELS=0 skips this part; BLAS_KERNELS="Haswell Zen" picks the kernels.
if [[ ${BLAS_KERNELS:-all} != 0 && $(uname -m) == x86_64 ]]; then
  kernels=(${BLAS_KERNELS:-})
  if [[ ${BLAS_KERNELS:-all} == all ]]; then
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done; }
    kernels=(Prescott)                                   # the generic SSE3 path: any x86-64
    if has avx2 fma; then kernels+=(Haswell Zen); fi
    if has avx512f avx512bw avx512dq avx512vl avx512cd; then kernels+=(SkylakeX); fi
  fi
  for kernel in "${kernels[@]}"; do
    echo "test.sh: the [exact] cases with OPENBLAS_CORETYPE=$kernel" >&2
    OPENBLAS_CORETYPE=$kernel QKV_EXPECT_BLAS_KERNEL=$kernel "$build_dir/tests/qkv_tests" "[exact]" >&2
  done
fi

if [[ ${CUDA_EMULATION:-1} == 1 ]]; then
  emu_dir=${EMULATED_BUILD_DIR:-build-emulated}
  cmake -S . -B "$emu_dir" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=EMULATE -DQKV_MPI=OFF >&2
  cmake --build "$emu_dir" -j2 --target qkv_tests >&2
  ctest --test-dir "$emu_dir" --output-on-failure --timeout 1800 -j2
fi
