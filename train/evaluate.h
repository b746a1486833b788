// Loss evaluation, model in eval mode, no graph recorded.
#pragma once
#include <span>
#include <vector>

#include "data/batcher.h"
#include "nn/transformer.h"

namespace qkv::train {

struct LossSum {
  double sum = 0;      // summed token losses
  int64_t tokens = 0;  // targets that counted
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0.0; }
};

// Mean next-token loss of one batch (x, y and the batch's masks/positions); the model's mode is
// the caller's business. Returns the differentiable mean loss when grad mode is on.
Tensor batch_loss(const nn::DecoderModel& model, const Batch& batch, nn::RngContext rng,
                  int64_t* masked_rows = nullptr);

// log p(target_i | prefix) for each row of logits [N, V]: z[i, t_i] − lse_i in float64, with lse_i
// from the training loss's kernel (qkv::cross_entropy, whose per-row loss is lse_i − z[i, t_i]).
// `qkv eval --per-token` and `qkv sample --logprobs` both call it, so under numerics = invariant
// (equal logits) the sampler's log-probabilities are the trainer's to the bit. Targets must be in
// [0, V) (qkv::Error otherwise).
std::vector<double> token_logprobs(const Tensor& logits, const std::vector<int32_t>& targets);

// Periodic validation: `n_batches` batches from a batcher over `split` seeded with `seed` (the
// same batches at every evaluation, so successive values are comparable).
LossSum evaluate_split(const nn::DecoderModel& model, std::shared_ptr<const TokenSplit> split,
                       const BatcherOptions& opts, int64_t n_batches);

// The same batches' loss row by row: the loss sum and target count of each of this rank's rows, in
// batch then row order. Under numerics = invariant a row's value does not depend on the batch it
// is computed in, so the trainer, adding every rank's rows in global row order, gets the same
// validation loss whatever the split of the global batch.
std::vector<LossSum> evaluate_rows(const nn::DecoderModel& model, std::shared_ptr<const TokenSplit> split,
                                   const BatcherOptions& opts, int64_t n_batches);

// `qkv eval`: every consecutive non-overlapping window of block_size + 1 tokens.
LossSum evaluate_windows(const nn::DecoderModel& model, std::span<const int32_t> tokens, const std::string& name,
                         int64_t rows_per_batch = 8);

// `qkv eval --per-token`: the log-probability of every token of `tokens` after the first of its
// window, windows as evaluate_windows takes them (block_size + 1 tokens from the start, x the first
// block_size) plus a final partial window of >= 2 tokens, so a text shorter than a window is scored
// too. Each target's log p(token | the tokens before it in its window), by token_logprobs.
struct TokenScores {
  std::vector<int64_t> index;  // the target's index in `tokens`
  std::vector<int32_t> token;
  std::vector<double> logprob;
};
TokenScores score_tokens(const nn::DecoderModel& model, std::span<const int32_t> tokens, const std::string& name,
                         int64_t rows_per_batch = 8);

}  // namespace qkv::train
