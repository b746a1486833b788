// cuda::row_tree_sum (row_tree_sum.h): one thread per element, grid-stride.
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernel_util.cuh"
#include "tensor/cuda/row_tree_sum.h"
#include "tensor/error.h"

namespace qkv::cuda {
namespace {

constexpr int kThreads = 256;

struct Tops {
  const float* p[kRowTreeMaxTops];
};

__global__ void row_tree_sum_kernel(float* out, const float* a, const float* b, bool pair, Tops tops, int ntops,
                                    int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v;
    if (!pair) v = a ? a[i] : 0.0f;
    else if (a && b) v = a[i] + b[i];
    else if (a || b) v = (a ? a[i] : b[i]) + 0.0f;
    else v = 0.0f;
    for (int j = 0; j < ntops; ++j) v = tops.p[j][i] + v;
    out[i] = v;
  }
}

}  // namespace

void row_tree_sum(float* out, const float* a, const float* b, bool pair, const float* const* tops, int ntops,
                  int64_t n) {
  QKV_CHECK(ntops >= 0 && ntops <= kRowTreeMaxTops, "[row_tree] ", ntops, " blocks merged at once; at most ",
            kRowTreeMaxTops);
  if (n <= 0) return;
  Tops t{};
  for (int j = 0; j < ntops; ++j) t.p[j] = tops[j];
  row_tree_sum_kernel<<<detail::blocks_for(n, kThreads), kThreads>>>(out, a, b, pair, t, ntops, n);
  QKV_CUDA_LAUNCHED("row_tree_sum");
}

}  // namespace qkv::cuda
