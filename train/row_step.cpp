// The backward of invariant training (see row_step.h).
#include "train/row_step.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <memory>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "tensor/numerics.h"
#include "train/evaluate.h"

namespace qkv::train {

Batch batch_row(const Batch& b, int64_t i) {
  Batch r;
  const auto row = [&](const Tensor& t) { return t.defined() ? t.narrow(0, i, 1) : Tensor(); };
  r.x = row(b.x);
  r.y = row(b.y);
  r.key_padding = row(b.key_padding);
  r.positions = row(b.positions);
  r.segment_ids = row(b.segment_ids);
  const Tensor y = r.y.contiguous();
  const int64_t* yp = y.data<int64_t>();
  for (int64_t k = 0; k < y.numel(); ++k) r.n_targets += yp[k] != kIgnoreIndex;
  r.step = b.step;
  r.first_row = b.first_row + i;
  return r;
}

namespace {

// One row's forward and backward on the calling thread: its weighted loss, and its gradient left
// in the leaves' .grad or in the thread's GradSink.
double run_row(const nn::DecoderModel& model, const Batch& row, double divisor, uint64_t seed, int64_t step,
               int64_t* masked_rows) {
  Tensor loss = batch_loss(model, row, {dist::row_dropout_seed(seed, row.first_row), static_cast<uint64_t>(step), 0},
                           masked_rows);
  const double share = static_cast<double>(row.n_targets) / divisor;
  if (row.n_targets > 0) autograd::backward(ag::mul(loss, share));
  return share * loss.item();
}

}  // namespace

int row_workers(const nn::DecoderModel& model, int64_t rows) {
  if (model.device() != Device::cpu || omp_in_parallel()) return 1;
  return static_cast<int>(std::clamp<int64_t>(omp_get_max_threads(), 1, std::max<int64_t>(rows, 1)));
}

std::vector<double> row_tree_backward(const nn::DecoderModel& model, dist::DataParallel& dp,
                                      const std::vector<Batch>& micro, int64_t divisor, uint64_t seed, int64_t step,
                                      int64_t* masked_rows) {
  const double d = static_cast<double>(std::max<int64_t>(divisor, 1));
  std::vector<Batch> rows;
  for (const Batch& b : micro)
    for (int64_t i = 0; i < b.x.size(0); ++i) rows.push_back(batch_row(b, i));
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<double> row_loss(rows.size());
  const int workers = row_workers(model, n);
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) {
      row_loss[i] = run_row(model, rows[i], d, seed, step, masked_rows);
      dp.push_row(rows[i].first_row);
    }
    return row_loss;
  }
  // `workers` rows at a time, one per thread, each on one thread (OpenMP regions inside a worker
  // run serially; the kernels' results do not depend on the thread count), each into its own
  // sink; then pushed in row order. The workers run in the caller's numerics, autocast and grad
  // mode (all per thread).
  autograd::prepare_leaves(model.parameters());
  const Numerics mode = numerics();
  const bool autocast = autograd::autocast_bf16(), grad = autograd::grad_enabled();
  std::vector<int64_t> masked(static_cast<size_t>(workers), 0);
  for (int64_t first = 0; first < n; first += workers) {
    const int64_t here = std::min<int64_t>(workers, n - first);
    std::vector<autograd::GradSink> sinks(static_cast<size_t>(here));
    std::vector<std::exception_ptr> failed(static_cast<size_t>(here));
#pragma omp parallel num_threads(static_cast <int>(here))
    {
      const int w = omp_get_thread_num();
      try {
        NumericsGuard numerics_guard(mode);
        autograd::AutocastGuard autocast_guard(autocast);
        const autograd::GradModeGuard grad_guard(grad);
        autograd::GradSinkScope sink_scope(sinks[w]);
        row_loss[first + w] = run_row(model, rows[first + w], d, seed, step, masked_rows ? &masked[w] : nullptr);
      } catch (...) { failed[w] = std::current_exception(); }
    }
    for (const std::exception_ptr& e : failed)
      if (e) std::rethrow_exception(e);
    for (int64_t w = 0; w < here; ++w) dp.push_row(rows[first + w].first_row, sinks[w]);
  }
  if (masked_rows)
    for (int64_t m : masked) *masked_rows += m;
  return row_loss;
}

}  // namespace qkv::train
