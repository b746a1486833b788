#!/usr/bin/env bash
# The repository's scripts answer --help with their usage (exit 0) before they install, build,
# create or time anything, and the ones that take no arguments refuse one (exit 2): a user who
# types `scripts/demo.sh --help` gets the lines at its top, not a 3-minute training run, and
# `scripts/gpu_check.sh --help` makes no folder named --help.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0
fail() { echo "scripts_help: $*" >&2; failed=1; }
for script in scripts/test.sh scripts/demo.sh scripts/gpu_check.sh scripts/python_compat.sh bench/compare_torch.sh \
  bench/compare_attention.sh bench/torch2_venv.sh; do
  for flag in --help -h; do
    out=$(bash "$script" "$flag" 2>&1)
    rc=$?
    [[ $rc == 0 ]] || fail "$script $flag: exit $rc"
    # The first comment line of the script, printed without its '# '.
    first=$(sed -n '2{s/^# //;p}' "$script")
    [[ $out == "$first"* ]] || fail "$script $flag printed: ${out:0:200}"
  done
done
for script in scripts/test.sh scripts/demo.sh; do
  err=$(bash "$script" extra 2>&1 >/dev/null)
  rc=$?
  [[ $rc == 2 ]] || fail "$script extra: exit $rc, not 2"
  [[ $err == *"takes no arguments, got 'extra'"* && $(wc -l <<<"$err") == 1 ]] || fail "$script extra said: $err"
done
[[ ! -e --help && ! -e runs/--help && ! -e build/--help ]] || fail "a folder named --help was made"
((failed == 0)) && echo "scripts_help: every script answers --help and refuses what it does not take"
exit $failed
