// CUDA kernels of the fused neural-net ops, with the contracts of tensor/cpu/nn_kernels.h
// (inputs contiguous unless stated, outputs preallocated, float32/float64, row statistics in
// float64). Deterministic: every sum runs in an order fixed by the shapes —
//   row statistics: one warp per row, lane l takes columns l, l+32, ..., then a fixed shuffle tree;
//   column sums (dweight, dbias, sum_rows): fixed chunks of rows summed in row order, then the
//     chunk partials summed in chunk order;
//   embedding backward: tokens grouped by id on the host (stable), each group summed in token order
//     onto the existing row, which is the CPU's order exactly;
//   cross-entropy: per-row losses summed on the host in row order.
// Formulas (x̂ = (x − mean)·rstd, mean = 0 for RMSNorm; g = dy·w):
//   LayerNorm dx = rstd·(g − mean(g) − x̂·mean(g·x̂));  RMSNorm dx = rstd·(g − x̂·mean(g·x̂))
//   dweight = Σ_rows dy·x̂;  dbias = Σ_rows dy
//   cross-entropy: lse = m + log Σ exp(z − m); loss = lse − z[t]; dz = (exp(z − lse) − onehot)·scale
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "tensor/cpu/random_bits.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace qkv::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // warps per block in the row kernels
constexpr int64_t kChunkRows = 256;  // rows per partial in the column sums (at least)
constexpr int64_t kMaxChunks = 65535;  // chunks run along grid.y, whose limit this is

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

inline int blocks_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1 << 16));
}

template <class F>
void with_float(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else f(double{});
}

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
    if (mode == 1) v *= (static_cast<double>(x[r * C + c]) - (mean ? static_cast<double>(mean[r]) : 0.0)) *
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
  norm_forward_kernel<T, kCentered><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                                      kRowsPerBlock * kWarp>>>(ptr<T>(x), ptr<T>(w), ptr<T>(b), eps, ptr<T>(y),
                                                               ptr<T>(mean), ptr<T>(rstd), rows, C);
  QKV_CUDA_LAUNCHED("norm_forward_kernel");
}

template <class T, bool kCentered>
void norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dx, const Tensor& dweight, const Tensor& dbias, bool accumulate) {
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  if (rows > 0) {
    norm_backward_dx_kernel<T, kCentered><<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                                            kRowsPerBlock * kWarp>>>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(mean),
                                                                     ptr<T>(rstd), ptr<T>(dx), accumulate, rows, C);
    QKV_CUDA_LAUNCHED("norm_backward_dx_kernel");
  }
  if (dweight.defined()) column_sums<T>(1, ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), rows, C, ptr<T>(dweight));
  if (dbias.defined()) column_sums<T>(0, ptr<T>(dy), nullptr, nullptr, nullptr, rows, C, ptr<T>(dbias));
}

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

// ---- dropout ----

template <class T>
__global__ void dropout_kernel(const T* a, T* out, int64_t n, float p, T scale, uint64_t seed, uint64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = cpu::dropout_keep(seed, offset + static_cast<uint64_t>(i), p) ? a[i] * scale : T(0);
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

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t n = ids.numel(), C = weight.size(1);
  if (n * C == 0) return;
  with_float_index(weight.dtype(), ids.dtype(), [&](auto tt, auto it) {
    using T = decltype(tt);
    using I = decltype(it);
    embedding_forward_kernel<T, I><<<blocks_for(n * C, 256), 256>>>(ptr<T>(weight), weight.stride(0), ptr<I>(ids),
                                                                     ptr<T>(out), n, C);
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
  with_float(x.dtype(), [&](auto tt) { norm_forward<decltype(tt), false>(x, weight, Tensor(), eps, y, Tensor(), rstd); });
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight) {
  with_float(x.dtype(), [&](auto tt) {
    norm_backward<decltype(tt), false>(dy, x, weight, Tensor(), rstd, dx, dweight, Tensor(), false);
  });
}

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
    cross_entropy_backward_kernel<T, I><<<blocks_for(n * V, 256), 256>>>(ptr<T>(logits), logits.stride(0),
                                                                          ptr<I>(targets), ptr<T>(lse),
                                                                          static_cast<T>(scale), ignore_index,
                                                                          ptr<T>(dlogits), n, V);
  });
  QKV_CUDA_LAUNCHED("cross_entropy_backward_kernel");
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
