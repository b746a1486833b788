// CUDA kernels of embedding and dropout, with the contracts of tensor/cpu/nn_kernels.h (inputs
// contiguous unless stated, outputs preallocated, float32/float64). Deterministic: the embedding
// backward groups tokens by id on the host (stable) and sums each group in token order onto the
// existing row, which is the CPU's order exactly; dropout draws the CPU's Philox bits, so masks
// match element for element. Norms are in norm.cu, cross-entropy in cross_entropy.cu.
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

// ---- embedding ----

template <class T, class I>
__global__ void embedding_forward_kernel(const T* w, int64_t w_rs, const I* ids, T* out, int64_t n, int64_t C) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = w[static_cast<int64_t>(ids[i / C]) * w_rs + i % C];
}

// Group u: tokens order[start[u] .. start[u+1]) all with id row[u]; dweight[row[u], c] gets their
// dy rows added one after another.
template <class T>
__global__ void embedding_backward_kernel(const int64_t* order, const int64_t* start, const int64_t* row, const T* dy,
                                          T* dw, int64_t C) {
  const int64_t u = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  T s = dw[row[u] * C + c];
  for (int64_t k = start[u]; k < start[u + 1]; ++k) s += dy[order[k] * C + c];
  dw[row[u] * C + c] = s;
}

// ---- dropout ----

template <class T>
__global__ void dropout_kernel(const T* a, T* out, int64_t n, float p, T scale, uint64_t seed, uint64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cpu::dropout_keep(seed, offset + static_cast<uint64_t>(i), p) ? a[i] * scale : T(0);
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t n = ids.numel(), C = weight.size(1);
  if (n * C == 0) return;
  with_float_index(weight.dtype(), ids.dtype(), [&](auto tt, auto it) {
    using T = decltype(tt);
    using I = decltype(it);
    embedding_forward_kernel<T, I>
        <<<blocks_for(n * C, 256), 256>>>(ptr<T>(weight), weight.stride(0), ptr<I>(ids), ptr<T>(out), n, C);
  });
  QKV_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dweight) {
  const int64_t n = ids.numel(), C = dy.size(-1);
  if (n * C == 0) return;
  // Group tokens by id on the host (ids are small: one per token), stable so each group keeps
  // token order.
  const std::vector<double> idv = ids.to_vector();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return idv[a] < idv[b]; });
  std::vector<int64_t> start, row;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = static_cast<int64_t>(idv[order[k]]);
    if (row.empty() || row.back() != id) {
      row.push_back(id);
      start.push_back(k);
    }
  }
  start.push_back(n);
  const Tensor d_order = from_vector_i64(order, {n}).to(Device::cuda);
  const Tensor d_start = from_vector_i64(start, {static_cast<int64_t>(start.size())}).to(Device::cuda);
  const Tensor d_row = from_vector_i64(row, {static_cast<int64_t>(row.size())}).to(Device::cuda);
  const dim3 grid(static_cast<unsigned>(row.size()), static_cast<unsigned>((C + 127) / 128));
  with_float(dy.dtype(), [&](auto tt) {
    using T = decltype(tt);
    embedding_backward_kernel<T><<<grid, 128>>>(ptr<int64_t>(d_order), ptr<int64_t>(d_start), ptr<int64_t>(d_row),
                                                ptr<T>(dy), ptr<T>(dweight), C);
  });
  QKV_CUDA_LAUNCHED("embedding_backward_kernel");
}

void dropout_forward(const Tensor& a, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  const int64_t n = a.numel();
  if (n == 0) return;
  with_float(a.dtype(), [&](auto tt) {
    using T = decltype(tt);
    dropout_kernel<T><<<blocks_for(n, 256), 256>>>(ptr<T>(a), ptr<T>(out), n, static_cast<float>(p),
                                                   static_cast<T>(1.0 / (1.0 - p)), seed, offset);
  });
  QKV_CUDA_LAUNCHED("dropout_kernel");
}

}  // namespace qkv::cuda
