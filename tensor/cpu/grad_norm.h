// The squared L2 norms behind gradient clipping on the CPU (train/clip.cpp), one per tensor; the
// CUDA twin is tensor/cuda/grad_norm.h.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace qkv::cpu {

// Σ x² of each CPU tensor in `xs` (float32 or float64, any layout; undefined or empty: 0),
// accumulated in float64. Deterministic whatever the thread count: each tensor is cut into blocks
// of 8192 elements, the blocks of all tensors are summed in parallel (one float64 each), and each
// tensor's block sums are then added in block order.
std::vector<double> sum_squares(const std::vector<Tensor>& xs);

}  // namespace qkv::cpu
