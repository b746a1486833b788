// The per-step scalars and the per-element formula of the fused AdamW update (train/optimizer.h),
// shared by the CPU loop (tensor/cpu/adamw.cpp) and the CUDA kernel (tensor/cuda/adamw.cu),
// so both devices compute the same expression.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define QKV_HOST_DEVICE __host__ __device__
#else
#define QKV_HOST_DEVICE
#endif

namespace qkv {

// decay_factor = 1 - lr·wd, step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t).
struct AdamWScalars {
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
};

// One parameter's arrays on one device: weights p, gradient g, moments m and v, n contiguous
// floats each.
struct AdamWSlice {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  bool decay;  // weight decay applies (2-D weights), else not (biases, norms, embeddings' policy)
};

// One element:  g' = g·grad_scale,  m = b1·m + (1 − b1)·g',  v = b2·v + (1 − b2)·g'²,
//               p = p·decay_factor − step_size · m / (sqrt(v) / bc2_sqrt + eps).
QKV_HOST_DEVICE inline void adamw_element(float& p, float g, float& m, float& v, const AdamWScalars& s) {
  const float gi = g * s.grad_scale;
  const float mi = m * s.beta1 + s.one_minus_beta1 * gi;
  const float vi = v * s.beta2 + s.one_minus_beta2 * (gi * gi);
  m = mi;
  v = vi;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  p = p * s.decay_factor - s.step_size * (mi / denom);
}

}  // namespace qkv
