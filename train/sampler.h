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
  // The draw stream: token n of a completion draws its uniform from Philox at counter
  // (n, stream) under key `seed`. generate_batch gives prompt i stream i, so a prompt's draws do
  // not depend on the row or step it ran in; generate with stream = i draws the same numbers.
  uint32_t stream = 0;
};

// One completion: the generated ids (prompt excluded) and, when asked for, log p(token | context)
// of each under the model's raw logits (temperature 1, every row of the vocabulary), from
// train::token_logprobs on the logits row the token was drawn from.
struct Completion {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
};

// Returns the generated token ids (prompt excluded). Refuses (qkv::Error) max_new_tokens < 0,
// token_count < 0 or past the model's vocabulary,
// a temperature that is negative or not finite, top_k < 0, and top_p outside (0, 1] or NaN. `on_token` (optional) is called with each
// new id as soon as it is drawn (streaming).
// `logprobs` (optional) receives one log-probability per generated token (see Completion).
std::vector<int32_t> generate(const nn::DecoderModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opts, const std::function<void(int32_t)>& on_token = {},
                              std::vector<double>* logprobs = nullptr);

// Continuous batching: up to `batch_size` prompts decode together. A prompt is prefilled alone
// (batch 1, into its own KV cache, ForwardArgs::row_caches), then joins the decode batch, where
// each step draws one token for every active row in ONE forward; a row that has its
// max_new_tokens leaves and the next prompt in the queue takes its place. Prompt i draws with
// stream i (SampleOptions::stream, opts.stream ignored), so under numerics = invariant its
// completion is exactly generate's for that prompt with stream = i, whatever the batch size.
// Every context stays in its cache: a prompt of P tokens needs P + max_new_tokens - 1 <=
// model.block_size (generate's cached regime; past it generate re-windows), else qkv::Error
// naming the prompt. `on_done(i, completion)` (optional) is called in prompt order as soon as
// prompts 0..i are all complete. Refuses what generate refuses, batch_size < 1 and
// opts.kv_cache = false. Returns the completions in prompt order.
// `on_logits(i, n, row)` (optional) sees the logits row token n of prompt i is drawn from (V
// floats on the host, valid during the call): how leakcheck's batched_generation compares each
// row with the same prompt decoded alone.
using LogitsObserver = std::function<void(size_t prompt, int64_t n, const float* logits)>;
std::vector<Completion> generate_batch(const nn::DecoderModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                       const SampleOptions& opts, int64_t batch_size, bool logprobs = false,
                                       const std::function<void(size_t, const Completion&)>& on_done = {},
                                       const LogitsObserver& on_logits = {});

// Picks a token from one row of logits by the options (temperature, top-k, top-p) with the
// uniform draw u in [0, 1). Exposed for tests.
int32_t pick_token(const float* logits, int64_t vocab, const SampleOptions& opts, double u);

}  // namespace qkv::train
