// The backward engine: topological order from the root, a reverse sweep under no-grad, gradients
// summed per node and += into leaf .grad.
#pragma once
#include "tensor/tensor.h"

namespace qkv::autograd {

// root must be a scalar unless `grad` (same shape as root) is given. A gradient moved in (nothing
// else referring to it) may be updated in place and handed on without copies.
void backward(const Tensor& root, Tensor grad = Tensor());
// Sets .grad of each tensor to undefined (the next backward writes fresh gradients).
void zero_grad(const std::vector<Tensor>& params);

}  // namespace qkv::autograd
