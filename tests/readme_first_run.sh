#!/usr/bin/env bash
# The repository stands alone: a clone in an empty folder, with nothing beside it, runs every
# command of README's "A first run" block and nothing in it refers to a folder outside the clone.
#
#   tests/readme_first_run.sh BUILD_DIR      (ctest entry readme_first_run, label slow)
#
# Clones the committed HEAD of this checkout (uncommitted changes are not part of it), points the
# clone's build/ at BUILD_DIR (the commands call build/qkv; nothing is rebuilt) and runs the block's
# commands from the clone's root, in order. Training commands other than the first get
# `--set train.max_steps=40 --set train.eval_interval=20` so that the check takes seconds, not the
# baby run's minutes; everything else runs as written. Fails on the first command that exits
# non-zero, and on any mention of ../shared in the clone's tracked files.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:?usage: tests/readme_first_run.sh BUILD_DIR}" && pwd)"

if ! git -C "$repo" rev-parse --verify -q HEAD >/dev/null; then
  echo "readme_first_run: $repo is not a git checkout with a commit; nothing to clone (skipped)"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The clone sits alone in its own empty folder: no ../shared, no ../data beside it.
git clone -q --no-hardlinks "$repo" "$work/alone/qkv"
cd "$work/alone/qkv"
ln -s "$build" build

if outside=$(git grep -n -e '\.\./shared' -- . ':!tests/readme_first_run.sh'); then
  echo "readme_first_run: tracked files refer to ../shared:" >&2
  echo "$outside" >&2
  exit 1
fi

# The fenced block right after the "## A first run" heading, without comments.
mapfile -t commands < <(awk '/^## A first run/ {on = 1; next}
  on && /^```/ {if (inside) exit; inside = 1; next}
  inside {sub(/[[:space:]]+#.*$/, ""); if ($0 != "") print}' README.md)
((${#commands[@]} >= 3)) || { echo "readme_first_run: no command block under '## A first run' in README.md" >&2; exit 1; }

trains=0
for cmd in "${commands[@]}"; do
  case "$cmd" in
    scripts/bootstrap.sh*) echo "readme_first_run: '$cmd' (the build: already done in $build)"; continue ;;
    "build/qkv train "*)
      trains=$((trains + 1))
      ((trains == 1)) || cmd+=" --set train.max_steps=40 --set train.eval_interval=20" ;;
  esac
  echo "readme_first_run: $cmd"
  if ! bash -c "$cmd" >"$work/out" 2>"$work/err"; then
    echo "readme_first_run: FAILED in a lone clone: $cmd" >&2
    tail -5 "$work/err" >&2
    exit 1
  fi
done
echo "readme_first_run: ${#commands[@]} README commands ran in a clone with nothing beside it"
