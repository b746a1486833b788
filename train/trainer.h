// The training loop: batches -> forward -> cross-entropy -> backward (gradient accumulation) ->
// global-norm clipping -> AdamW at the scheduled lr; periodic validation, JSON-lines metrics,
// a progress line on stderr, atomic checkpoints (every checkpoint_interval and at the end,
// keep_last of them plus best.h5). Non-finite gradients skip the step (counted); after
// train.max_bad_steps in a row the run stops with an error.
//
// One run per directory: while a run writes to train.out_dir it holds an exclusive lock on
// OUT_DIR/train.lock (flock, rank 0 of a data-parallel job only: the rank that writes); a second
// run on the same directory is refused, naming the holder's pid. The kernel releases the lock
// when its process ends, even by kill -9, so no stale lock ever needs removing.
//
// --resume refuses a checkpoint whose run differs in anything that changes the computation (the
// model, tokenizer, batching, seed, batch_size, grad_accum, train.seq_len, data.val_fraction) or
// whose corpus differs (CorpusFingerprint, train/checkpoint.h; a checkpoint without one gets a
// warning). A checkpoint already at or past train.max_steps trains nothing: the summary reports
// its step and file with nothing_to_do set, and out_dir is not touched.
//
// Every random draw (init, dropout, batches) is a pure function of (seed, step), so --resume
// continues bitwise-identically to a run that never stopped.
#pragma once
#include <cmath>
#include <string>

#include "train/config.h"

namespace qkv::train {

struct TrainOptions {
  std::string resume;     // continue this checkpoint's run exactly
  std::string init_from;  // start a new run from this checkpoint's weights
  bool progress = true;   // progress line with ETA on stderr
  bool plot = false;      // write out_dir/loss.svg at the end
};

struct TrainSummary {
  int64_t step = 0;
  double loss = 0, val_loss = NAN, best_val_loss = NAN;
  std::string checkpoint;  // the last checkpoint written
  double seconds = 0;
  int64_t skipped_steps = 0;
  double tokens_per_s = 0;
  bool nothing_to_do = false;  // --resume from a checkpoint at step >= train.max_steps
};

// The lock file every run holds in its out_dir (above).
inline constexpr const char* kRunLockFile = "train.lock";

TrainSummary run_training(const Config& cfg, const TrainOptions& opts);

}  // namespace qkv::train
