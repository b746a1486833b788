// Embedding gather / scatter-add, column sums, and inverted dropout.
//   embedding:  out[i, :] = weight[ids[i], :]                 ids [n], weight [V, C], out [n, C]
//   backward:   dweight[ids[i], :] += dy[i, :]                 in increasing i for every element
//   sum_rows:   out[c] = sum_r x[r, c]
//   dropout:    out[i] = keep_i ? a[i] / (1 - p) : 0,  keep_i = uniform(philox(seed, offset + i)) >= p
// Why: the scatter-add of repeated ids would race if split over rows, so backward and sum_rows
// split the COLUMNS over threads; each element still sums its rows in row order, so the result is
// bitwise the same on any thread count. Dropout keeps no mask: the counter-based draw is redone
// by the backward, which is the same kernel applied to dy.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "tensor/cpu/nn_kernels.h"
#include "tensor/cpu/random_bits.h"

namespace qkv::cpu {

namespace {

constexpr int64_t kGrain = 1 << 16;  // elements of work below which a kernel stays on one thread

// [c0, c1) of `cols` for thread t of nt, cut at multiples of 64 bytes so that threads seldom
// write the same cache line. Which thread owns a column never changes what is summed, or in what order.
inline void column_range(int64_t cols, int t, int nt, size_t elem, int64_t& c0, int64_t& c1) {
  const int64_t line = std::max<int64_t>(1, 64 / static_cast<int64_t>(elem));
  const int64_t lines = (cols + line - 1) / line;
  c0 = std::min(cols, lines * t / nt * line);
  c1 = std::min(cols, lines * (t + 1) / nt * line);
}

template <class T, class I>
void embedding_forward_typed(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  const int64_t n = ids.numel(), c = weight.shape()[1], ws = weight.strides()[0];
  const T* w = weight.data<T>();
  const I* id = ids.data<I>();
  T* o = out.data<T>();
#pragma omp parallel for schedule(static) if (n * c >= 2 * kGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * c, w + static_cast<int64_t>(id[i]) * ws, c * sizeof(T));
}

template <class T, class I>
void embedding_backward_typed(const Tensor& ids, const Tensor& dy, const Tensor& dweight) {
  const int64_t n = ids.numel(), c = dy.shape()[1];
  const I* id = ids.data<I>();
  const T* g = dy.data<T>();
  T* dw = dweight.data<T>();
#pragma omp parallel if (n * c >= 2 * kGrain && !omp_in_parallel())
  {
    int64_t c0, c1;
    column_range(c, omp_get_thread_num(), omp_get_num_threads(), sizeof(T), c0, c1);
    for (int64_t i = 0; i < n; ++i) {
      T* dst = dw + static_cast<int64_t>(id[i]) * c;
      const T* src = g + i * c;
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

template <class T>
void sum_rows_typed(const Tensor& x, const Tensor& out) {
  const int64_t r = x.shape()[0], c = x.shape()[1];
  const T* px = x.data<T>();
  T* po = out.data<T>();
#pragma omp parallel if (r * c >= 2 * kGrain && !omp_in_parallel())
  {
    int64_t c0, c1;
    column_range(c, omp_get_thread_num(), omp_get_num_threads(), sizeof(T), c0, c1);
    // A strip of columns accumulates in float64 on the stack, rows in order.
    constexpr int64_t kStrip = 256;
    double acc[kStrip];
    for (int64_t s0 = c0; s0 < c1; s0 += kStrip) {
      const int64_t len = std::min(kStrip, c1 - s0);
      std::fill(acc, acc + len, 0.0);
      for (int64_t i = 0; i < r; ++i) {
        const T* row = px + i * c + s0;
        for (int64_t j = 0; j < len; ++j) acc[j] += static_cast<double>(row[j]);
      }
      for (int64_t j = 0; j < len; ++j) po[s0 + j] = static_cast<T>(acc[j]);
    }
  }
}

template <class T>
void dropout_typed(const Tensor& a, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  const int64_t n = a.numel();
  const T* pa = a.data<T>();
  T* po = out.data<T>();
  const float pf = static_cast<float>(p);
  const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n >= kGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i)
    po[i] = dropout_keep(seed, offset + static_cast<uint64_t>(i), pf) ? pa[i] * scale : T(0);
}

}  // namespace

void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  dispatch_float_index(weight.dtype(), ids.dtype(),
                       [&](auto t, auto i) { embedding_forward_typed<decltype(t), decltype(i)>(weight, ids, out); });
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dweight) {
  dispatch_float_index(dy.dtype(), ids.dtype(),
                       [&](auto t, auto i) { embedding_backward_typed<decltype(t), decltype(i)>(ids, dy, dweight); });
}

void sum_rows(const Tensor& x, const Tensor& out) {
  if (x.dtype() == DType::f32) sum_rows_typed<float>(x, out);
  else sum_rows_typed<double>(x, out);
}

void dropout_forward(const Tensor& a, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  if (a.dtype() == DType::f32) dropout_typed<float>(a, p, seed, offset, out);
  else dropout_typed<double>(a, p, seed, offset, out);
}

}  // namespace qkv::cpu
