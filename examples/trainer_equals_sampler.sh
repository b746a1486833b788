#!/usr/bin/env bash
# The trainer's log-probabilities are the sampler's, bit for bit, under numerics = invariant:
# train a tiny model, sample from it with --logprobs, score the same tokens with the training
# loss's kernel (qkv eval --per-token), and compare the two lists number by number.
#
#   examples/trainer_equals_sampler.sh [standard|invariant]   (default invariant)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
qkv="${BUILD_DIR:-$repo/build}/qkv"
mode="${1:-invariant}"
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
cd "$repo"
"$qkv" train --config configs/tiny.toml --set "train.out_dir=\"$run/run\"" --numerics "$mode" --quiet >/dev/null
"$qkv" sample --checkpoint "$run/run/best.h5" --prompt "ROMEO:" --temperature 0.8 --max-new-tokens 24 \
  --numerics "$mode" --logprobs --json 2>/dev/null | tail -n 1 >"$run/sample.json"
ids=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(",".join(map(str, j["prompt_tokens"] + j["tokens"])))' "$run/sample.json")
"$qkv" eval --checkpoint "$run/run/best.h5" --ids "$ids" --per-token --numerics "$mode" --json 2>/dev/null |
  tail -n 1 >"$run/eval.json"
python3 - "$run/sample.json" "$run/eval.json" "$mode" <<'PY'
import json, sys
sample = json.load(open(sys.argv[1]))["logprobs"]
scored = json.load(open(sys.argv[2]))["per_token"]["logprob"][-len(sample):]
gap = max(abs(a - b) for a, b in zip(sample, scored))
same = sum(a == b for a, b in zip(sample, scored))
print(f"{sys.argv[3]}: {same} of {len(sample)} sampled log-probs equal the trainer's bit for bit; max |diff| {gap:.3g}")
PY
