// The backward engine: topological order from the root, a reverse sweep under no-grad, gradients
// summed per node and += into leaf .grad.
#pragma once
#include "tensor/tensor.h"

namespace qkv::autograd {

// root must be a scalar unless `grad` (same shape as root) is given.
void backward(const Tensor& root, const Tensor& grad = Tensor());
// Sets .grad of each tensor to undefined (the next backward writes fresh gradients).
void zero_grad(const std::vector<Tensor>& params);

}  // namespace qkv::autograd
