#!/usr/bin/env bash
# The trainer's log-probabilities are the sampler's, bit for bit, under numerics = invariant:
# train a tiny model, sample from it with --logprobs, score the same tokens with the training
# loss's kernel (qkv eval --per-token), and compare the two lists number by number. With bf16 the
# model trains in bf16 autocast, and sample and eval run it in bf16 as it trained (the sampler's
# decode steps from bf16 weight panels).
#
#   examples/trainer_equals_sampler.sh [standard|invariant] [float32|bf16]   (default invariant float32)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
qkv="${BUILD_DIR:-$repo/build}/qkv"
mode="${1:-invariant}"
dtype="${2:-float32}"
run="$(mktemp -d)"
trap 'rm -rf "$run"' EXIT
cd "$repo"
"$qkv" train --config configs/tiny.toml --set "train.out_dir=\"$run/run\"" --set "train.dtype=\"$dtype\"" \
  --numerics "$mode" --quiet >/dev/null
"$qkv" sample --checkpoint "$run/run/best.h5" --prompt "ROMEO:" --temperature 0.8 --max-new-tokens 24 \
  --numerics "$mode" --logprobs --json 2>/dev/null | tail -n 1 >"$run/sample.json"
ids=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(",".join(map(str, j["prompt_tokens"] + j["tokens"])))' "$run/sample.json")
"$qkv" eval --checkpoint "$run/run/best.h5" --ids "$ids" --per-token --numerics "$mode" --json 2>/dev/null |
  tail -n 1 >"$run/eval.json"
python3 - "$run/sample.json" "$run/eval.json" "$mode${2:+ $dtype}" <<'PY'
import json, sys
sampled = json.load(open(sys.argv[1]))
sample = sampled["logprobs"]
if sys.argv[3].endswith("bf16") and sampled.get("dtype") != "bf16":
    sys.exit(f"the sampler ran in {sampled.get('dtype')}, not in bf16 as the model trained")
scored = json.load(open(sys.argv[2]))["per_token"]["logprob"][-len(sample):]
gap = max(abs(a - b) for a, b in zip(sample, scored))
same = sum(a == b for a, b in zip(sample, scored))
print(f"{sys.argv[3]}: {same} of {len(sample)} sampled log-probs equal the trainer's bit for bit; max |diff| {gap:.3g}")
PY
