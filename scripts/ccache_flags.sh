#!/usr/bin/env bash
# Prints the cmake arguments that compile through ccache, or nothing when ccache is not installed.
# The cache is CCACHE_DIR (default: .ccache/ in the repository), and paths are hashed relative to
# the repository (CCACHE_BASEDIR), so the build folders of one checkout share their objects. The
# settings travel in the launcher command itself: nothing is written to a user's ccache setup.
command -v ccache >/dev/null || exit 0
root="$(cd "$(dirname "$0")/.." && pwd)"
launcher="env;CCACHE_DIR=${CCACHE_DIR:-$root/.ccache};CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=1;ccache"
echo "-DCMAKE_C_COMPILER_LAUNCHER=$launcher -DCMAKE_CXX_COMPILER_LAUNCHER=$launcher -DCMAKE_CUDA_COMPILER_LAUNCHER=$launcher"
