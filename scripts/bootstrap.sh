#!/usr/bin/env bash
# Installs what is missing (Debian 12, apt), then configures and builds qkv in build/ with -j2.
# Usage: scripts/bootstrap.sh [extra cmake args...]   (BUILD_DIR=... to build elsewhere;
# BOOTSTRAP_BUILD=0 installs the packages and stops there; TARGETS="qkv" builds only those targets)
# When ccache is installed (it is in the list below) every compile goes through it: the cache is
# CCACHE_DIR (default .ccache/ in the repository), so a second build folder with other
# preprocessor settings (scripts/test.sh's QKV_CUDA=EMULATE one) reuses every object whose
# preprocessed source did not change.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenblas-openmp-dev libhdf5-dev catch2 libcli11-dev
          nlohmann-json3-dev libtomlplusplus-dev libpng-dev python3 python3-numpy python3-h5py
          openmpi-bin libopenmpi-dev  # MPI: data-parallel `mpirun -np N qkv train` (docs/distributed.md)
          pybind11-dev python3-pytest python3-matplotlib  # `import qkv` (python/) and its tests
          python3-venv                # the numpy 2 venv of scripts/test.sh; `pip install .` in a venv
          clang-format                # scripts/check_format.sh (the layout of .clang-format)
          ccache)                     # compiler cache shared by the build folders
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

[[ ${BOOTSTRAP_BUILD:-1} == 1 ]] || exit 0

build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} $(scripts/ccache_flags.sh) "$@" >&2
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j2 "${targets[@]}" >&2
echo "bootstrap: built $build_dir/${TARGETS:-qkv and every test}" >&2
