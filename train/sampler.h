// Autoregressive sampling. With the KV cache (default) each new token costs one incremental
// forward over the cached keys; without it the whole context is recomputed every step. Both see
// the same context (the last block_size tokens once the text outgrows the model's window: from
// then on both recompute over the cropped window), so in float32 they draw the same tokens.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "nn/transformer.h"

namespace qkv::train {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy (argmax)
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // nucleus: smallest set of most likely tokens with mass >= top_p
  uint64_t seed = 1337;
  bool kv_cache = true;
  // The tokenizer's size when the model has more rows (a padded vocabulary): ids at or past it
  // have no text, so they are never drawn; the draw is from the model's distribution restricted
  // to ids below it (softmax over those logits alone). 0 = every row.
  int64_t token_count = 0;
};

// Returns the generated token ids (prompt excluded). Refuses (qkv::Error) max_new_tokens < 0,
// token_count < 0 or past the model's vocabulary,
// a temperature that is negative or not finite, top_k < 0, and top_p outside (0, 1] or NaN. `on_token` (optional) is called with each
// new id as soon as it is drawn (streaming).
std::vector<int32_t> generate(const nn::DecoderModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opts, const std::function<void(int32_t)>& on_token = {});

// Picks a token from one row of logits by the options (temperature, top-k, top-p) with the
// uniform draw u in [0, 1). Exposed for tests.
int32_t pick_token(const float* logits, int64_t vocab, const SampleOptions& opts, double u);

}  // namespace qkv::train
