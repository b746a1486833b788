// What a run needs besides its config and model: the tokenizer and the token splits, built from
// `data.path` (or random tokens for benchmarks). The model is built by train/model_factory.h.
#pragma once
#include <memory>

#include "data/dataset.h"
#include "nn/transformer.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace qkv::train {

struct RunData {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const TokenSplit> train, val;
  int64_t vocab_size = 0;  // what the model must cover: the tokenizer's, or model.vocab_size for random tokens
};

// data.random_tokens: uniform tokens in [0, model.vocab_size) drawn from Philox(seed), with a
// byte tokenizer standing in; otherwise load_or_prepare(data.path, …).
RunData load_run_data(const Config& cfg);

// The run's CorpusFingerprint: token count and FNV-1a 64 of the train then val split's ids.
// One pass over the tokens (about a second per 10^9 bytes of ids).
CorpusFingerprint corpus_fingerprint(const RunData& data);

// Applies train.threads (0 = leave OpenMP's default).
void apply_thread_setting(const Config& cfg);

}  // namespace qkv::train
