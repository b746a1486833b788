#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest).
# QUICK=1 skips the tests tagged [slow]. Then the GPU tests ([cuda]) run again on the host CUDA
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

if [[ ${CUDA_EMULATION:-1} == 1 ]]; then
  emu_dir=${EMULATED_BUILD_DIR:-build-emulated}
  cmake -S . -B "$emu_dir" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=EMULATE -DQKV_MPI=OFF >&2
  cmake --build "$emu_dir" -j2 --target qkv_tests >&2
  ctest --test-dir "$emu_dir" --output-on-failure --timeout 1800 -j2
fi
