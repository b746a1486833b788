// The per-step scalars of the fused AdamW update (formula in train/optimizer.h), shared by the CPU
// kernel (train/optimizer.cpp) and the CUDA one (tensor/cuda/train_kernels.cu).
#pragma once

namespace qkv {

// decay_factor = 1 - lr·wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t).
struct AdamWScalars {
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
};

}  // namespace qkv
