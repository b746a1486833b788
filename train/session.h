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

// Refuses a --resume (naming `ckpt`, the key and both values) when the checkpoint's resolved
// config `then` changes what is computed: the model (model_difference between the model `then`
// describes, with `vocab` tokens, and `model`, the one built from `now`: the same comparison as
// checkpoint saving), or a setting of the data stream and optimizer trajectory (data.tokenizer,
// data.batching, data.val_fraction, train.seed, and train.seq_len as used). The global batch
// (G = world x batch_size x grad_accum) is checked by the trainer against the checkpoint's
// global_batch_rows: any split of the same G resumes.
void check_resumable(const Config& now, const nn::ModelConfig& model, const Config& then, int64_t vocab,
                     const std::string& ckpt);

// Applies train.threads (0 = leave OpenMP's default) to the calling thread (omp_set_num_threads).
void apply_thread_setting(const Config& cfg);

}  // namespace qkv::train
