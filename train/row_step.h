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
// row tree. row_workers() rows run at once, on their own threads; the bits are the same for any
// number (each row's gradient is a function of the row alone; the tree's order is fixed). Returns each row's weighted loss, in row order. The caller calls dp.zero_grads()
// before and dp.reduce_grads() after; counts fully masked rows into *masked_rows when given.
// Rows run at once by row_tree_backward: one per OpenMP thread (omp_get_max_threads(), at most
// `rows`) for a CPU model, each row on one thread; 1 on a device or inside an OpenMP region.
int row_workers(const nn::DecoderModel& model, int64_t rows);

std::vector<double> row_tree_backward(const nn::DecoderModel& model, dist::DataParallel& dp,
                                      const std::vector<Batch>& micro, int64_t divisor, uint64_t seed, int64_t step,
                                      int64_t* masked_rows);

}  // namespace qkv::train
