// CUDA reductions and softmax, with the contracts of tensor/cpu/reduce.h. One block per output
// element (or softmax row): thread t takes the reduced elements t, t+256, ... in order, then a
// fixed shared-memory tree combines the 256 partials, so results are deterministic. Sums
// accumulate in float64, as on the CPU.
//   softmax:      y = exp(x − m) / Σ exp(x − m)      log_softmax: y = x − m − log Σ exp(x − m)
//   backward:     dx = y·(dy − Σ dy·y)               dx = dy − exp(y)·Σ dy
#include <cmath>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/geometry.cuh"
#include "tensor/cuda/kernels.h"

namespace qkv::cuda {
namespace {

using detail::Geometry;
using detail::geometry_of_dims;
using detail::offset_of;
using detail::ptr;

constexpr int kThreads = 256;

// Sum of one double per thread over the block, by a fixed tree; every thread gets the result.
__device__ double block_sum(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

__device__ double block_max(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] = ::fmax(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const double r = red[0];
  __syncthreads();
  return r;
}

// out[o] = scale · Σ_k a[kept(o) + reduced(k)]
template <class T>
__global__ void sum_kernel(const T* a, Geometry kept, Geometry reduced, int64_t inner, T* out, double scale) {
  __shared__ double red[kThreads];
  const int64_t o = blockIdx.x;
  const T* base = a + offset_of(o, kept);
  double s = 0;
  for (int64_t k = threadIdx.x; k < inner; k += kThreads) s += static_cast<double>(base[offset_of(k, reduced)]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) out[o] = static_cast<T>(s * scale);
}

// True when (va, ia) should win over (vb, ib): NaN beats numbers, larger beats smaller, and on a
// tie (or two NaNs) the smaller index wins.
template <class T>
__device__ bool wins(T va, int64_t ia, T vb, int64_t ib) {
  const bool na = va != va, nb = vb != vb;
  if (na || nb) return na && (!nb || ia < ib);
  return va > vb || (va == vb && ia < ib);
}

template <class T>
__global__ void max_kernel(const T* a, Geometry kept, int64_t stride, int64_t n, T* values, int64_t* indices) {
  __shared__ T val[kThreads];
  __shared__ int64_t idx[kThreads];
  const int64_t o = blockIdx.x;
  const T* base = a + offset_of(o, kept);
  T best = T(0);
  int64_t at = INT64_MAX;  // INT64_MAX: this thread has seen no element yet
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    const T v = base[k * stride];
    if (at == INT64_MAX || wins(v, k, best, at)) {
      best = v;
      at = k;
    }
  }
  val[threadIdx.x] = best;
  idx[threadIdx.x] = at;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s && idx[threadIdx.x + s] != INT64_MAX &&
        (idx[threadIdx.x] == INT64_MAX ||
         wins(val[threadIdx.x + s], idx[threadIdx.x + s], val[threadIdx.x], idx[threadIdx.x]))) {
      val[threadIdx.x] = val[threadIdx.x + s];
      idx[threadIdx.x] = idx[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    values[o] = val[0];
    indices[o] = idx[0];
  }
}

// One row of length n along the softmax dim: x at xb + k·xs, y at yb + k·ys.
template <class T>
__global__ void softmax_kernel(const T* x, Geometry xrows, int64_t xs, T* y, Geometry yrows, int64_t ys, int64_t n,
                               bool log_out) {
  __shared__ double red[kThreads];
  const int64_t r = blockIdx.x;
  const T* xr = x + offset_of(r, xrows);
  T* yr = y + offset_of(r, yrows);
  double m = -INFINITY;
  for (int64_t k = threadIdx.x; k < n; k += kThreads) m = ::fmax(m, static_cast<double>(xr[k * xs]));
  m = block_max(m, red);
  if (m == -INFINITY) {  // every logit -inf: softmax has no value; propagate as the CPU does (NaN)
    for (int64_t k = threadIdx.x; k < n; k += kThreads) yr[k * ys] = static_cast<T>(NAN);
    return;
  }
  double s = 0;
  for (int64_t k = threadIdx.x; k < n; k += kThreads) s += ::exp(static_cast<double>(xr[k * xs]) - m);
  s = block_sum(s, red);
  const double lse = m + ::log(s);
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    const double v = static_cast<double>(xr[k * xs]);
    yr[k * ys] = static_cast<T>(log_out ? v - lse : ::exp(v - m) / s);
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* y, Geometry yrows, int64_t ys, const T* dy, Geometry dyrows,
                                        int64_t dys, T* dx, Geometry dxrows, int64_t dxs, int64_t n, bool log_in) {
  __shared__ double red[kThreads];
  const int64_t r = blockIdx.x;
  const T* yr = y + offset_of(r, yrows);
  const T* gr = dy + offset_of(r, dyrows);
  T* dr = dx + offset_of(r, dxrows);
  double s = 0;
  for (int64_t k = threadIdx.x; k < n; k += kThreads)
    s += static_cast<double>(gr[k * dys]) * (log_in ? 1.0 : static_cast<double>(yr[k * ys]));
  s = block_sum(s, red);
  for (int64_t k = threadIdx.x; k < n; k += kThreads) {
    const double yv = static_cast<double>(yr[k * ys]), g = static_cast<double>(gr[k * dys]);
    dr[k * dxs] = static_cast<T>(log_in ? g - ::exp(yv) * s : yv * (g - s));
  }
}

template <class F>
void with_float(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else f(double{});
}

int64_t rows_except(const Tensor& t, int dim) {
  int64_t r = 1;
  for (int d = 0; d < t.dim(); ++d)
    if (d != dim) r *= t.size(d);
  return r;
}

}  // namespace

void sum_forward(const Tensor& a, const std::vector<bool>& reduce, const Tensor& out, double scale) {
  const int64_t outer = out.numel();
  if (outer == 0) return;
  int64_t inner = 1;
  for (int d = 0; d < a.dim(); ++d)
    if (reduce[d]) inner *= a.size(d);
  const Geometry kept = geometry_of_dims(a, "sum", [&](int d) { return !reduce[d]; });
  const Geometry reduced = geometry_of_dims(a, "sum", [&](int d) { return static_cast<bool>(reduce[d]); });
  with_float(a.dtype(), [&](auto tt) {
    using T = decltype(tt);
    sum_kernel<T><<<static_cast<unsigned>(outer), kThreads>>>(ptr<T>(a), kept, reduced, inner, ptr<T>(out), scale);
  });
  QKV_CUDA_LAUNCHED("sum_kernel");
}

void max_forward(const Tensor& a, int dim, const Tensor& values, const Tensor& indices) {
  const int64_t outer = values.numel(), n = a.size(dim);
  if (outer == 0) return;
  const Geometry kept = geometry_of_dims(a, "max", [&](int d) { return d != dim; });
  with_float(a.dtype(), [&](auto tt) {
    using T = decltype(tt);
    max_kernel<T><<<static_cast<unsigned>(outer), kThreads>>>(ptr<T>(a), kept, a.stride(dim), n, ptr<T>(values),
                                                              ptr<int64_t>(indices));
  });
  QKV_CUDA_LAUNCHED("max_kernel");
}

void softmax_forward(const Tensor& x, int dim, const Tensor& y, bool log) {
  const int64_t rows = rows_except(x, dim), n = x.size(dim);
  if (rows == 0 || n == 0) return;
  const Geometry xr = geometry_of_dims(x, "softmax", [&](int d) { return d != dim; });
  const Geometry yr = geometry_of_dims(y, "softmax", [&](int d) { return d != dim; });
  with_float(x.dtype(), [&](auto tt) {
    using T = decltype(tt);
    softmax_kernel<T>
        <<<static_cast<unsigned>(rows), kThreads>>>(ptr<T>(x), xr, x.stride(dim), ptr<T>(y), yr, y.stride(dim), n, log);
  });
  QKV_CUDA_LAUNCHED("softmax_kernel");
}

void softmax_backward(const Tensor& y, const Tensor& dy, int dim, const Tensor& dx, bool log) {
  const int64_t rows = rows_except(y, dim), n = y.size(dim);
  if (rows == 0 || n == 0) return;
  auto rows_of = [&](const Tensor& t) {
    return geometry_of_dims(t, "softmax_backward", [&](int d) { return d != dim; });
  };
  with_float(y.dtype(), [&](auto tt) {
    using T = decltype(tt);
    softmax_backward_kernel<T>
        <<<static_cast<unsigned>(rows), kThreads>>>(ptr<T>(y), rows_of(y), y.stride(dim), ptr<T>(dy), rows_of(dy),
                                                    dy.stride(dim), ptr<T>(dx), rows_of(dx), dx.stride(dim), n, log);
  });
  QKV_CUDA_LAUNCHED("softmax_backward_kernel");
}

}  // namespace qkv::cuda
