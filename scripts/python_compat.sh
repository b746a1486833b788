#!/usr/bin/env bash
# The Python tests (python/tests) and the Hugging Face interop check (tests/interop/) against
# today's PyPI packages: torch 2.x, transformers 5.x and numpy 2.x in a virtual environment of
# Debian's python3 (the interpreter the build's module is made for). A few GB of downloads, so it
# is not part of CI or scripts/test.sh; run it after scripts/bootstrap.sh has built qkv and
# qkv_python. Prints the versions, then each stage's result; exits non-zero when a stage fails.
# Usage: scripts/python_compat.sh [VENV_DIR]   (default build/venv-compat; BUILD_DIR=build)
set -uo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then  # the lines above, not a folder named --help
  sed -n '2,7{s/^# \{0,1\}//;p}' "$0"
  exit 0
fi
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
venv=${1:-$build/venv-compat}
[[ -x $build/qkv ]] || { echo "python_compat: $build/qkv is not built (scripts/bootstrap.sh)" >&2; exit 2; }
if [[ ! -x $venv/bin/python ]]; then
  /usr/bin/python3 -m venv "$venv" || { echo "python_compat: cannot create the venv $venv" >&2; exit 2; }
fi
"$venv/bin/pip" install -q --upgrade "torch>=2" "transformers>=5" "numpy>=2" pytest safetensors h5py pillow matplotlib ||
  { echo "python_compat: pip install into $venv failed" >&2; exit 2; }
"$venv/bin/python" -c "import sys, numpy, torch, transformers
print(f'python_compat: Python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__}, '
      f'transformers {transformers.__version__}')"

status=0
echo "python_compat: python/tests (PYTHONPATH=$build/python)"
QKV_SOURCE_DIR=$PWD QKV_BINARY_DIR=$PWD/$build PYTHONPATH=$PWD/$build/python \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests || status=1
echo "python_compat: tests/interop/hf_interop_check.py"
OMP_NUM_THREADS=2 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1 \
  "$venv/bin/python" tests/interop/hf_interop_check.py "$build/qkv" || status=1
exit $status
