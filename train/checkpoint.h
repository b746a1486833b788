// Checkpoints: one HDF5 file readable by h5py.
//   root attributes: format = "qkv-checkpoint", format_version, config (resolved TOML; a
//                    block_sparse layout file as its table, "rows:..."), step,
//                    tokens_seen; config_fnv1a64 (checksum of the config text, which HDF5 keeps in
//                    its unchecksummed global heap)
//   /model/<name>                 float32, Hugging Face names and shapes (gpt2: Conv1D weights
//                                 c_attn/c_proj/c_fc stored [in, out]; llama: [out, in]);
//                                 attr parameter_order (the names in model order, one a line)
//   /optimizer/<name>/{exp_avg, exp_avg_sq}   (same layout as /model/<name>), attr step
//   /rng                          the RNG seeds/counters the run draws from
//   /data                         the train batcher's state (int64 [5]) and mode; attributes
//                                 corpus_tokens, corpus_fnv1a64 (CorpusFingerprint; absent in
//                                 checkpoints written before qkv stored them)
//   /tokenizer                    everything needed to encode/decode (data/tokenizer.h)
//   /train                        best_val_loss, consecutive and total skipped steps
// Writes are atomic (temporary file, flush, fsync, rename); loading verifies integrity and names
// the first problem found. Every object must be one listed here, stored in the file itself under
// one name: a soft or external link, a second hard link to an object, or an object not listed
// is refused by name.
#pragma once
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "data/tokenizer.h"
#include "nn/transformer.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace qkv::train {

constexpr int64_t kCheckpointFormatVersion = 1;

// What a run trains on, so --resume can tell a different corpus that happens to tokenize with
// the same vocabulary: the number of tokens (train then val split) and the FNV-1a 64 hash of
// their int32 ids' bytes in that order (train/session.h computes it).
struct CorpusFingerprint {
  int64_t tokens = 0;
  uint64_t fnv1a64 = 0;
  bool operator==(const CorpusFingerprint&) const = default;
};

struct TrainState {
  int64_t step = 0;  // optimizer steps completed
  int64_t tokens_seen = 0;
  uint64_t seed = 0;  // the run's Philox key (init, dropout, batches)
  BatcherState data;
  BatchMode batch_mode = BatchMode::random_windows;  // stored as its kBatchModes spelling
  double best_val_loss = INFINITY;
  int64_t bad_steps_in_a_row = 0, skipped_steps = 0;
  std::optional<CorpusFingerprint> corpus;  // unset: not recorded (older checkpoint, or a test)
  // G, rows per step: world x batch_size x grad_accum. 0: not recorded (older checkpoint).
  int64_t global_batch_rows = 0;
};

// Saves model weights, optimizer moments (when `opt` is given), state and tokenizer.
void save_checkpoint(const std::string& path, const Config& cfg, const nn::DecoderModel& model, const AdamW* opt,
                     const TrainState& state, const Tokenizer& tok);

struct CheckpointMeta {
  std::string path;
  int64_t format_version = 0;
  Config config;  // parsed back from the stored TOML
  TrainState state;
  std::unique_ptr<Tokenizer> tokenizer;
  bool has_optimizer = false;
};
// Reads and verifies everything but the tensors' values (format, version, config, tokenizer).
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Loads /model into `model`: every parameter must be present with its exact shape; extra or
// missing names are errors naming the first one. take_buffers: CPU float32 parameters take the
// loaded buffers over instead of being copied into (one copy of the weights in memory, not two);
// only for a model nothing holds views of (inference, before anything ran).
void load_model_weights(const std::string& path, nn::DecoderModel& model, bool take_buffers = false);
// Loads /optimizer into `opt` (names and shapes must match) and its step count.
void load_optimizer_state(const std::string& path, AdamW& opt);

// Whether `path` would load, asked the loaders' own way without loading a value into a model:
// read_checkpoint_meta, the model its config describes (build_model, as load_for_inference and the
// trainer build it), /model against that model (load_model_weights' names, types, shapes and
// config-vs-tensors checks) and, when the file has /optimizer, the AdamW moments against the same
// parameters (load_optimizer_state's). Throws qkv::Error naming the first problem. The values
// themselves (checksums, finiteness) are verify_checkpoint_data's. `qkv inspect` runs both.
struct CheckpointLoads {
  bool inference = true;  // sample, eval, export, --init-from
  bool resume = false;    // --resume: the optimizer state is there and fits too
};
CheckpointLoads check_checkpoint_loads(const std::string& path);

// GPT-2's Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), which Hugging Face
// and qkv checkpoints store [in, out]; qkv's Linear is [out, in].
bool is_conv1d_weight(nn::Family family, const std::string& name);

// The stored (Hugging Face) name and layout of each model parameter, in the model's order.
struct StoredTensor {
  std::string name;
  Shape shape;
};
std::vector<StoredTensor> list_model_tensors(const std::string& path);

// Reads every dataset of the checkpoint whole: each must pass its checksum (Fletcher-32 for
// numbers, fnv1a64 for strings), and the /model and /optimizer tensors must be finite. Throws
// naming the first dataset that fails; returns how many were verified. (`qkv inspect` runs it;
// loading checks the same for what it reads.)
int64_t verify_checkpoint_data(const std::string& path);

// Keeps the newest `keep_last` files named ckpt_<step>.h5 in `dir` (best.h5 is never removed).
void prune_checkpoints(const std::string& dir, int64_t keep_last);
// The step of a checkpoint file named ckpt_<digits>.h5 (exactly), else nullopt.
std::optional<int64_t> checkpoint_step(const std::string& file_name);

}  // namespace qkv::train
