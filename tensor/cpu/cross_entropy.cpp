// Fused log-softmax + negative log-likelihood over rows of logits [N, V], targets [N].
//   lse_i  = m_i + log sum_v exp(z_iv - m_i),  m_i = max_v z_iv     (stable: exp <= 1)
//   loss_i = lse_i - z_i,t_i                  (rows with t_i == ignore_index contribute nothing)
//   backward: dz_iv = (exp(z_iv - lse_i) - [v == t_i]) * scale,  scale = dloss / count
// Why: the [N, V] softmax is never materialised in forward (only lse [N] is kept), and backward
// recomputes it in the same pass that writes dlogits: one read of the logits each way, which is
// what matters when V is a 50k vocabulary. Rows run in parallel; the per-row losses are summed in
// row order afterwards, so the loss does not depend on the thread count. float32 uses fast_exp
// (vectorised) with float64 row sums; float64 uses std::exp.
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/fast_exp.h"
#include "tensor/cpu/nn_kernels.h"

namespace qkv::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;

inline float exp_t(float x) { return fast_exp(x); }
inline double exp_t(double x) { return std::exp(x); }

template <class T>
T row_lse(const T* z, int64_t v) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < v; ++j) m = z[j] > m ? z[j] : m;
  if (m == -std::numeric_limits<T>::infinity()) return m;  // all -inf: lse = -inf, not NaN
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < v; ++j) s += static_cast<double>(exp_t(z[j] - m));
  return static_cast<T>(static_cast<double>(m) + std::log(s));
}

template <class T, class I>
double forward_typed(const Tensor& logits, const Tensor& targets, int64_t ignore, const Tensor& lse) {
  const int64_t n = logits.shape()[0], v = logits.shape()[1], rs = logits.strides()[0];
  const T* z = logits.data<T>();
  const I* t = targets.data<I>();
  T* pl = lse.data<T>();
  std::vector<double> row_loss(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * v >= kGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) {
    const T* zr = z + i * rs;
    pl[i] = row_lse(zr, v);
    const int64_t ti = static_cast<int64_t>(t[i]);
    row_loss[i] = ti == ignore ? 0.0 : static_cast<double>(pl[i]) - static_cast<double>(zr[ti]);
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += row_loss[i];
  return total;
}

template <class T, class I>
void backward_typed(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale, int64_t ignore,
                    const Tensor& dlogits) {
  const int64_t n = logits.shape()[0], v = logits.shape()[1], rs = logits.strides()[0];
  const T* z = logits.data<T>();
  const I* t = targets.data<I>();
  const T* pl = lse.data<T>();
  T* dz = dlogits.data<T>();
  const T sc = static_cast<T>(scale);
#pragma omp parallel for schedule(static) if (n * v >= kGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) {
    const T* zr = z + i * rs;
    T* dr = dz + i * v;
    const int64_t ti = static_cast<int64_t>(t[i]);
    if (ti == ignore) {
      for (int64_t j = 0; j < v; ++j) dr[j] = T(0);
      continue;
    }
    const T l = pl[i];
    for (int64_t j = 0; j < v; ++j) dr[j] = exp_t(zr[j] - l) * sc;
    dr[ti] -= sc;
  }
}

}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse) {
  double total = 0;
  dispatch_float_index(logits.dtype(), targets.dtype(), [&](auto t, auto i) {
    total = forward_typed<decltype(t), decltype(i)>(logits, targets, ignore_index, lse);
  });
  return total;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                            int64_t ignore_index, const Tensor& dlogits) {
  dispatch_float_index(logits.dtype(), targets.dtype(), [&](auto t, auto i) {
    backward_typed<decltype(t), decltype(i)>(logits, targets, lse, scale, ignore_index, dlogits);
  });
}

}  // namespace qkv::cpu
