#!/usr/bin/env bash
# The GPU check, sized for one call on a lent GPU machine (well under 8 minutes on an H200):
# configure with CUDA required, build, run every [cuda] test case, then the GPT-2 124M training
# step benchmark (configs/bench/gpt2_gpu.toml), and write the logs to $OUT (or the folder given
# as the first argument, default runs/gpu_check).
#   scripts/gpu_check.sh [LOG_DIR]
# Exit status: non-zero when the build fails, no GPU is visible, or a [cuda] case fails.
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the lines above, not a folder named --help
  sed -n '2,7{s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$out"
build_dir=${BUILD_DIR:-build-gpu}
log() { echo "gpu_check: $*" | tee -a "$out/summary.txt" >&2; }
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -1; }  # Catch's compact report ends in a blank line

{ nvidia-smi || true; nvcc --version || true; } > "$out/device.txt" 2>&1
log "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"
log "source: commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ' + uncommitted changes')"

start=$(date +%s)
if ! { cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DQKV_CUDA=ON &&
       cmake --build "$build_dir" -j"$(nproc)" --target qkv_tests qkv; } > "$out/build.log" 2>&1; then
  log "build failed (tail of $out/build.log):"; tail -30 "$out/build.log" >&2; exit 2
fi
log "built in $(( $(date +%s) - start )) s"

if ! nvidia-smi -L > /dev/null 2>&1; then log "no GPU visible: the [cuda] cases would only skip"; exit 3; fi

"$build_dir/tests/qkv_tests" "[cuda]" -s -r compact > "$out/cuda_tests.log" 2>&1
status=$?
grep -E "skipped: no CUDA device" "$out/cuda_tests.log" > /dev/null && { log "the tests saw no CUDA device"; status=3; }
log "[cuda] tests: $(last_line "$out/cuda_tests.log") (exit $status)"
# The tiled attention kernels against the untiled ones (attention/cuda/dev/, same arithmetic per
# row): if this fails while the CPU comparisons pass, the bug is in the tiling.
"$build_dir/tests/qkv_tests" "[cuda][simple]" -s -r compact > "$out/cuda_attention_simple.log" 2>&1
simple_status=$?
log "[cuda] attention, simple kernels: $(last_line "$out/cuda_attention_simple.log") (exit $simple_status)"

# Everything but the tensor-core tests again with the float32 attention kernels under bf16
# autocast: if a bf16 case fails only in the first run, the tensor-core kernels are at fault.
QKV_TEST_CUDA_ATTENTION=simt "$build_dir/tests/qkv_tests" "[cuda]~[mma]" -s -r compact > "$out/cuda_tests_simt.log" 2>&1
simt_status=$?
log "[cuda] without tensor-core attention: $(last_line "$out/cuda_tests_simt.log") (exit $simt_status)"

# cuBLAS on the step's GEMM shapes, float32 and bf16 (the denominator of the step's MFU).
timeout 60 "$build_dir/qkv" bench --what gemm --config configs/bench/gpt2_gpu.toml --json \
  > "$out/bench_gemm_gpu.json" 2> "$out/bench_gemm_gpu.log"
bench_status=$?
log "bench gemm: exit $bench_status ($(grep step-weighted "$out/bench_gemm_gpu.log" | tr '\n' ' '))"
# The GPT-2 124M training step on the GPU (float32, then bf16 autocast; figures, not pass/fail).
timeout 60 "$build_dir/qkv" bench --what step --config configs/bench/gpt2_gpu.toml --steps 5 --json \
  > "$out/bench_gpt2_gpu.json" 2> "$out/bench_gpt2_gpu.log"
bench_status=$?
log "bench gpt2_gpu: exit $bench_status ($(tail -1 "$out/bench_gpt2_gpu.log"))"
timeout 60 "$build_dir/qkv" bench --what step --config configs/bench/gpt2_gpu.toml --set train.dtype=bf16 --steps 5 \
  --json > "$out/bench_gpt2_gpu_bf16.json" 2> "$out/bench_gpt2_gpu_bf16.log"
bench_status=$?
log "bench gpt2_gpu bf16: exit $bench_status ($(tail -1 "$out/bench_gpt2_gpu_bf16.log"))"
# Where the bf16 step's time goes (each timed region waits for the device, so the sum exceeds
# the unprofiled step).
timeout 60 "$build_dir/qkv" bench --what step --config configs/bench/gpt2_gpu.toml --set train.dtype=bf16 --steps 3 \
  --profile > "$out/bench_gpt2_gpu_bf16_profile.log" 2>&1
log "bench gpt2_gpu bf16 --profile: exit $?"
# Attention alone on the GPU: causal fwd/bwd TFLOP/s at N 1024, 4096 and head dims 64, 128.
timeout 60 "$build_dir/qkv" bench --what attention --config configs/bench/gpt2_gpu.toml --n 1024 4096 \
  --head-dim 64 128 --json > "$out/bench_attention_gpu.json" 2> "$out/bench_attention_gpu.log"
bench_status=$?
log "bench attention: exit $bench_status"
timeout 60 "$build_dir/qkv" bench --what attention --config configs/bench/gpt2_gpu.toml --set train.dtype=bf16 \
  --n 1024 4096 --head-dim 64 128 --json > "$out/bench_attention_gpu_bf16.json" 2> "$out/bench_attention_gpu_bf16.log"
log "bench attention bf16 (tensor cores): exit $?"
exit $status
