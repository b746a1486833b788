#!/usr/bin/env bash
# The first command to run on a fresh Debian 12 machine: installs what is missing, builds qkv,
# takes a real English corpus with no download (Debian's `fortunes` package: one document per
# fortune) unless DATA=path is given, trains a small GPT for about 3 minutes on 2 CPU cores,
# prints the validation loss and samples text from the model.
#   scripts/demo.sh                      # fortunes
#   DATA=my.txt scripts/demo.sh          # your own text (documents separated by '%' lines or not at all)
#   STEPS=300 scripts/demo.sh            # shorter
set -euo pipefail
# It takes no arguments (DATA, STEPS and BUILD_DIR come from the environment): --help prints the
# lines above, anything else is refused before anything is installed or built.
if (($#)); then
  if [[ $1 == -h || $1 == --help ]]; then
    sed -n '2,8{s/^# \{0,1\}//;p}' "$0"
    exit 0
  fi
  echo "demo: takes no arguments, got '$1' (DATA=file and STEPS=n go in the environment; --help)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
TARGETS=qkv scripts/bootstrap.sh  # the CLI only: the demo runs no test
build_dir=${BUILD_DIR:-build}
mkdir -p runs/demo

corpus=runs/demo/fortunes.txt
separator=percent_line
if [[ -n ${DATA:-} ]]; then
  [[ -r $DATA ]] || { echo "demo: DATA=$DATA is not a readable file" >&2; exit 2; }
  corpus=$DATA
  grep -qx '%' "$DATA" || separator=none
else
  if ! ls /usr/share/games/fortunes/*.dat >/dev/null 2>&1 || [[ ! -e /usr/share/games/fortunes/literature ]]; then
    echo "demo: installing Debian's fortunes corpus" >&2
    sudo_cmd=""; [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq fortunes >&2
  fi
  # Every fortune file, each followed by a '%' line (a few files lack a final one).
  : > "$corpus.tmp"
  for f in /usr/share/games/fortunes/*; do
    case $f in *.dat|*.u8) continue ;; esac
    [[ -f $f && ! -L $f ]] || continue
    cat "$f" >> "$corpus.tmp"; printf '\n%%\n' >> "$corpus.tmp"
  done
  mv "$corpus.tmp" "$corpus"
fi
echo "demo: corpus $corpus ($(wc -c < "$corpus") bytes)" >&2

"$build_dir/qkv" train --config configs/demo_fortunes.toml --set "data.path=$corpus" \
  --set "data.separator=$separator" ${STEPS:+--set train.max_steps=$STEPS} --plot
echo
echo "demo: loss curves in runs/demo/loss.svg; a sample from the best checkpoint:"
"$build_dir/qkv" sample --checkpoint runs/demo/best.h5 --max-new-tokens 200
