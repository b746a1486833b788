// CUDA kernels of the fused cross-entropy, with the contract in tensor/cpu/nn_kernels.h:
//   lse = m + log Σ exp(z − m); loss = lse − z[t]; dz = (exp(z − lse) − onehot)·scale
// One block per row for the forward (fixed shared-memory trees for the max and the sum); the
// per-row losses are summed on the host in row order, as on the CPU, so the total is deterministic.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "tensor/cpu/random_bits.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernel_util.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace qkv::cuda {
namespace {

using detail::blocks_for;
using detail::kWarp;
using detail::ptr;
using detail::warp_sum;
using detail::with_float;
using detail::with_float_index;

// ---- cross-entropy ----

constexpr int kCeThreads = 256;

template <class T, class I>
__global__ void cross_entropy_forward_kernel(const T* z, int64_t rs, const I* t, int64_t ignore, int64_t V, T* lse,
                                             double* row_loss) {
  __shared__ double red[kCeThreads];
  const int64_t i = blockIdx.x;
  const T* zr = z + i * rs;
  double m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kCeThreads) m = fmax(m, static_cast<double>(zr[j]));
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = kCeThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  double e = 0;
  if (m != -INFINITY)
    for (int64_t j = threadIdx.x; j < V; j += kCeThreads) e += ::exp(static_cast<double>(zr[j]) - m);
  red[threadIdx.x] = e;
  __syncthreads();
  for (int s = kCeThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const T l = m == -INFINITY ? static_cast<T>(m) : static_cast<T>(m + ::log(red[0]));
    lse[i] = l;
    const int64_t ti = static_cast<int64_t>(t[i]);
    row_loss[i] = ti == ignore ? 0.0 : static_cast<double>(l) - static_cast<double>(zr[ti]);
  }
}

template <class T, class I>
__global__ void cross_entropy_backward_kernel(const T* z, int64_t rs, const I* t, const T* lse, T scale, int64_t ignore,
                                              T* dz, int64_t n, int64_t V) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * V;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / V, j = k % V;
    const int64_t ti = static_cast<int64_t>(t[i]);
    if (ti == ignore) {
      dz[k] = T(0);
      continue;
    }
    T v = static_cast<T>(::exp(z[i * rs + j] - lse[i])) * scale;
    if (j == ti) v -= scale;
    dz[k] = v;
  }
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse) {
  const int64_t n = logits.size(0), V = logits.size(1);
  if (n == 0) return 0.0;
  Tensor row_loss = Tensor::empty({n}, DType::f64, Device::cuda);
  with_float_index(logits.dtype(), targets.dtype(), [&](auto tt, auto it) {
    using T = decltype(tt);
    using I = decltype(it);
    cross_entropy_forward_kernel<T, I><<<static_cast<unsigned>(n), kCeThreads>>>(
        ptr<T>(logits), logits.stride(0), ptr<I>(targets), ignore_index, V, ptr<T>(lse), ptr<double>(row_loss));
  });
  QKV_CUDA_LAUNCHED("cross_entropy_forward_kernel");
  double total = 0;
  for (double v : row_loss.to_vector()) total += v;  // row order, as on the CPU
  return total;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                            int64_t ignore_index, const Tensor& dlogits) {
  const int64_t n = logits.size(0), V = logits.size(1);
  if (n * V == 0) return;
  with_float_index(logits.dtype(), targets.dtype(), [&](auto tt, auto it) {
    using T = decltype(tt);
    using I = decltype(it);
    cross_entropy_backward_kernel<T, I>
        <<<blocks_for(n * V, 256), 256>>>(ptr<T>(logits), logits.stride(0), ptr<I>(targets), ptr<T>(lse),
                                          static_cast<T>(scale), ignore_index, ptr<T>(dlogits), n, V);
  });
  QKV_CUDA_LAUNCHED("cross_entropy_backward_kernel");
}

}  // namespace qkv::cuda
