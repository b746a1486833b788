// The backward of invariant training (see row_step.h).
#include "train/row_step.h"

#include <algorithm>

#include "autograd/engine.h"
#include "autograd/functions.h"
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

std::vector<double> row_tree_backward(const nn::DecoderModel& model, dist::DataParallel& dp,
                                      const std::vector<Batch>& micro, int64_t divisor, uint64_t seed, int64_t step,
                                      int64_t* masked_rows) {
  const double d = static_cast<double>(std::max<int64_t>(divisor, 1));
  std::vector<double> row_loss;
  for (const Batch& b : micro) {
    for (int64_t i = 0; i < b.x.size(0); ++i) {
      const Batch row = batch_row(b, i);
      const int64_t g = row.first_row;
      Tensor loss =
          batch_loss(model, row, {dist::row_dropout_seed(seed, g), static_cast<uint64_t>(step), 0}, masked_rows);
      const double share = static_cast<double>(row.n_targets) / d;
      row_loss.push_back(share * loss.item());
      if (row.n_targets > 0) autograd::backward(ag::mul(loss, share));
      dp.push_row(g);
    }
  }
  return row_loss;
}

}  // namespace qkv::train
