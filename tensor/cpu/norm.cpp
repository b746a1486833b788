// LayerNorm and RMSNorm over the last dim, fused forward and backward. x viewed as [R, C].
//
// LayerNorm:  mean = (1/C) sum_c x,  rstd = 1/sqrt((1/C) sum_c (x - mean)^2 + eps)
//             xhat = (x - mean) * rstd,  y = xhat * w + b
//   backward: g = dy * w
//             dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
//             dw = sum_r dy * xhat,  db = sum_r dy
//   (with accumulate_dx the kernel adds dx onto what dx holds: the residual stream's gradient
//   arrives there first, and this saves a separate full-size add)
// RMSNorm:    rstd = 1/sqrt((1/C) sum_c x^2 + eps),  xhat = x * rstd,  y = xhat * w
//   backward: g = dy * w
//             dx = rstd * (g - xhat * mean_c(g * xhat))
//             dw = sum_r dy * xhat
// Why: one pass over a row computes its statistics (float64 accumulators, `omp simd` so the sums
// vectorise) and the output; backward recomputes xhat from the saved mean/rstd instead of storing
// it. dw/db are sums over rows: rows are cut into blocks fixed by R alone (not by the thread
// count), each block sums its rows in order into its own float64 partial, and the partials are
// added in block order, so the result is the same on any number of threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/nn_kernels.h"

namespace qkv::cpu {

namespace {

constexpr int64_t kGrain =
    1 << 17;  // r·c below which a norm stays on one thread (a fork/join costs ~10 µs here, more under load)

// Rows per block for the dw/db partials: at most 64 blocks, at least 16 rows each.
struct RowBlocks {
  int64_t rows_per_block, count;
  explicit RowBlocks(int64_t rows) {
    const int64_t blocks = std::clamp<int64_t>((rows + 15) / 16, 1, 64);
    rows_per_block = (rows + blocks - 1) / blocks;
    count = rows == 0 ? 0 : (rows + rows_per_block - 1) / rows_per_block;
  }
};

// dst[c] = sum over blocks b (in order) of partial[b][c], in float64 (block 0's row is the
// accumulator); nothing when dst is undefined.
template <class T>
void reduce_partials(std::vector<double>& partial, int64_t blocks, int64_t c, const Tensor& dst) {
  if (!dst.defined()) return;
  T* out = dst.data<T>();
  if (blocks == 0) {
    for (int64_t j = 0; j < c; ++j) out[j] = T(0);
    return;
  }
  double* acc = partial.data();
  for (int64_t b = 1; b < blocks; ++b) {
    const double* p = partial.data() + b * c;
    for (int64_t j = 0; j < c; ++j) acc[j] += p[j];
  }
  for (int64_t j = 0; j < c; ++j) out[j] = static_cast<T>(acc[j]);
}

// One kernel per direction serves both norms: RMSNorm is LayerNorm with mean := 0 and no bias,
// which also drops the mean_c(g) term from dx. kCentered (LayerNorm) is a template argument so
// that for RMSNorm the zero mean is a constant and `x - 0` folds away (x - 0 == x exactly).
template <class T, bool kCentered>
void norm_forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t c = x.shape().empty() ? 1 : x.shape().back();
  const int64_t r = c == 0 ? 0 : x.numel() / c;
  const T* px = x.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  T* py = y.data<T>();
  T* pm = kCentered ? mean.data<T>() : nullptr;
  T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (r * c >= kGrain && !omp_in_parallel())
  for (int64_t i = 0; i < r; ++i) {
    const T* xr = px + i * c;
    T* yr = py + i * c;
    double m = 0;
    if constexpr (kCentered) {
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) s += static_cast<double>(xr[j]);
      m = s / static_cast<double>(c);
    }
    double v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < c; ++j) {
      const double d = static_cast<double>(xr[j]) - m;
      v += d * d;
    }
    const T mt = static_cast<T>(m), rt = static_cast<T>(1.0 / std::sqrt(v / static_cast<double>(c) + eps));
    if (pw && pb)
      for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mt) * rt * pw[j] + pb[j];
    else if (pw)
      for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mt) * rt * pw[j];
    else if (pb)
      for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mt) * rt + pb[j];
    else
      for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mt) * rt;
    if constexpr (kCentered) pm[i] = mt;
    pr[i] = rt;
  }
}

template <class T, bool kCentered>
void norm_backward_typed(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         bool accumulate_dx) {
  const int64_t c = x.shape().empty() ? 1 : x.shape().back();
  const int64_t r = c == 0 ? 0 : x.numel() / c;
  const T* px = x.data<T>();
  const T* pg = dy.data<T>();
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;
  const T* pm = kCentered ? mean.data<T>() : nullptr;
  const T* pr = rstd.data<T>();
  T* pdx = dx.data<T>();
  const bool want_w = dweight.defined(), want_b = dbias.defined();
  const RowBlocks blocks(r);
  std::vector<double> part_w(want_w ? blocks.count * c : 0, 0.0), part_b(want_b ? blocks.count * c : 0, 0.0);
  const double inv_c = 1.0 / static_cast<double>(std::max<int64_t>(c, 1));

#pragma omp parallel for schedule(static) if (r * c >= kGrain && !omp_in_parallel())
  for (int64_t bi = 0; bi < blocks.count; ++bi) {
    double* pw_acc = want_w ? part_w.data() + bi * c : nullptr;
    double* pb_acc = want_b ? part_b.data() + bi * c : nullptr;
    const int64_t i1 = std::min(r, (bi + 1) * blocks.rows_per_block);
    for (int64_t i = bi * blocks.rows_per_block; i < i1; ++i) {
      const T* xr = px + i * c;
      const T* gr = pg + i * c;
      T* dxr = pdx + i * c;
      const T m = kCentered ? pm[i] : T(0), rs = pr[i];
      double sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < c; ++j) {
        const T xhat = (xr[j] - m) * rs;
        const T g = pw ? gr[j] * pw[j] : gr[j];
        if constexpr (kCentered) sg += static_cast<double>(g);
        sgx += static_cast<double>(g) * static_cast<double>(xhat);
      }
      // a = mean_c(g) (LayerNorm only), b = mean_c(g * xhat).
      const T a = kCentered ? static_cast<T>(sg * inv_c) : T(0), b = static_cast<T>(sgx * inv_c);
      if (accumulate_dx) {
        for (int64_t j = 0; j < c; ++j) {
          const T xhat = (xr[j] - m) * rs;
          const T g = pw ? gr[j] * pw[j] : gr[j];
          dxr[j] = dxr[j] + rs * (g - a - xhat * b);
        }
      } else {
        for (int64_t j = 0; j < c; ++j) {
          const T xhat = (xr[j] - m) * rs;
          const T g = pw ? gr[j] * pw[j] : gr[j];
          dxr[j] = rs * (g - a - xhat * b);
        }
      }
      if (pw_acc)
        for (int64_t j = 0; j < c; ++j) pw_acc[j] += static_cast<double>(gr[j]) * static_cast<double>((xr[j] - m) * rs);
      if (pb_acc)
        for (int64_t j = 0; j < c; ++j) pb_acc[j] += static_cast<double>(gr[j]);
    }
  }
  reduce_partials<T>(part_w, blocks.count, c, dweight);
  reduce_partials<T>(part_b, blocks.count, c, dbias);
}

}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  if (x.dtype() == DType::f32) norm_forward_typed<float, true>(x, weight, bias, eps, y, mean, rstd);
  else norm_forward_typed<double, true>(x, weight, bias, eps, y, mean, rstd);
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         bool accumulate_dx) {
  if (x.dtype() == DType::f32)
    norm_backward_typed<float, true>(dy, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx);
  else norm_backward_typed<double, true>(dy, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx);
}

void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd) {
  if (x.dtype() == DType::f32) norm_forward_typed<float, false>(x, weight, Tensor(), eps, y, Tensor(), rstd);
  else norm_forward_typed<double, false>(x, weight, Tensor(), eps, y, Tensor(), rstd);
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight) {
  if (x.dtype() == DType::f32)
    norm_backward_typed<float, false>(dy, x, weight, Tensor(), rstd, dx, dweight, Tensor(), false);
  else norm_backward_typed<double, false>(dy, x, weight, Tensor(), rstd, dx, dweight, Tensor(), false);
}

}  // namespace qkv::cpu
