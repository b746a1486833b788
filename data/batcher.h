// Batchers: token splits -> (x, y) training batches. Seeded and resumable: everything they
// remember is a BatcherState of a few integers; restore(state()) in a new process continues with
// bitwise-identical batches. Randomness comes from Philox keyed by (seed, counter), never from a
// stateful engine, so no generator state has to be saved.
//
// Legend: B = batch rows on this rank, T = block_size, G = world · B rows of the global batch.
//
// Modes
//   random_windows  nanoGPT-style LM pre-training: row g of step s starts at offset
//                   o = philox(seed; s, g) mod (n - T), x = tokens[o : o+T], y = tokens[o+1 : o+T+1].
//                   Returns x, y.
//   padded_docs     one document per row (documents of >= 2 tokens), cut to its first T+1 tokens;
//                   x = doc[0 : L-1], y = doc[1 : L] with L = min(len, T+1), padded to T on the
//                   right or the left. Returns x (pad_id in padding), y (-100 in padding),
//                   key_padding (true = real token), positions (0, 1, ... over the real tokens,
//                   so under left padding the first real token has position 0; 0 in padding).
//   packed_docs     documents laid end to end and cut into rows of T inputs (+1 look-ahead
//                   target; the next row starts at that target, so every adjacent pair inside
//                   a document is trained exactly once per epoch). Returns x, y (-100 where the
//                   target belongs to another segment), segment_ids (index of the token's piece
//                   within its row: attention is block-diagonal causal over equal ids) and
//                   positions restarting at 0 at each piece. A document continued from the
//                   previous row starts a new piece at position 0: it cannot see its beginning.
//   Document order (padded/packed) is a Philox permutation per epoch (shuffle) or file order.
//
// Global batch. A step trains on G = world · B · micro_batches rows, numbered g = 0 .. G-1; row g
// is a function of (seed, state, g) only. Rank r owns rows [r·R, (r+1)·R), R = B · micro_batches,
// and its k-th micro-batch (k-th next() of the step) rows [r·R + k·B, r·R + (k+1)·B). Every rank
// advances the same state by the whole global batch, so each row is exactly the one a single
// process with batch size G would produce, whatever the split into ranks and micro-batches
// (what train.numerics = "invariant" trains on bit for bit; docs/distributed.md).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"
#include "tensor/choice.h"
#include "tensor/tensor.h"

namespace qkv {

constexpr int64_t kIgnoreIndex = -100;

// Each mode's and padding side's spellings, once: the config (data.batching, data.padding_side;
// train/config_schema.h) and checkpoints (/data mode) accept exactly these.
enum class BatchMode { random_windows, padded_docs, packed_docs };
inline constexpr std::array kBatchModes = {Choice<BatchMode>{"random_windows", BatchMode::random_windows},
                                           Choice<BatchMode>{"padded_docs", BatchMode::padded_docs},
                                           Choice<BatchMode>{"packed_docs", BatchMode::packed_docs}};
BatchMode parse_batch_mode(std::string_view name);  // a name in kBatchModes
const char* batch_mode_name(BatchMode mode);

enum class Padding { right, left };
inline constexpr std::array kPaddingSides = {Choice<Padding>{"right", Padding::right},
                                             Choice<Padding>{"left", Padding::left}};
Padding parse_padding(std::string_view name);  // a name in kPaddingSides

struct BatcherOptions {
  BatchMode mode = BatchMode::random_windows;
  int64_t batch_size = 12;    // B, rows on this rank per next()
  int64_t micro_batches = 1;  // next() calls per step (train.grad_accum)
  int64_t block_size = 64;    // T
  uint64_t seed = 1337;
  int rank = 0;
  int world = 1;
  Padding padding = Padding::right;  // padded_docs
  bool shuffle = true;               // padded/packed: new document order each epoch
  int64_t pad_id = 0;                // padded_docs: input id at padded positions (they are masked)
};

struct Batch {
  Tensor x;               // int64 [B, T]
  Tensor y;               // int64 [B, T], kIgnoreIndex where no loss is taken
  Tensor key_padding;     // bool [B, T], padded_docs only: true = real token
  Tensor positions;       // int64 [B, T], padded_docs / packed_docs only
  Tensor segment_ids;     // int32 [B, T], packed_docs only
  int64_t n_targets = 0;  // entries of y that count
  int64_t step = 0;       // the global batch (BatcherState::step before it was drawn)
  int64_t first_row = 0;  // global row index g of row 0 within that global batch
};

// Everything a batcher remembers. A checkpoint stores to_array() (int64 [5]).
struct BatcherState {
  uint64_t seed = 0;
  int64_t step = 0;   // global batches (steps) begun so far
  int64_t epoch = 0;  // padded/packed: passes over the documents begun
  int64_t doc = 0;    // padded/packed: index in this epoch's order of the next document
  int64_t token = 0;  // packed: tokens of that document already consumed
  std::array<int64_t, 5> to_array() const;
  static BatcherState from_array(std::span<const int64_t> a);  // checks the length
  bool operator==(const BatcherState&) const = default;
};

class Batcher {
 public:
  // Checks the split is long enough: random_windows and packed_docs need T+1 tokens,
  // padded_docs a document of >= 2 tokens. Errors name the split (file) and the sizes.
  Batcher(std::shared_ptr<const TokenSplit> split, const BatcherOptions& opts);

  // The next micro-batch of this rank (above). The first of a step draws the rank's R rows.
  Batch next();
  // Between steps (after a multiple of micro_batches next() calls): what restore() continues from.
  BatcherState state() const { return state_; }
  void restore(const BatcherState& s);  // the seed must match the options'
  const BatcherOptions& options() const { return opts_; }
  const TokenSplit& split() const { return *split_; }

 private:
  // This rank's R rows of the next global batch; advance the state past all G rows.
  Batch draw_random_windows();
  Batch draw_padded_docs();
  Batch draw_packed_docs();
  // The document at `state_.doc` of the current epoch's order, advancing epochs as needed.
  int64_t current_doc(BatcherState& s);
  void build_order(int64_t epoch);

  std::shared_ptr<const TokenSplit> split_;
  BatcherOptions opts_;
  BatcherState state_;
  std::vector<int64_t> eligible_;  // documents this mode can use, in file order
  std::vector<int64_t> order_;     // eligible_ permuted for epoch order_epoch_
  int64_t order_epoch_ = -1;
  Batch step_rows_;    // this rank's rows of the current step
  int64_t micro_ = 0;  // next micro-batch of the step
};

// Consecutive non-overlapping windows of T+1 tokens from the start (`qkv eval`): window w
// is tokens[w(T+1) : (w+1)(T+1)], x its first T tokens, y the last T; a final partial window is
// dropped. `tokens` must outlive the iterator.
class EvalWindows {
 public:
  // max_windows > 0 caps the count (periodic val evaluation); 0 scores every window.
  EvalWindows(std::span<const int32_t> tokens, int64_t block_size, std::string name, int64_t max_windows = 0);
  int64_t n_windows() const { return n_windows_; }
  int64_t n_targets() const { return n_windows_ * block_; }
  // Fills `out` with the next min(max_rows, remaining) windows as x, y int64 [rows, T];
  // returns false when all windows were given.
  bool next(int64_t max_rows, Batch& out);
  void reset() { next_ = 0; }

 private:
  std::span<const int32_t> tokens_;
  int64_t block_;
  int64_t n_windows_;
  int64_t next_ = 0;
};

}  // namespace qkv
