// cuda::sum_squares (grad_norm.h): two passes, both with fixed trees.
//   pass 1, block b of tensor i:  partial[off_i + b] = Σ_{e in block b's grid-stride share} x_e²
//   pass 2, block i:              out[i] = Σ_b partial[off_i + b]
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/grad_norm.h"
#include "tensor/ops.h"

namespace qkv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kElementsPerThread = 16;  // before a tensor takes another block
constexpr int64_t kMaxBlocks = 1024;        // per tensor: ample for any GPU's SMs

// Shared-memory tree over the block's kThreads values; the result is in red[0].
__device__ void block_tree_sum(double* red) {
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
}

template <class T>
__global__ void partial_sum_squares(const T* x, int64_t n, double* partial) {
  __shared__ double red[kThreads];
  double s = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n; e += stride) {
    const double v = static_cast<double>(x[e]);
    s += v * v;
  }
  red[threadIdx.x] = s;
  __syncthreads();
  block_tree_sum(red);
  if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

// Block i adds partial[offsets[i] .. offsets[i + 1]) into out[i].
__global__ void sum_partials(const double* partial, const int64_t* offsets, double* out) {
  __shared__ double red[kThreads];
  const int64_t lo = offsets[blockIdx.x], hi = offsets[blockIdx.x + 1];
  double s = 0;
  for (int64_t k = lo + threadIdx.x; k < hi; k += kThreads) s += partial[k];
  red[threadIdx.x] = s;
  __syncthreads();
  block_tree_sum(red);
  if (threadIdx.x == 0) out[blockIdx.x] = red[0];
}

int64_t blocks_for(int64_t n) {
  return std::clamp<int64_t>((n + kThreads * kElementsPerThread - 1) / (kThreads * kElementsPerThread), 1, kMaxBlocks);
}

}  // namespace

std::vector<double> sum_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  std::vector<Tensor> flat;  // contiguous (a copy only for strided views)
  std::vector<int64_t> offsets{0};
  for (const Tensor& x : xs) {
    QKV_CHECK(x.device() == Device::cuda, "[sum_squares] expects device tensors, got one on the host");
    QKV_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64,
              "[sum_squares] tensors must be float32 or float64, got ", dtype_name(x.dtype()));
    flat.push_back(x.is_contiguous() ? x : x.contiguous());
    offsets.push_back(offsets.back() + blocks_for(x.numel()));
  }
  const auto count = static_cast<int64_t>(xs.size());
  const Tensor partial = Tensor::empty({offsets.back()}, DType::f64, Device::cuda);
  const Tensor device_offsets = from_vector_i64(offsets, {count + 1}).to(Device::cuda);
  const Tensor out = Tensor::empty({count}, DType::f64, Device::cuda);
  double* part = partial.data<double>();
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& x = flat[static_cast<size_t>(i)];
    const auto blocks = static_cast<unsigned>(offsets[i + 1] - offsets[i]);
    double* dst = part + offsets[i];
    if (x.numel() == 0) {  // one block with nothing to add writes the 0 its slot needs
      partial_sum_squares<float><<<1, kThreads>>>(nullptr, 0, dst);
    } else if (x.dtype() == DType::f32) {
      partial_sum_squares<float><<<blocks, kThreads>>>(x.data<float>(), x.numel(), dst);
    } else {
      partial_sum_squares<double><<<blocks, kThreads>>>(x.data<double>(), x.numel(), dst);
    }
    QKV_CUDA_LAUNCHED("partial_sum_squares");
  }
  sum_partials<<<static_cast<unsigned>(count), kThreads>>>(part, device_offsets.data<int64_t>(), out.data<double>());
  QKV_CUDA_LAUNCHED("sum_partials");
  return out.to_vector();  // waits for the kernels (a device-to-host copy on the one stream)
}

}  // namespace qkv::cuda
