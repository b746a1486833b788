// Data parallelism for the training loop: gradient averaging in buckets over a flat buffer, and
// the slicing of the optimizer's work, replicated (train.zero = 0) or with its moments sharded
// (train.zero = 1, ZeRO stage 1). With one rank every call reduces to what the single-process loop
// always did.
//
// Layering. distributed/ depends on autograd/ and tensor/ only. It does not own the optimizer: it
// hands the caller the parameters this rank's optimizer must update (optimizer_params()); the
// caller builds its optimizer over them and runs the update itself, then calls gather_params().
// For checkpoints it moves per-element optimizer state (tensors shaped like the parameters,
// AdamW's m and v) between the slices and a full copy on rank 0 (gather_state / scatter_state).
//
// Flat layout. The parameters, in model order, are laid end to end in one float range:
// parameter k owns [offset(k), offset(k) + numel(k)). The gradient buffer has that layout; each
// parameter's .grad is a view of its part, so backward accumulates straight into the buffer and
// the all-reduce needs no packing copy.
//
// Buckets. The range is cut into buckets of bucket_bytes (4 MiB by default; the last one
// shorter), independent of parameter boundaries. Each bucket is all-reduced once per step, then
// everything is scaled by 1/world: the same calls, same sizes, same order every step, which keeps
// the reduction order fixed and a run bitwise-reproducible.
//
// Overlap. During the step's last backward (arm_overlap()), every parameter's gradient hook
// (autograd's post-accumulate hook: its .grad is final for the step) counts down the buckets it
// touches. Buckets are started (non-blocking all-reduce) in a fixed order, last bucket first —
// backward produces the last layers' gradients first — each as soon as it and every bucket before
// it in that order are complete; reduce_grads() starts what is left in the same order and waits.
// A bucket's sum does not depend on when it was started, so overlap changes no bits (with
// train.dp_overlap = false every bucket is reduced after backward, in the same order).
//
// ZeRO-1. Rank r owns the slice shard_range(total, r, world) of the flat range. Its optimizer
// holds moments only for that slice: optimizer_params() is one OptimParam per parameter piece
// inside it, a 1-D view of the parameter whose .grad is the matching view of the reduced gradient
// buffer. After the update gather_params() all-gathers the slices bucket by bucket into every
// rank's parameters. AdamW is element-wise, so with the same reduced gradients ZeRO-1 gives the
// same bits as the replicated optimizer; only the moments' memory (and the time to update them)
// is divided by world.
//
// Row tree (DataParallelOptions::tree_rows > 0, train.numerics = "invariant"). The caller runs
// each row of its tree_rows rows alone (forward and backward: one leaf gradient in the flat buffer)
// and hands it over with push_row(g), g its index in the global batch; reduce_grads() then sums
// the leaves of every rank in one binary tree of g (distributed/row_tree.h): each rank's maximal
// aligned blocks are all-gathered bucket by bucket and merged in row order by every rank alike.
// The result is the SUM over the global batch's rows (the loss is already divided by the global
// target count), bitwise the same for every split of the G rows into ranks, micro-batches and
// batch rows, on any thread count. It is used on one process too (then nothing is sent).
//
// Checkpoints hold the full optimizer state either way: in ZeRO mode the moments are gathered to
// rank 0 (bucket by bucket, gather_state) into a full optimizer just for the save. A checkpoint
// therefore resumes under any world size and either zero setting (bitwise only under the same
// world size).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/optim_param.h"
#include "distributed/distributed.h"
#include "distributed/row_tree.h"
#include "tensor/tensor.h"

namespace qkv::dist {

using autograd::OptimParam;

constexpr int64_t kDefaultBucketBytes = int64_t{4} << 20;

struct DataParallelOptions {
  int64_t zero = 0;                            // 0: replicated optimizer; 1: moments sharded
  int64_t bucket_bytes = kDefaultBucketBytes;  // per all-reduce (train.dp_bucket_kb)
  bool overlap = true;                         // all-reduce during the last backward (train.dp_overlap)
  // For parameters on a GPU: the communicator whose float all-reduces take device pointers
  // (distributed/nccl.h); the gradient buffer then lives on the device. Null: `comm` (host memory).
  Communicator* gradient_comm = nullptr;
  // > 0: the row tree (above) over this many rows per rank per step, the same on every rank.
  int64_t tree_rows = 0;
};

// Rank r's ZeRO slice [lo, hi) of a flat range of `total` elements: near-equal parts whose inner
// boundaries are multiples of 16 elements (64 bytes, a cache line).
std::pair<int64_t, int64_t> shard_range(int64_t total, int rank, int world);
// Bucket boundaries 0 = b_0 < b_1 < ... < b_K = total with b_{k+1} - b_k <= max(1, elems).
std::vector<int64_t> bucket_bounds(int64_t total, int64_t elems);
// For each rank, the length of [a, b) ∩ its shard (the counts of a v-collective over one bucket).
std::vector<int64_t> shard_counts(int64_t a, int64_t b, int64_t total, int world);

// The pieces of parameter tensors inside [lo, hi) of the flat layout of `params`: one OptimParam
// per parameter that overlaps, a contiguous 1-D view of that parameter's elements (same name and
// decay flag), in model order.
std::vector<OptimParam> slice_params(const std::vector<OptimParam>& params, int64_t lo, int64_t hi);

// An optimizer's per-element state, [parameter][state tensor], each tensor shaped like its
// parameter (AdamW: m and v), in the order of the parameters the optimizer was built on.
// Handles onto the optimizer's own tensors: writing through them changes its state.
using ElementState = std::vector<std::vector<Tensor>>;

class DataParallel {
 public:
  // Throws for zero other than 0 or 1 (naming train.zero).
  DataParallel(Communicator& comm, std::vector<OptimParam> params, DataParallelOptions opts);
  ~DataParallel();  // removes the gradient hooks
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Communicator& comm() const { return comm_; }
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world(); }
  bool distributed() const { return comm_.world() > 1; }
  bool sharded() const { return sharded_; }

  // Every parameter, in model order (what a full optimizer for a checkpoint is built over).
  const std::vector<OptimParam>& params() const { return params_; }
  // What this rank's optimizer updates: params() (replicated), or with ZeRO-1 the pieces of them
  // inside this rank's slice, their .grad bound once for the run to views of the reduced buffer.
  const std::vector<OptimParam>& optimizer_params() const { return sharded_ ? slice_ : params_; }

  // Start of a step. One rank: every .grad undefined (autograd::zero_grad). Several (or a row
  // tree): every .grad bound to its view of the zero-filled flat gradient buffer.
  void zero_grads();
  // Row tree: the parameters' .grad hold row g's gradient alone; it joins the tree and every .grad
  // is made undefined for the next row. Rows come in increasing consecutive order from this
  // rank's first.
  void push_row(int64_t g);
  // The same with row g's gradient in `sink` (a row run on a worker thread); .grad is untouched.
  void push_row(int64_t g, const autograd::GradSink& sink);
  bool row_tree() const { return tree_ != nullptr; }
  // True when every .grad stays bound to the flat buffer between steps.
  bool flat_grads() const { return grad_flat_.defined(); }
  // Call before the step's last backward: buckets are sent while it runs (no-op for one rank or
  // with overlap off).
  void arm_overlap();
  // After the step's last backward: the bucketed all-reduce, then scaling by 1/world, so every
  // rank holds the mean gradient (bitwise the same on all ranks). No-op for one rank.
  // Row tree: the tree's sum of every rank's rows into the flat buffer, on one rank too.
  void reduce_grads();
  // After the optimizer's update: in ZeRO mode the parameter all-gather (every rank's updated
  // slice into every rank's parameters); otherwise nothing. Collective.
  void gather_params();

  // ZeRO mode only. gather_state (collective): the first `kinds` state tensors of `mine` (the
  // optimizer over optimizer_params()) are gathered into `full` (over params()) on rank 0; `full`
  // is ignored (may be null) elsewhere. `kinds` is the same on every rank, even one whose slice is
  // empty. scatter_state (local): this rank's slice of `full` is copied into `mine`.
  void gather_state(const ElementState& mine, const ElementState* full, size_t kinds);
  void scatter_state(const ElementState& full, const ElementState& mine) const;

  // FNV-1a over the parameters' bytes; the trainer compares it across ranks.
  uint64_t parameter_hash() const;

  int64_t total_elements() const { return total_; }
  int64_t bucket_count() const { return static_cast<int64_t>(bounds_.size()) - 1; }
  // Bytes each rank hands to all-reduce per step (0 for one rank), and, in ZeRO mode, to the
  // parameter all-gather.
  int64_t allreduce_bytes_per_step() const { return distributed() ? total_ * 4 : 0; }
  int64_t allgather_bytes_per_step() const { return sharded() ? total_ * 4 : 0; }
  bool overlaps() const { return overlap_; }
  // Moment elements (m and v each) this rank's optimizer holds.
  int64_t moment_elements() const { return sharded_ ? hi_ - lo_ : total_; }
  // One line for the log: ranks, backend, parameters, buckets, bytes per step, ZeRO slice.
  std::string describe() const;
  // Wall time spent in collectives (gradient all-reduce, parameter all-gather) since the last
  // call, in seconds; resets the count.
  double take_comm_seconds();

 private:
  // Calls f(k, begin_in_param, flat_begin, n) for every piece of parameter k inside [a, b).
  template <class F>
  void for_each_piece(int64_t a, int64_t b, F&& f) const;
  void on_grad_ready(size_t k);                                                  // parameter k's gradient hook
  void push_row_grads(int64_t g, const std::function<Tensor(size_t)>& grad_of);  // grad_of(k): param k's
  void start_ready_buckets(bool all);  // starts buckets in issue order while ready (or all)
  void zero_flat();
  void reduce_tree();

  Communicator& comm_;
  Communicator& grad_comm_;  // the gradient buckets' all-reduce (comm_, or NCCL on a GPU)
  std::vector<OptimParam> params_;
  std::vector<OptimParam> slice_;  // ZeRO-1: this rank's pieces of params_
  bool sharded_ = false;           // ZeRO-1 with several ranks
  std::vector<int64_t> offset_;    // flat offset of each parameter; offset_.back() == total_
  int64_t total_ = 0;
  std::vector<int64_t> bounds_;     // bucket boundaries
  Tensor grad_flat_;                // float32 [total] (several ranks only)
  std::vector<Tensor> grad_views_;  // parameter-shaped views of grad_flat_
  int64_t lo_ = 0, hi_ = 0;         // this rank's slice of the flat range
  std::vector<float> staging_;      // one bucket (parameter all-gather, checkpoint gather)
  double comm_seconds_ = 0;
  bool overlap_ = false;                          // several ranks and DataParallelOptions::overlap
  bool armed_ = false;                            // inside the step's last backward
  std::vector<std::vector<int64_t>> buckets_of_;  // per parameter: the buckets it touches
  std::vector<int64_t> pieces_in_;                // per bucket: how many parameters touch it
  std::vector<int64_t> waiting_;                  // per bucket: parameters not yet final this step
  int64_t next_start_ = -1;                       // next bucket to start (issue order: K-1 down to 0)
  std::unique_ptr<RowTree> tree_;                 // row tree: this rank's rows of the step
  int64_t tree_rows_ = 0;                         // row tree: rows per rank per step
  int64_t rows_pushed_ = 0;                       // row tree: this step's rows so far
  Tensor tree_staging_;                           // row tree: every rank's blocks of one bucket
  std::vector<RowTree::Piece> pending_leaf_;      // row tree: an even row waiting for the next
  std::vector<Tensor> pending_held_;              //   and its gradients
  int64_t pending_row_ = -1;
};

// The dropout key of a rank: the run's seed on rank 0, a different key on every other rank (rows
// on different ranks must not share dropout masks).
uint64_t rank_dropout_seed(uint64_t seed, int rank);
// The dropout key of row g of the global batch under the row tree: whichever rank or micro-batch
// runs the row, it draws the same masks.
uint64_t row_dropout_seed(uint64_t seed, int64_t g);

}  // namespace qkv::dist
