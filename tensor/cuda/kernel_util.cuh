// Internal to tensor/cuda/: small pieces the neural-net kernels (nn.cu, norm.cu, cross_entropy.cu)
// share — raw pointers of a tensor, grid sizes, the float/index type dispatch and the fixed warp
// reduction tree every row statistic uses (so sums are deterministic).
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/tensor.h"

namespace qkv::cuda::detail {

constexpr int kWarp = 32;

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Σ of v over the warp's 32 lanes by a fixed xor-shuffle tree (every lane gets the sum).
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Blocks of `threads` covering n elements, capped (grid-stride loops cover the rest).
inline int blocks_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1 << 16));
}

template <class F>
void with_float(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else f(double{});
}

template <class F>
void with_float_index(DType ft, DType it, F&& f) {
  if (ft == DType::f32) {
    if (it == DType::i32) f(float{}, int32_t{});
    else f(float{}, int64_t{});
  } else {
    if (it == DType::i32) f(double{}, int32_t{});
    else f(double{}, int64_t{});
  }
}

}  // namespace qkv::cuda::detail
