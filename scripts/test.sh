#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest).
# QUICK=1 skips the tests tagged [slow].
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
