// The squared L2 norms behind gradient clipping on the device (train/clip.cpp), one per tensor,
// without a float64 copy of each gradient and with the whole GPU on each sum (a plain `sum` runs
// one block per output, so a full reduction of a 38M-element embedding gradient would run on one
// SM).
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace qkv::cuda {

// Σ x² of each device tensor in `xs` (float32 or float64, any layout), accumulated in float64 and
// returned to the host in one copy. Deterministic: each tensor is cut into a grid fixed by its
// size, every block sums its elements in a fixed order and tree, and one block per tensor then
// adds the block partials by a fixed tree.
std::vector<double> sum_squares(const std::vector<Tensor>& xs);

}  // namespace qkv::cuda
