#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest).
# QUICK=1 skips the tests tagged [slow]. The bitwise-exact cases then run once more under each
# OpenBLAS kernel the CPU can run (below). Then the non-slow CPU suite runs once more under
# AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer (-DQKV_SANITIZE=address,undefined,
# in build-sanitize/, or SANITIZE_BUILD_DIR; SANITIZE=0 skips it). Then the GPU tests ([cuda]) run
# again on the host CUDA emulator (tests/emulation/README.md), so they run on machines without a
# GPU too: a second build, QKV_CUDA=EMULATE, in build-emulated/. CUDA_EMULATION=0 skips that part.
# Before ctest, torch and transformers are installed for the interop test and the Python tests
# (python/tests; INTEROP=0 skips the install, and those tests then report themselves skipped);
# after it, the Python tests that need no torch run again in a venv with numpy 2.x from PyPI
# (NUMPY2=0 skips them), then the fuzz targets run for FUZZ_SECONDS each (default 10; 0 skips)
# when clang is there.
set -euo pipefail
# Settings come from the environment (above): --help prints these lines, an argument is refused.
if (($#)); then
  if [[ $1 == -h || $1 == --help ]]; then
    sed -n '2,13{s/^# \{0,1\}//;p}' "$0"
    exit 0
  fi
  echo "test.sh: takes no arguments, got '$1' (QUICK=1, SANITIZE=0, ... go in the environment; --help)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
# Each stage prints its wall time (and the running total) as it ends.
test_start=$SECONDS
stage_start=$SECONDS
stage_done() {
  echo "test.sh: stage '$1': $((SECONDS - stage_start)) s (total $((SECONDS - test_start)) s)" >&2
  stage_start=$SECONDS
}
# The packages first; the interop install (network-bound) then runs beside the build (CPU-bound).
BOOTSTRAP_BUILD=0 scripts/bootstrap.sh

# The Hugging Face interop test (ctest label "interop", tests/interop/hf_interop_check.py) and the
# Python tests (label "python": PyTorch references, transformers' logits) run against the real
# `transformers`: Debian's python3-torch (torch 1.13) and, with pip,
# transformers==4.36.2 (a release that works with that torch); the fuzz stage needs clang and lld.
# Installed here when missing, in the background while the build runs; INTEROP=0 and
# FUZZ_SECONDS=0 skip their installs. Without torch or transformers the interop test reports
# itself skipped (the committed fixtures of tests/train/test_hf_interop.cpp still run); without
# clang the fuzz stage says it is skipped. A failed install (no network) only warns.
interop_pid=""
interop_log=$(mktemp)
background_packages=()
want_interop=0
if [[ ${FUZZ_SECONDS:-10} != 0 ]] && ! { command -v clang++ && command -v ld.lld; } >/dev/null; then
  background_packages+=(clang lld)
fi
if [[ ${INTEROP:-1} == 1 ]] && ! /usr/bin/python3 -c "import torch, transformers" 2>/dev/null; then
  background_packages+=(python3-torch python3-pip)
  want_interop=1
fi
if ((${#background_packages[@]})); then
  echo "test.sh: installing ${background_packages[*]} in the background" >&2
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  {
    $sudo_cmd apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        "${background_packages[@]}" &&
      if [[ $want_interop == 1 ]]; then
        $sudo_cmd /usr/bin/python3 -m pip install -q --break-system-packages transformers==4.36.2 &&
          /usr/bin/python3 -c "import torch, transformers"
      fi
  } >"$interop_log" 2>&1 </dev/null &
  interop_pid=$!
fi
stage_done packages

scripts/bootstrap.sh
stage_done build
# The sources keep the layout of .clang-format (clang-format 14); FORMAT_CHECK=0 skips this.
if [[ ${FORMAT_CHECK:-1} == 1 ]]; then scripts/check_format.sh; fi
stage_done format

if [[ -n $interop_pid ]]; then
  wait "$interop_pid" || {
    tail -5 "$interop_log" >&2
    echo "test.sh: WARNING: could not install ${background_packages[*]}; the tests that need them are skipped" >&2
  }
fi
rm -f "$interop_log"
stage_done "background install"
build_dir=${BUILD_DIR:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
args=(--test-dir "$build_dir" --output-on-failure --timeout 900 -j2)
if [[ ${QUICK:-0} == 1 ]]; then
  args+=(-LE slow)
fi
ctest "${args[@]}"
stage_done ctest

# The Python tests that need no torch once more under numpy 2: a virtual environment of
# /usr/bin/python3 without the system's packages, with numpy 2.x, pytest and h5py from PyPI, runs
# them against the module ctest used (build/python, built with Debian's pybind11). Kept in
# build/numpy2-venv, so a later run installs nothing. Without PyPI the stage warns and is skipped;
# NUMPY2=0 skips it.
if [[ ${NUMPY2:-1} == 1 && -d $build_dir/python/qkv ]]; then
  build_abs=$(cd "$build_dir" && pwd)
  numpy2_venv=$build_abs/numpy2-venv
  if { [[ -x $numpy2_venv/bin/python ]] || /usr/bin/python3 -m venv "$numpy2_venv"; } &&
    timeout 300 "$numpy2_venv/bin/python" -m pip install -q --disable-pip-version-check --retries 1 --timeout 15 \
      "numpy>=2" pytest h5py >&2; then
    (
      source_abs=$PWD
      cd python/tests
      PYTHONPATH=$build_abs/python QKV_BINARY_DIR=$build_abs QKV_SOURCE_DIR=$source_abs \
        "$numpy2_venv/bin/python" -m pytest -q -p no:cacheprovider \
        test_tensor.py test_stubs.py test_model.py test_train.py test_analysis.py >&2
    )
    echo "test.sh: the Python tests under numpy $("$numpy2_venv/bin/python" -c 'import numpy; print(numpy.__version__)')" >&2
  else
    echo "test.sh: WARNING: no virtual environment with numpy 2 (PyPI unreachable?); the numpy 2 stage is skipped" >&2
  fi
fi
stage_done "numpy 2"

# The libFuzzer targets (tests/fuzz/run_fuzz.sh: the safetensors header, the CLI number parsers,
# the config parser, the tokenizer files and the checkpoint readers, under AddressSanitizer and
# UndefinedBehaviorSanitizer), each for FUZZ_SECONDS (default 10) when clang++ is installed; 0
# skips them.
if [[ ${FUZZ_SECONDS:-10} != 0 ]]; then
  if command -v clang++ >/dev/null; then
    WORK="$build_dir/fuzz" tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS:-10}" >&2
  else
    echo "test.sh: clang++ not installed; the fuzz runs are skipped (apt-get install clang)" >&2
  fi
fi
stage_done fuzz

# The bitwise-exact cases ([exact]) again under every GEMM kernel this CPU can run: qkv's own
# (QKV_GEMM=sse, avx2, avx512: tensor/cpu/gemm/gemm.h) and OpenBLAS's (QKV_GEMM=blas with
# OPENBLAS_CORETYPE: a machine's environment may set it, and another kernel rounds GEMM tails
# differently), so an exactness that rests on one kernel's rounding must fail here first.
# GEMM_KERNELS=0 skips this part; BLAS_KERNELS="Haswell" / OWN_KERNELS="sse avx2" pick the kernels.
if [[ ${GEMM_KERNELS:-1} != 0 && $(uname -m) == x86_64 ]]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done; }
  blas_kernels=(${BLAS_KERNELS:-})
  own_kernels=(${OWN_KERNELS:-})
  if [[ -z ${BLAS_KERNELS:-} ]]; then
    blas_kernels=(Prescott)                              # the generic SSE3 path: any x86-64
    if has avx2 fma; then blas_kernels+=(Haswell); fi    # (OpenBLAS's Zen sgemm is Haswell's)
    if has avx512f avx512bw avx512dq avx512vl avx512cd; then blas_kernels+=(SkylakeX); fi
  fi
  if [[ -z ${OWN_KERNELS:-} ]]; then
    own_kernels=(sse)
    if has avx2 fma; then own_kernels+=(avx2); fi
    if has avx512f fma; then own_kernels+=(avx512); fi
  fi
  # Each run as "QKV_GEMM:OPENBLAS_CORETYPE".
  runs=()
  for kernel in "${blas_kernels[@]}"; do runs+=("blas:$kernel"); done
  for kernel in "${own_kernels[@]}"; do runs+=("$kernel:"); done
  for run in "${runs[@]}"; do
    gemm=${run%%:*} core=${run#*:}
    echo "test.sh: the [exact] cases with QKV_GEMM=$gemm${core:+ OPENBLAS_CORETYPE=$core}" >&2
    env QKV_GEMM="$gemm" QKV_EXPECT_GEMM_KERNEL="$gemm" ${core:+OPENBLAS_CORETYPE=$core QKV_EXPECT_BLAS_KERNEL=$core} \
      "$build_dir/tests/qkv_tests" "[exact]" >&2
  done
  # Across processes: under numerics = invariant a checkpoint's per-token log-probabilities are
  # the same bits whatever the kernel and the thread count (docs/consistency.md).
  run_dir="$build_dir/invariant-kernels"
  "$build_dir/qkv" train --config configs/tiny.toml --set train.max_steps=5 --set "train.out_dir=\"$run_dir\"" \
    --overwrite --quiet >/dev/null
  reference=""
  for run in "${runs[@]}"; do
    gemm=${run%%:*} core=${run#*:}
    for threads in 1 2; do
      got=$(env QKV_GEMM="$gemm" ${core:+OPENBLAS_CORETYPE=$core} OMP_NUM_THREADS=$threads "$build_dir/qkv" eval \
        --checkpoint "$run_dir/best.h5" \
        --ids 3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7,9,5,0,2,8,8 --per-token \
        --numerics invariant --json 2>/dev/null | tail -n 1)
      if [[ -z $reference ]]; then reference=$got; fi
      if [[ $got != "$reference" ]]; then
        echo "test.sh: invariant log-probs differ under QKV_GEMM=$gemm OPENBLAS_CORETYPE=$core with $threads threads" >&2
        exit 1
      fi
    done
  done
  echo "test.sh: invariant per-token log-probs identical under ${runs[*]} x 1, 2 threads" >&2
fi
stage_done "GEMM kernels"

# The CPU suite once more under AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer
# (-DQKV_SANITIZE=address,undefined, in build-sanitize/): any report fails its test. UBSan's
# alignment, null and pointer-overflow checks are left out (QKV_SANITIZE_SKIP): they add much of
# the sanitized build's compile time, and AddressSanitizer reports a null or wild access itself; the
# test cases' own sources are not instrumented (tests/CMakeLists.txt), the library is. Leaks
# inside libraries (OpenMPI's init/finalize, ...) are suppressed in tests/sanitizer/lsan.supp, each
# with its reason; a leak in qkv's own code is a bug. The cases labelled "long" (loops over many
# cases of paths that shorter tests reach) and the Python interop check stay out of this run (about
# 5 min of 2 cores, after the sanitized build). SANITIZE=0 skips the stage.
if [[ ${SANITIZE:-1} == 1 ]]; then
  san_dir=${SANITIZE_BUILD_DIR:-build-sanitize}
  cmake -S . -B "$san_dir" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=OFF -DQKV_MPI=OFF \
    -DQKV_SANITIZE=address,undefined -DQKV_SANITIZE_SKIP=alignment,null,pointer-overflow $(scripts/ccache_flags.sh) >&2
  cmake --build "$san_dir" -j2 --target qkv qkv_tests >&2
  # detect_leaks: LeakSanitizer at every exit (a leak fails the test or CLI run, exit status 1).
  # abort_on_error=0: a report exits with a status instead of dumping core.
  # fast_unwind_on_malloc=0: HDF5 and OpenMPI are built without frame pointers, so the fast
  # unwinder stops at their first frame; the suppressions name functions below it (H5O_protect),
  # and a report needs the whole stack to say whose allocation it is (~1.4x slower CLI runs).
  # halt_on_error / -fno-sanitize-recover: the first UB report stops the program.
  # (A subshell: the options stay out of the stages below; the CLI runs the tests start inherit them.)
  (
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0
    export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ctest --test-dir "$san_dir" --output-on-failure --timeout 1800 -j2 -LE "slow|mpi|emulation|interop|long"
  )
fi
stage_done sanitizers

if [[ ${CUDA_EMULATION:-1} == 1 ]]; then
  emu_dir=${EMULATED_BUILD_DIR:-build-emulated}
  # Through ccache, every object whose preprocessed source is the main build's is reused.
  cmake -S . -B "$emu_dir" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=EMULATE -DQKV_MPI=OFF $(scripts/ccache_flags.sh) >&2
  cmake --build "$emu_dir" -j2 --target qkv_tests >&2
  ctest --test-dir "$emu_dir" --output-on-failure --timeout 1800 -j2
fi
stage_done "CUDA emulation"
