// Global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_:
//   norm  = sqrt(sum over all gradients of g^2)
//   coef  = max_norm / (norm + 1e-6);  if coef < 1, every gradient is multiplied by coef.
// The sum is accumulated in float64 over fixed blocks of 8192 elements whose partial sums are
// added in order, so the norm is the same bits whatever the thread count (resume must be
// bitwise). A non-finite norm (an inf or NaN anywhere) is returned unchanged and nothing is
// scaled: the training loop skips that step and counts it.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace qkv::train {

// sqrt(sum x^2) over every element of every defined tensor (float32 or float64, CPU, any strides).
double global_norm(const std::vector<Tensor>& tensors);
// The same over the .grad() of each parameter (parameters without a gradient are skipped).
double global_grad_norm(const std::vector<Tensor>& params);

// The factor clipping would multiply gradients by: max_norm / (norm + 1e-6) when that is < 1,
// else 1. Returns 1 when max_norm <= 0 (clipping off) or the norm is not finite.
// Pass it to AdamW::step(lr, scale) to clip without a separate pass over the gradients.
float clip_scale(double norm, double max_norm);

// Computes the global gradient norm, scales the gradients in place when it exceeds max_norm
// (max_norm <= 0: never), and returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace qkv::train
