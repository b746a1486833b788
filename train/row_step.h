// The backward of invariant training: one step's rows, each alone, into the row tree
// (distributed/row_tree.h). The trainer (train_step under train.numerics = "invariant") and the
// training-step benchmark both run it, so `qkv bench` times the step that training runs.
#pragma once
#include <cstdint>
#include <vector>

#include "data/batcher.h"
#include "distributed/data_parallel.h"
#include "nn/transformer.h"

namespace qkv::train {

// Row i of a batch alone (its global row index first_row + i, its own target count).
Batch batch_row(const Batch& b, int64_t i);

// For every row of `micro` in order: forward and backward alone, dropout keyed by the row's
// global index (dist::row_dropout_seed) and `step`, the loss (the row's mean) weighted by its
// target count over `divisor` (the global batch's target count), the gradient pushed into dp's
// row tree. Returns each row's weighted loss, in row order. The caller calls dp.zero_grads()
// before and dp.reduce_grads() after; counts fully masked rows into *masked_rows when given.
std::vector<double> row_tree_backward(const nn::DecoderModel& model, dist::DataParallel& dp,
                                      const std::vector<Batch>& micro, int64_t divisor, uint64_t seed, int64_t step,
                                      int64_t* masked_rows);

}  // namespace qkv::train
