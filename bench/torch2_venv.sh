#!/usr/bin/env bash
# A virtual environment with today's PyTorch from PyPI, for bench/compare_torch.sh and
# bench/compare_attention.sh (a bench dependency, not CI's: the wheel and its dependencies take a
# few GB of disk).
#
#   bench/torch2_venv.sh DIR          e.g. bench/torch2_venv.sh ~/venv-torch2
#   PYTHON=DIR/bin/python bench/compare_torch.sh configs/bench/M.toml
#
# Creates DIR with BASE_PYTHON (default /usr/bin/python3: its headers, python3-dev, are what
# torch.compile's C++ code generation includes), installs the newest `torch` and `numpy`
# (TORCH_SPEC overrides, e.g. TORCH_SPEC='torch==2.5.*'), and prints the installed version and
# whether torch.compile and SDPA are there. Re-running on an existing DIR upgrades it.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,12{s/^# \{0,1\}//;p}' "$0"
  exit 0
fi

dir="${1:?usage: bench/torch2_venv.sh DIR}"
base="${BASE_PYTHON:-/usr/bin/python3}"
spec="${TORCH_SPEC:-torch}"

command -v "$base" >/dev/null || { echo "torch2_venv: $base not found (set BASE_PYTHON)" >&2; exit 2; }
"$base" -c 'import ensurepip, venv' 2>/dev/null \
  || { echo "torch2_venv: $base has no venv/ensurepip (Debian: apt-get install python3-venv)" >&2; exit 2; }
"$base" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || echo "torch2_venv: warning: no Python.h for $base (Debian: apt-get install python3-dev); torch.compile needs it" >&2

[[ -x "$dir/bin/python" ]] || "$base" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --upgrade pip
"$dir/bin/python" -m pip install --upgrade "$spec" numpy

"$dir/bin/python" - <<'PY'
import sys
import torch
import torch.nn.functional as F
print(f"torch {torch.__version__} in {sys.prefix} (Python {sys.version.split()[0]}): "
      f"torch.compile {'yes' if hasattr(torch, 'compile') else 'no'}, "
      f"SDPA {'yes' if hasattr(F, 'scaled_dot_product_attention') else 'no'}, "
      f"{torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else '?'} kernels")
PY
