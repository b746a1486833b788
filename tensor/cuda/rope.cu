// The CUDA RoPE kernel (its CPU twin: tensor/cpu/rope.cpp):
//   RoPE (attention/rope.h): out_f = x_f·cos a − x_{f+D/2}·sin a, out_{f+D/2} = x_{f+D/2}·cos a + x_f·sin a,
//     a = sign·pos·inv_freq_f, computed in float64 like the CPU kernel (inv_freq comes from the host,
//     so both devices use the same frequencies bit for bit).
#include <algorithm>
#include <vector>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/geometry.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace qkv::cuda {
namespace {

using detail::ptr;

inline int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 1 << 16)); }

// One thread per (b, h, n, f), f < D/2.
template <class T>
__global__ void rope_kernel(const T* x, int64_t sb, int64_t sh, int64_t sn, int64_t sd, const int64_t* pos,
                            bool per_row, const double* inv_freq, double sign, T* out, int64_t B, int64_t H, int64_t N,
                            int64_t half) {
  const int64_t total = B * H * N * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t f = i % half, n = (i / half) % N, h = (i / (half * N)) % H, b = i / (half * N * H);
    const double a = static_cast<double>(pos[per_row ? b * N + n : n]) * inv_freq[f];
    const T c = static_cast<T>(::cos(a)), s = static_cast<T>(sign * ::sin(a));
    const T* xr = x + b * sb + h * sh + n * sn;
    T* orow = out + ((b * H + h) * N + n) * (2 * half);
    const T x1 = xr[f * sd], x2 = xr[(f + half) * sd];
    orow[f] = x1 * c - x2 * s;
    orow[f + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void rope(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, const std::vector<double>& inv_freq,
          double sign, const Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), half = x.size(3) / 2;
  if (B * H * N * half == 0) return;
  const Tensor d_pos = from_vector_i64(pos, {static_cast<int64_t>(pos.size())}).to(Device::cuda);
  const Tensor d_freq = from_vector(inv_freq, {half}, DType::f64).to(Device::cuda);
  const int blocks = blocks_for(B * H * N * half);
  if (x.dtype() == DType::f32)
    rope_kernel<float><<<blocks, 256>>>(ptr<float>(x), x.stride(0), x.stride(1), x.stride(2), x.stride(3),
                                        ptr<int64_t>(d_pos), per_row, ptr<double>(d_freq), sign, ptr<float>(out), B, H,
                                        N, half);
  else
    rope_kernel<double><<<blocks, 256>>>(ptr<double>(x), x.stride(0), x.stride(1), x.stride(2), x.stride(3),
                                         ptr<int64_t>(d_pos), per_row, ptr<double>(d_freq), sign, ptr<double>(out), B,
                                         H, N, half);
  QKV_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace qkv::cuda
