// CPU reduction and softmax kernels. Callers (tensor/ops_reduce.cpp) have checked dtypes
// (float32/float64) and dims; outputs are fresh contiguous tensors.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace qkv::cpu {

// out (a's shape with the reduced dims set to 1, contiguous) = scale * sum of a over dims where
// reduce[d]; accumulates in float64.
void sum_forward(const Tensor& a, const std::vector<bool>& reduce, const Tensor& out, double scale);
// Over one dim: values and indices (int64) of the first maximum, both shaped like a with
// a.shape[dim] = 1. NaN counts as the maximum.
void max_forward(const Tensor& a, int dim, const Tensor& values, const Tensor& indices);
// y = softmax(x) or log_softmax(x) along dim (x, y one shape; y contiguous).
void softmax_forward(const Tensor& x, int dim, const Tensor& y, bool log);
// dx = y * (dy - sum(dy * y))           (softmax, y = softmax output)
// dx = dy - exp(y) * sum(dy)            (log_softmax, y = log_softmax output)
void softmax_backward(const Tensor& y, const Tensor& dy, int dim, const Tensor& dx, bool log);

}  // namespace qkv::cpu
