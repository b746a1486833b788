// Internal to tensor/cuda/: how a kernel addresses a strided view. A Geometry (passed by value
// to kernels) holds a view's sizes and element strides; offset_of(i, g) is the element offset of
// the i-th element in row-major order of the shape (callers keep i < the view's element count).
// A contiguous view collapses to one dim of stride 1, so its offset is i itself.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/kernels.h"
#include "tensor/error.h"

namespace qkv::cuda::detail {

struct Geometry {
  int dim = 1;
  int64_t size[kMaxDims] = {1};
  int64_t stride[kMaxDims] = {1};
};

// The geometry of `t`'s dims for which keep(d) is true (all dims by default), in order.
template <class Keep>
Geometry geometry_of_dims(const Tensor& t, const char* op, Keep keep) {
  Geometry g;
  g.dim = 0;
  for (int d = 0; d < t.dim(); ++d) {
    if (!keep(d)) continue;
    QKV_CHECK(g.dim < kMaxDims, "[", op, "] CUDA kernels take up to ", kMaxDims, " dims, got ", shape_str(t.shape()));
    g.size[g.dim] = t.size(d);
    g.stride[g.dim] = t.stride(d);
    ++g.dim;
  }
  if (g.dim == 0) {  // a scalar: one element at offset 0
    g.dim = 1;
    g.size[0] = 1;
    g.stride[0] = 0;
  }
  return g;
}

inline Geometry geometry_of(const Tensor& t, const char* op) {
  if (t.is_contiguous()) {
    Geometry g;
    g.size[0] = std::max<int64_t>(t.numel(), 1);
    g.stride[0] = 1;
    return g;
  }
  return geometry_of_dims(t, op, [](int) { return true; });
}

__device__ __forceinline__ int64_t offset_of(int64_t i, const Geometry& g) {
  if (g.dim == 1) return i * g.stride[0];  // i < size[0]: no division (contiguous operands)
  int64_t off = 0;
  for (int d = g.dim - 1; d >= 0; --d) {
    const int64_t n = g.size[d];
    off += (i % n) * g.stride[d];
    i /= n;
  }
  return off;
}

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

}  // namespace qkv::cuda::detail
