// CUDA kernels of LayerNorm / RMSNorm and the column sums (dweight, dbias, sum_rows), with the
// contracts of tensor/cpu/nn_kernels.h (inputs contiguous, outputs preallocated,
// float32/float64, row statistics in float64). Deterministic: every sum runs in an order fixed by
// the shapes —
//   row statistics: one warp per row, lane l takes columns l, l+32, ..., then a fixed shuffle tree;
//   column sums: fixed chunks of rows summed in row order, then the chunk partials in chunk order.
// Formulas (x̂ = (x − mean)·rstd, mean = 0 for RMSNorm; g = dy·w):
//   LayerNorm dx = rstd·(g − mean(g) − x̂·mean(g·x̂));  RMSNorm dx = rstd·(g − x̂·mean(g·x̂))
//   dweight = Σ_rows dy·x̂;  dbias = Σ_rows dy
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

constexpr int kRowsPerBlock = 4;       // warps per block in the row kernels
constexpr int64_t kChunkRows = 256;    // rows per partial in the column sums (at least)
constexpr int64_t kMaxChunks = 65535;  // chunks run along grid.y, whose limit this is

// ---- normalisation ----

template <class T, bool kCentered>
__global__ void norm_forward_kernel(const T* x, const T* w, const T* b, double eps, T* y, T* mean_out, T* rstd_out,
                                    int64_t rows, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const T* xr = x + r * C;
  double s = 0;
  if (kCentered) {
    for (int64_t c = lane; c < C; c += kWarp) s += static_cast<double>(xr[c]);
    s = warp_sum(s);
  }
  const double mean = kCentered ? s / static_cast<double>(C) : 0.0;
  double q = 0;
  for (int64_t c = lane; c < C; c += kWarp) {
    const double d = static_cast<double>(xr[c]) - mean;
    q += d * d;
  }
  q = warp_sum(q);
  const double rstd = 1.0 / ::sqrt(q / static_cast<double>(C) + eps);
  for (int64_t c = lane; c < C; c += kWarp) {
    T v = static_cast<T>((static_cast<double>(xr[c]) - mean) * rstd);
    if (w) v *= w[c];
    if (b) v += b[c];
    y[r * C + c] = v;
  }
  if (lane == 0) {
    if (mean_out) mean_out[r] = static_cast<T>(mean);
    rstd_out[r] = static_cast<T>(rstd);
  }
}

template <class T, bool kCentered>
__global__ void norm_backward_dx_kernel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                                        bool accumulate, int64_t rows, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const T* xr = x + r * C;
  const T* gr = dy + r * C;
  const double mu = kCentered ? static_cast<double>(mean[r]) : 0.0, rs = static_cast<double>(rstd[r]);
  double sg = 0, sgx = 0;
  for (int64_t c = lane; c < C; c += kWarp) {
    const double g = static_cast<double>(gr[c]) * (w ? static_cast<double>(w[c]) : 1.0);
    sg += g;
    sgx += g * (static_cast<double>(xr[c]) - mu) * rs;
  }
  sg = warp_sum(sg) / static_cast<double>(C);
  sgx = warp_sum(sgx) / static_cast<double>(C);
  for (int64_t c = lane; c < C; c += kWarp) {
    const double g = static_cast<double>(gr[c]) * (w ? static_cast<double>(w[c]) : 1.0);
    const double xhat = (static_cast<double>(xr[c]) - mu) * rs;
    const T v = static_cast<T>(rs * (g - (kCentered ? sg : 0.0) - xhat * sgx));
    if (accumulate) dx[r * C + c] += v;
    else dx[r * C + c] = v;
  }
}

// partial[k, c] = Σ over rows of chunk k of f(r, c), in row order. Mode 0: x[r,c] (sum_rows / dbias);
// mode 1: dy[r,c]·x̂[r,c] (dweight).
template <class T>
__global__ void column_partials_kernel(int mode, const T* a, const T* x, const T* mean, const T* rstd, double* partial,
                                       int64_t rows, int64_t chunk_rows, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (c >= C) return;
  const int64_t r0 = k * chunk_rows, r1 = min(rows, r0 + chunk_rows);
  double s = 0;
  for (int64_t r = r0; r < r1; ++r) {
    double v = static_cast<double>(a[r * C + c]);
    if (mode == 1)
      v *= (static_cast<double>(x[r * C + c]) - (mean ? static_cast<double>(mean[r]) : 0.0)) *
           static_cast<double>(rstd[r]);
    s += v;
  }
  partial[k * C + c] = s;
}

template <class T>
__global__ void column_finish_kernel(const double* partial, int64_t chunks, int64_t C, T* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
  out[c] = static_cast<T>(s);
}

// out[c] = Σ_r f(r, c) (see column_partials_kernel for the modes).
template <class T>
void column_sums(int mode, const T* a, const T* x, const T* mean, const T* rstd, int64_t rows, int64_t C, T* out) {
  if (C == 0) return;
  // Chunks of kChunkRows rows, longer when there would be more than kMaxChunks (over ~16.7M rows);
  // the order stays fixed by the shape.
  const int64_t chunk_rows = std::max(kChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  Tensor partial = Tensor::empty({chunks, C}, DType::f64, Device::cuda);
  const dim3 grid(static_cast<unsigned>((C + 127) / 128), static_cast<unsigned>(chunks));
  column_partials_kernel<T><<<grid, 128>>>(mode, a, x, mean, rstd, ptr<double>(partial), rows, chunk_rows, C);
  QKV_CUDA_LAUNCHED("column_partials_kernel");
  column_finish_kernel<T><<<static_cast<unsigned>((C + 127) / 128), 128>>>(ptr<double>(partial), chunks, C, out);
  QKV_CUDA_LAUNCHED("column_finish_kernel");
}

template <class T, bool kCentered>
void norm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y, const Tensor& mean,
                  const Tensor& rstd) {
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  if (rows == 0) return;
  norm_forward_kernel<T, kCentered>
      <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowsPerBlock * kWarp>>>(
          ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, ptr<T>(y), ptr<T>(mean), ptr<T>(rstd), rows, C);
  QKV_CUDA_LAUNCHED("norm_forward_kernel");
}

template <class T, bool kCentered>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dx, const Tensor& dweight, const Tensor& dbias, bool accumulate) {
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  if (rows > 0) {
    norm_backward_dx_kernel<T, kCentered>
        <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowsPerBlock * kWarp>>>(
            ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(mean), ptr<T>(rstd), ptr<T>(dx), accumulate, rows, C);
    QKV_CUDA_LAUNCHED("norm_backward_dx_kernel");
  }
  if (dweight.defined()) column_sums<T>(1, ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), rows, C, ptr<T>(dweight));
  if (dbias.defined()) column_sums<T>(0, ptr<T>(dy), nullptr, nullptr, nullptr, rows, C, ptr<T>(dbias));
}

}  // namespace

void sum_rows(const Tensor& x, const Tensor& out) {
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  with_float(x.dtype(), [&](auto tt) {
    using T = decltype(tt);
    column_sums<T>(0, ptr<T>(x), nullptr, nullptr, nullptr, rows, C, ptr<T>(out));
  });
}

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  with_float(x.dtype(), [&](auto tt) { norm_forward<decltype(tt), true>(x, weight, bias, eps, y, mean, rstd); });
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         bool accumulate_dx) {
  with_float(x.dtype(), [&](auto tt) {
    norm_backward<decltype(tt), true>(dy, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx);
  });
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  with_float(x.dtype(),
             [&](auto tt) { norm_forward<decltype(tt), false>(x, weight, Tensor(), eps, y, Tensor(), rstd); });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight) {
  with_float(x.dtype(), [&](auto tt) {
    norm_backward<decltype(tt), false>(dy, x, weight, Tensor(), rstd, dx, dweight, Tensor(), false);
  });
}

}  // namespace qkv::cuda
