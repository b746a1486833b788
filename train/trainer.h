// The training loop: batches -> forward -> cross-entropy -> backward (gradient accumulation) ->
// global-norm clipping -> AdamW at the scheduled lr; periodic validation, JSON-lines metrics,
// a progress line on stderr, atomic checkpoints (every checkpoint_interval and at the end,
// keep_last of them plus best.h5). Non-finite gradients skip the step (counted); after
// train.max_bad_steps in a row the run stops with an error.
//
// One run per directory: train.out_dir belongs to the run whose files are in it (metrics.jsonl,
// best.h5, ckpt_<step>.h5, loss.svg). A run started without --resume refuses a directory holding
// them unless TrainOptions::overwrite (--overwrite), which removes them first; so does a --resume
// from a checkpoint in another directory. A --resume from a checkpoint in out_dir continues the
// run there: the temporaries a killed writer left are removed and metrics.jsonl loses its rows
// past the checkpoint's step, so the directory ends as an uninterrupted run's would.
// While a run writes to train.out_dir it holds an exclusive lock on
// OUT_DIR/train.lock (flock, rank 0 of a data-parallel job only: the rank that writes); a second
// run on the same directory is refused, naming the holder's pid. The kernel releases the lock
// when its process ends, even by kill -9, so no stale lock ever needs removing.
//
// --resume refuses a checkpoint whose run differs in anything that changes the computation (the
// model, tokenizer, batching, seed, train.seq_len, data.val_fraction, the global batch of G =
// world x batch_size x grad_accum rows unless change_global_batch) or
// whose corpus differs (CorpusFingerprint, train/checkpoint.h; a checkpoint without one gets a
// warning). A checkpoint already at or past train.max_steps trains nothing: the summary reports
// its step and file with nothing_to_do set, and out_dir is not touched.
//
// Every random draw (init, dropout, batches) is a pure function of (seed, step), so --resume
// continues bitwise-identically to a run that never stopped.
//
// Layering: the loop (run_training) and one step (train_step in trainer.cpp: forward, loss,
// backward, clip, update) live here; data parallelism is below, in distributed/ (gradient
// averaging, ZeRO-1 slices), and never sees the optimizer type; the run log (metrics + progress
// line) is train/run_log.h.
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "distributed/data_parallel.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace qkv::train {

struct TrainOptions {
  std::string resume;      // continue this checkpoint's run exactly
  std::string init_from;   // start a new run from this checkpoint's weights
  bool overwrite = false;  // a fresh run may replace the run files already in train.out_dir
  // --resume may continue with another global batch (G = world x batch_size x grad_accum) than the
  // checkpoint's: the rows from then on are those of the new G (--change-global-batch).
  bool change_global_batch = false;
  bool progress = true;  // progress line with ETA on stderr
  // Called on every rank just before each step runs, with the step about to run (0-based: the
  // number of steps done). Tests use it to inject faults (a rank that dies mid-run).
  std::function<void(int64_t step)> before_step;
  // Called on rank 0 after each metrics line is written (train/run_log.h), with that line's
  // object (step, loss, lr, tokens_per_s, ...). Returning false stops the run after that step:
  // its checkpoint is written (as at the last step, without the final validation) and the
  // summary says `stopped`. Under data parallelism set it on every rank (the ranks agree on
  // stopping through one sum per logged step); other ranks' calls are not made.
  std::function<bool(const nlohmann::json& metrics)> on_log;
};

struct TrainSummary {
  int64_t step = 0;
  double loss = 0, val_loss = NAN, best_val_loss = NAN;
  std::string checkpoint;  // the last checkpoint written
  double seconds = 0;
  int64_t skipped_steps = 0;
  double tokens_per_s = 0;
  bool nothing_to_do = false;  // --resume from a checkpoint at step >= train.max_steps
  bool stopped = false;        // TrainOptions::on_log returned false before train.max_steps
};

// The lock file every run holds in its out_dir (above).
inline constexpr const char* kRunLockFile = "train.lock";

TrainSummary run_training(const Config& cfg, const TrainOptions& opts);

// train.cuda_mma for a scope (bf16 attention on CUDA on the tensor-core kernels or not; the
// dispatch reads a process-wide switch), then the previous state back. It only narrows: a process
// that turned the kernels off (a test pass over the float32 kernels) keeps them off. run_training
// and the training benchmark hold one for their run.
class TensorCoreAttention {
 public:
  explicit TensorCoreAttention(bool on);
  ~TensorCoreAttention();
  TensorCoreAttention(const TensorCoreAttention&) = delete;
  TensorCoreAttention& operator=(const TensorCoreAttention&) = delete;

 private:
  [[maybe_unused]] bool previous_ = true;
};

// The optimizer state of a data-parallel run (`opt` is built over dp.optimizer_params()), as a
// checkpoint holds it: in full, whatever train.zero.
// full_optimizer_state: collective. Replicated: `opt` itself (not owned). ZeRO-1: a full AdamW
// over dp.params() with the moments gathered to rank 0, and null on the other ranks.
std::shared_ptr<const AdamW> full_optimizer_state(dist::DataParallel& dp, const AdamW& opt);
// Loads the checkpoint's full state into `opt`; in ZeRO-1 mode every rank keeps its slice.
void load_optimizer_state(const std::string& path, dist::DataParallel& dp, AdamW& opt);

}  // namespace qkv::train
