// Gradient averaging and the slicing of the optimizer's work for data-parallel training; the
// design is in data_parallel.h.
//
// Per step with N ranks and P parameters (float32):
//   reduce_grads   ceil(4P / bucket_bytes) in-place all-reduces, then one scaling pass (x 1/N)
//   update, zero 0 (the caller's optimizer) over all P elements, identical on every rank
//   update, zero 1 over this rank's ~P/N elements; then gather_params, per bucket: copy this
//                  rank's updated elements into a staging buffer, all-gather (v: shards need not
//                  align with buckets), copy the bucket back into the parameters
// The scaling by 1/N is exact for N a power of two, and in any case the same on every rank.
#include "distributed/data_parallel.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "autograd/engine.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace qkv::dist {

std::pair<int64_t, int64_t> shard_range(int64_t total, int rank, int world) {
  QKV_CHECK(world >= 1 && rank >= 0 && rank < world, "[zero] rank ", rank, " of ", world);
  auto cut = [&](int r) {
    return r == 0 ? 0 : r == world ? total : std::min(total, (total * r / world + 15) / 16 * 16);
  };
  return {cut(rank), cut(rank + 1)};
}

std::vector<int64_t> bucket_bounds(int64_t total, int64_t elems) {
  const int64_t step = std::max<int64_t>(1, elems);
  std::vector<int64_t> b{0};
  for (int64_t at = 0; at < total;) {
    at = std::min(total, at + step);
    b.push_back(at);
  }
  return b;
}

std::vector<int64_t> shard_counts(int64_t a, int64_t b, int64_t total, int world) {
  std::vector<int64_t> c(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto [lo, hi] = shard_range(total, r, world);
    c[static_cast<size_t>(r)] = std::max<int64_t>(0, std::min(b, hi) - std::max(a, lo));
  }
  return c;
}

std::vector<OptimParam> slice_params(const std::vector<OptimParam>& params, int64_t lo, int64_t hi) {
  std::vector<OptimParam> out;
  int64_t at = 0;
  for (const OptimParam& p : params) {
    const int64_t n = p.param.numel(), a = std::max(lo, at), b = std::min(hi, at + n);
    if (a < b) out.push_back({p.name, p.param.flatten().narrow(0, a - at, b - a), p.decay});
    at += n;
  }
  return out;
}

namespace {

// FNV-1a, 64-bit (the same function as h5::fnv1a64; distributed/ does not depend on data/).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Copies n floats; big copies are split over the OpenMP threads.
void copy_floats(float* dst, const float* src, int64_t n) {
  if (dst == src || n == 0) return;
  const bool parallel = n >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace

template <class F>
void DataParallel::for_each_piece(int64_t a, int64_t b, F&& f) const {
  // offset_ is sorted: start at the last parameter beginning at or before a.
  size_t k = static_cast<size_t>(std::upper_bound(offset_.begin(), offset_.end() - 1, a) - offset_.begin());
  k = k == 0 ? 0 : k - 1;
  for (; k < params_.size() && offset_[k] < b; ++k) {
    const int64_t lo = std::max(a, offset_[k]), hi = std::min(b, offset_[k + 1]);
    if (lo < hi) f(k, lo - offset_[k], lo, hi - lo);
  }
}

DataParallel::DataParallel(Communicator& comm, std::vector<OptimParam> params, DataParallelOptions opts)
    : comm_(comm), grad_comm_(opts.gradient_comm ? *opts.gradient_comm : comm), params_(std::move(params)) {
  QKV_CHECK(opts.zero == 0 || opts.zero == 1, "train.zero = ", opts.zero,
            " is unsupported; supported stages: 0 (replicated optimizer) or 1 (optimizer state sharded across ranks)");
  offset_.reserve(params_.size() + 1);
  for (const OptimParam& p : params_) {
    offset_.push_back(total_);
    total_ += p.param.numel();
  }
  offset_.push_back(total_);
  const int64_t bucket_elems = std::max<int64_t>(16, opts.bucket_bytes / 4);
  bounds_ = bucket_bounds(total_, bucket_elems);
  std::tie(lo_, hi_) = shard_range(total_, comm_.rank(), comm_.world());

  const Device device = params_.empty() ? Device::cpu : params_[0].param.device();
  if (distributed() && device != Device::cpu) {
    QKV_CHECK(opts.gradient_comm != nullptr, "[data_parallel] parameters on ", device_name(device),
              " need a device communicator (NCCL) for the gradient all-reduce");
    QKV_CHECK(opts.zero == 0,
              "train.zero = 1 is built for CPU parameters only; use train.zero = 0 with train.device = \"",
              device_name(device), "\"");
  }
  if (opts.tree_rows > 0) {
    tree_ = std::make_unique<RowTree>(total_, device);
    tree_rows_ = opts.tree_rows;
  }
  if (distributed() || tree_) {
    grad_flat_ = Tensor::empty({total_}, DType::f32, device);
    grad_views_.reserve(params_.size());
    for (size_t k = 0; k < params_.size(); ++k)
      grad_views_.push_back(grad_flat_.narrow(0, offset_[k], params_[k].param.numel()).view(params_[k].param.shape()));
  }
  overlap_ = distributed() && opts.overlap && !tree_;
  if (overlap_) {
    buckets_of_.resize(params_.size());
    pieces_in_.assign(static_cast<size_t>(bucket_count()), 0);
    for (int64_t b = 0; b < bucket_count(); ++b)
      for_each_piece(bounds_[b], bounds_[b + 1], [&](size_t k, int64_t, int64_t, int64_t) {
        buckets_of_[k].push_back(b);
        pieces_in_[b]++;
      });
    for (size_t k = 0; k < params_.size(); ++k)
      params_[k].param.autograd_meta().post_accumulate_hook = [this, k] { on_grad_ready(k); };
  }
  if (distributed() && opts.zero == 1) {
    sharded_ = true;
    slice_ = slice_params(params_, lo_, hi_);
    // Each slice's gradient is the matching slice of the reduced buffer, bound once for the run.
    for_each_piece(lo_, hi_, [&, i = size_t{0}](size_t k, int64_t in_param, int64_t, int64_t n) mutable {
      slice_[i++].param.set_grad(grad_views_[k].flatten().narrow(0, in_param, n));
    });
    staging_.resize(static_cast<size_t>(std::min<int64_t>(total_, bucket_elems)));
  }
}

DataParallel::~DataParallel() {
  if (!overlap_) return;
  for (const OptimParam& p : params_)
    if (p.param.impl()->autograd) p.param.impl()->autograd->post_accumulate_hook = nullptr;
}

void DataParallel::arm_overlap() {
  if (!overlap_) return;
  waiting_ = pieces_in_;
  next_start_ = bucket_count() - 1;
  armed_ = true;
}

void DataParallel::on_grad_ready(size_t k) {
  if (!armed_) return;  // an earlier micro-batch's backward: its gradients are not final
  for (int64_t b : buckets_of_[k]) waiting_[b]--;
  start_ready_buckets(false);
  grad_comm_.progress();
}

void DataParallel::start_ready_buckets(bool all) {
  const auto t0 = std::chrono::steady_clock::now();
  float* g = grad_flat_.data<float>();
  for (; next_start_ >= 0 && (all || waiting_[next_start_] == 0); --next_start_)
    grad_comm_.allreduce_sum_start(g + bounds_[next_start_], bounds_[next_start_ + 1] - bounds_[next_start_]);
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DataParallel::zero_flat() {
  if (grad_flat_.device() != Device::cpu) {
    fill_(grad_flat_, 0.0);
    return;
  }
  float* g = grad_flat_.data<float>();
  const bool parallel = total_ >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t i = 0; i < total_; ++i) g[i] = 0.0f;
}

void DataParallel::zero_grads() {
  if (tree_) {
    // Each row's backward writes fresh gradients (no zero fill); reduce_tree binds the views.
    tree_->clear();
    rows_pushed_ = 0;
    pending_leaf_.clear();
    pending_held_.clear();
  }
  if (!grad_flat_.defined() || tree_) {
    std::vector<Tensor> ps;
    ps.reserve(params_.size());
    for (const OptimParam& p : params_) ps.push_back(p.param);
    autograd::zero_grad(ps);
    return;
  }
  zero_flat();
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor handle = params_[k].param;  // a handle copy shares the autograd slot
    handle.set_grad(grad_views_[k]);
  }
}

void DataParallel::push_row(int64_t g) {
  push_row_grads(g, [&](size_t k) { return params_[k].param.grad(); });
  std::vector<Tensor> ps;
  ps.reserve(params_.size());
  for (const OptimParam& p : params_) ps.push_back(p.param);
  autograd::zero_grad(ps);  // the next row's backward starts afresh
}

void DataParallel::push_row(int64_t g, const autograd::GradSink& sink) {
  push_row_grads(g, [&](size_t k) { return sink.grad(params_[k].param); });
}

void DataParallel::push_row_grads(int64_t g, const std::function<Tensor(size_t)>& grad_of) {
  QKV_CHECK(tree_, "[data_parallel] push_row needs the row tree (DataParallelOptions::tree_rows)");
  QKV_CHECK(rows_pushed_ < tree_rows_, "[data_parallel] row ", g, " is one more than the ", tree_rows_,
            " rows per rank of a step");
  std::vector<RowTree::Piece> leaf;
  leaf.reserve(params_.size());
  std::vector<Tensor> held;  // the gradients, alive until pushed
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor grad = grad_of(k);
    const int64_t n = params_[k].param.numel();
    if (grad.defined()) {
      QKV_CHECK(grad.dtype() == DType::f32 && grad.device() == tree_->device() && grad.numel() == n,
                "[data_parallel] the gradient of ", params_[k].name, " is not a float32 ", device_name(tree_->device()),
                " tensor of ", n, " elements");
      grad = grad.contiguous();
      held.push_back(grad);
    }
    leaf.push_back({offset_[k], n, grad.defined() ? grad.data<float>() : nullptr});
  }
  if (!pending_held_.empty() || !pending_leaf_.empty()) {
    // Row g - 1 waited for this one: their node is written in one pass.
    QKV_CHECK(g == pending_row_ + 1, "[data_parallel] row ", g, " follows row ", pending_row_);
    tree_->push_pair(pending_leaf_, leaf, pending_row_);
    pending_leaf_.clear();
    pending_held_.clear();
  } else if (g % 2 == 0 && rows_pushed_ + 1 < tree_rows_) {
    // A left child whose sibling is this rank's next row: kept as it is until then.
    pending_leaf_ = std::move(leaf);
    pending_held_ = std::move(held);
    pending_row_ = g;
  } else {
    tree_->push(leaf, g);
  }
  ++rows_pushed_;
}

void DataParallel::reduce_tree() {
  QKV_CHECK(rows_pushed_ == tree_rows_, "[data_parallel] the step pushed ", rows_pushed_, " rows of ", tree_rows_);
  const int world = comm_.world();
  float* g = grad_flat_.data<float>();
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor handle = params_[k].param;  // a handle copy shares the autograd slot
    handle.set_grad(grad_views_[k]);
  }
  if (world == 1) {
    tree_->fold(g);
    return;
  }
  // Every rank's blocks (the same shapes on every rank: a function of its rows), bucket by bucket.
  std::vector<std::vector<RowBlock>> shapes;
  size_t blocks = 0;
  for (int r = 0; r < world; ++r) {
    shapes.push_back(block_shapes(r * tree_rows_, tree_rows_));
    blocks += shapes.back().size();
  }
  const std::vector<RowBlock>& mine = tree_->blocks();
  QKV_CHECK(mine.size() == shapes[static_cast<size_t>(comm_.rank())].size(),
            "[data_parallel] this rank's rows are not the ones of its part of the global batch");
  const int64_t longest = bounds_.size() > 1 ? bounds_[1] - bounds_[0] : 0;
  const int64_t staged = static_cast<int64_t>(blocks) * longest;
  if (!tree_staging_.defined() || tree_staging_.numel() < staged)
    tree_staging_ = Tensor::empty({staged}, DType::f32, tree_->device());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b + 1 < bounds_.size(); ++b) {
    const int64_t a = bounds_[b], len = bounds_[b + 1] - a;
    std::vector<int64_t> counts;
    int64_t at = 0, my_at = 0;
    for (int r = 0; r < world; ++r) {
      if (r == comm_.rank()) my_at = at;
      counts.push_back(static_cast<int64_t>(shapes[static_cast<size_t>(r)].size()) * len);
      at += counts.back();
    }
    float* stage = tree_staging_.data<float>();
    for (size_t j = 0; j < mine.size(); ++j) {
      float* to = stage + my_at + static_cast<int64_t>(j) * len;
      if (tree_->device() == Device::cpu) copy_floats(to, mine[j].data + a, len);
      else cuda::memcpy(to, mine[j].data + a, static_cast<size_t>(len) * sizeof(float), 2);
    }
    grad_comm_.gradient_allgatherv(stage, counts);
    std::vector<RowBlock> stack;
    int64_t slot = 0;
    for (const auto& rank_blocks : shapes)
      for (RowBlock blk : rank_blocks) {
        blk.data = stage + slot++ * len;
        push_block(stack, blk, len, nullptr, tree_->device());
      }
    fold_blocks(stack, len, g + a, tree_->device());
  }
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DataParallel::reduce_grads() {
  if (tree_) {
    reduce_tree();
    return;
  }
  if (!distributed()) return;
  // A .grad replaced by something other than our view (nobody should) would be silently skipped.
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor g = params_[k].param.grad();
    QKV_CHECK(g.defined() && g.raw_data() == grad_views_[k].raw_data(), "[data_parallel] the gradient of ",
              params_[k].name, " is not its view of the flat buffer (was zero_grads() called before backward?)");
  }
  float* g = grad_flat_.data<float>();
  if (armed_) {
    start_ready_buckets(/*all=*/true);  // buckets whose parameters got no gradient this step
    const auto t0 = std::chrono::steady_clock::now();
    grad_comm_.wait_all();
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    armed_ = false;
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = bucket_count() - 1; b >= 0; --b)
      grad_comm_.allreduce_sum(g + bounds_[b], bounds_[b + 1] - bounds_[b]);
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const float inv = 1.0f / static_cast<float>(comm_.world());
  if (grad_flat_.device() != Device::cpu) {
    mul_(grad_flat_, inv);
    return;
  }
  const bool parallel = total_ >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t i = 0; i < total_; ++i) g[i] *= inv;
}

void DataParallel::gather_params() {
  if (!sharded_) return;
  // All-gather the updated parameters, one bucket at a time through the staging buffer.
  const int world = comm_.world();
  for (size_t b = 0; b + 1 < bounds_.size(); ++b) {
    const int64_t a = bounds_[b], e = bounds_[b + 1];
    float* stage = staging_.data();
    for_each_piece(std::max(a, lo_), std::min(e, hi_), [&](size_t k, int64_t in_param, int64_t flat, int64_t n) {
      copy_floats(stage + (flat - a), params_[k].param.data<float>() + in_param, n);
    });
    const auto t0 = std::chrono::steady_clock::now();
    comm_.allgatherv(stage, shard_counts(a, e, total_, world));
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for_each_piece(a, e, [&](size_t k, int64_t in_param, int64_t flat, int64_t n) {
      copy_floats(params_[k].param.data<float>() + in_param, stage + (flat - a), n);
    });
  }
}

std::string DataParallel::describe() const {
  char buf[320];
  const std::string zero = sharded_ ? cat(", ZeRO-1: rank ", comm_.rank(), " keeps moments for ", hi_ - lo_,
                                          " elements [", lo_, ", ", hi_, ")")
                                    : "";
  if (tree_) {
    std::snprintf(buf, sizeof buf,
                  "data parallel: %d ranks (%s), %lld parameters, row tree over %lld rows per rank: every rank's "
                  "blocks all-gathered in %lld buckets after backward%s",
                  comm_.world(), comm_.backend(), static_cast<long long>(total_), static_cast<long long>(tree_rows_),
                  static_cast<long long>(bucket_count()), zero.c_str());
    return buf;
  }
  std::snprintf(buf, sizeof buf,
                "data parallel: %d ranks (%s), %lld parameters, all-reduce %.1f MB per step in %lld buckets (%s, %s)%s",
                comm_.world(), comm_.backend(), static_cast<long long>(total_), static_cast<double>(total_) * 4e-6,
                static_cast<long long>(bucket_count()), grad_comm_.backend(),
                overlap_ ? "during backward" : "after backward", zero.c_str());
  return buf;
}

double DataParallel::take_comm_seconds() {
  const double s = comm_seconds_;
  comm_seconds_ = 0;
  return s;
}

void DataParallel::gather_state(const ElementState& mine, const ElementState* full, size_t kinds) {
  QKV_CHECK(sharded_, "[data_parallel] gather_state is for ZeRO-1 only");
  if (!comm_.is_root()) full = nullptr;
  const int world = comm_.world();
  for (size_t which = 0; which < kinds; ++which) {
    for (size_t b = 0; b + 1 < bounds_.size(); ++b) {
      const int64_t a = bounds_[b], e = bounds_[b + 1];
      float* stage = staging_.data();
      // Pieces of my shard inside this bucket: `mine` is in the same flat order.
      size_t piece = 0;
      for_each_piece(lo_, hi_, [&](size_t, int64_t, int64_t flat, int64_t n) {
        const int64_t s = std::max(a, flat), t = std::min(e, flat + n);
        if (s < t) copy_floats(stage + (s - a), mine[piece][which].data<float>() + (s - flat), t - s);
        ++piece;
      });
      const std::vector<int64_t> counts = shard_counts(a, e, total_, world);
      const int64_t mine_at = std::clamp(lo_, a, e) - a;
      comm_.gatherv(stage + mine_at, stage, counts, 0);
      if (!full) continue;
      for_each_piece(a, e, [&](size_t k, int64_t in_param, int64_t flat, int64_t n) {
        copy_floats((*full)[k][which].data<float>() + in_param, stage + (flat - a), n);
      });
    }
  }
}

void DataParallel::scatter_state(const ElementState& full, const ElementState& mine) const {
  QKV_CHECK(sharded_, "[data_parallel] scatter_state is for ZeRO-1 only");
  size_t piece = 0;
  for_each_piece(lo_, hi_, [&](size_t k, int64_t in_param, int64_t, int64_t n) {
    for (size_t which = 0; which < mine[piece].size(); ++which)
      copy_floats(mine[piece][which].data<float>(), full[k][which].data<float>() + in_param, n);
    ++piece;
  });
}

uint64_t rank_dropout_seed(uint64_t seed, int rank) {
  return seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank));
}

uint64_t row_dropout_seed(uint64_t seed, int64_t g) {
  // A different odd multiplier from rank_dropout_seed's, so a row key never equals a rank key.
  return seed ^ (0xd6e8feb86659fd93ull * static_cast<uint64_t>(g + 1));
}

uint64_t DataParallel::parameter_hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const OptimParam& p : params_) {
    const Tensor host = p.param.to(Device::cpu);  // the parameter itself on the CPU
    h = fnv1a64(host.raw_data(), static_cast<size_t>(host.numel()) * 4, h);
  }
  return h;
}

}  // namespace qkv::dist
