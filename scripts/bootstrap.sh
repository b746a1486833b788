#!/usr/bin/env bash
# Installs what is missing (Debian 12, apt), then configures and builds qkv in build/ with -j2.
# Usage: scripts/bootstrap.sh [extra cmake args...]   (BUILD_DIR=... to build elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenblas-openmp-dev libhdf5-dev catch2 libcli11-dev
          nlohmann-json3-dev libtomlplusplus-dev libpng-dev python3 python3-numpy python3-h5py
          openmpi-bin libopenmpi-dev  # MPI: data-parallel `mpirun -np N qkv train` (docs/distributed.md)
          clang-format)               # scripts/check_format.sh (the layout of .clang-format)
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

build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >&2
cmake --build "$build_dir" -j2 >&2
echo "bootstrap: built $build_dir/qkv" >&2
