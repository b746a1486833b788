#!/usr/bin/env bash
# Fails (exit 1, naming the files) when a tracked C++/CUDA source is not laid out as .clang-format
# says. `scripts/check_format.sh --fix` rewrites them instead. The layout is pinned to clang-format
# 14 (Debian 12's): other major versions break some lines differently, so they skip the check with
# a note rather than fail on a layout nobody chose.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check_format.sh: clang-format not installed (apt-get install clang-format); skipped" >&2
  exit 0
fi
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ $major != 14 ]]; then
  echo "check_format.sh: clang-format $major is not the pinned 14; skipped" >&2
  exit 0
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format.sh: ${#bad[@]} file(s) not formatted (scripts/check_format.sh --fix): ${bad[*]}" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} files formatted as .clang-format says" >&2
