// Reductions and softmax.
//
// sum over a set of dims, three layouts:
//   * everything reduced: one flat parallel sum over a contiguous copy;
//   * the last (non-trivial) dim reduced ("rows"): one output per kept index, OpenMP over outputs,
//     each summing its reduced sub-block with a unit-stride SIMD loop where the layout allows;
//   * the last dim kept ("columns", e.g. a bias gradient [N, C] -> [C]): accumulate whole rows of
//     the input into a float64 buffer (out[c] += a[n, c] vectorises along c); threads split the
//     last dim so no two write the same output.
//   Sums accumulate in float64 for both dtypes: a float32 gradient summed over a million rows
//   keeps its digits.
// max/argmax over one dim: first maximum wins (strict >), NaN counts as the maximum.
// softmax(x)_i = e^(x_i - m) / sum_j e^(x_j - m), m = max_j x_j: subtracting the row max keeps
// e^(.) <= 1 (no overflow) and leaves the value unchanged (the e^-m cancels).
// log_softmax(x)_i = (x_i - m) - log sum_j e^(x_j - m).
// Backward: softmax dx = y (dy - <dy, y>); log_softmax dx = dy - e^y sum(dy).
// The last-dim case (attention rows, LM-head rows) runs one contiguous row per OpenMP iteration
// with float32 exp from fast_exp.h (vectorised); other dims take a strided path.
#include "tensor/cpu/reduce.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/cpu/fast_exp.h"
#include "tensor/cpu/loops.h"

namespace qkv::cpu {
namespace {

template <class F>
void dispatch_float(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::f64) f(double{});
  else fail("[reduce] float kernel given ", dtype_name(t));
}

template <class T>
inline T exp_t(T v) {
  if constexpr (std::is_same_v<T, float>) return fast_exp(v);
  else return std::exp(v);
}

bool worth_parallel(int64_t work) { return work >= 2 * kParallelGrain && !omp_in_parallel(); }

template <class T>
void sum_typed(const Tensor& a, const std::vector<bool>& red, const Tensor& out, double scale) {
  const Shape& shape = a.shape();
  const Strides& strides = a.strides();
  const int nd = a.dim();
  T* o = out.data<T>();
  const int64_t out_n = out.numel();
  if (out_n == 0) return;
  if (a.numel() == 0) {
    for (int64_t i = 0; i < out_n; ++i) o[i] = T(0);
    return;
  }
  int last = -1;
  for (int d = nd - 1; d >= 0; --d)
    if (shape[d] > 1) {
      last = d;
      break;
    }

  if (out_n == 1) {
    const Tensor c = a.contiguous();
    const T* p = c.data<T>();
    const int64_t n = c.numel();
    double s = 0;
#pragma omp parallel for simd reduction(+ : s) if (worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]);
    o[0] = static_cast<T>(s * scale);
    return;
  }

  if (red[last]) {
    Shape kshape, rshape;
    Strides kstrides, rstrides;
    for (int d = 0; d < nd; ++d) {
      if (red[d]) {
        rshape.push_back(shape[d]);
        rstrides.push_back(strides[d]);
      } else {
        kshape.push_back(shape[d]);
        kstrides.push_back(strides[d]);
      }
    }
    const T* base = a.data<T>();
#pragma omp parallel for schedule(static) if (worth_parallel(a.numel()))
    for (int64_t oi = 0; oi < out_n; ++oi) {
      int64_t rem = oi, off = 0;
      for (int k = static_cast<int>(kshape.size()) - 1; k >= 0; --k) {
        off += (rem % kshape[k]) * kstrides[k];
        rem /= kshape[k];
      }
      double s = 0;
      for_each_strided<1>(
          rshape, {&rstrides}, std::array<const T*, 1>{base + off},
          [&](std::array<const T*, 1> p, std::array<int64_t, 1> st, int64_t n) {
            const T* x = p[0];
            double acc = 0;
            if (st[0] == 1) {
#pragma omp simd reduction(+ : acc)
              for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i]);
            } else {
              for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(x[i * st[0]]);
            }
            s += acc;
          },
          false);
      o[oi] = static_cast<T>(s * scale);
    }
    return;
  }

  // Columns: acc (out's shape, float64) viewed with stride 0 on the reduced dims, += a.
  std::vector<double> acc(static_cast<size_t>(out_n), 0.0);
  const Strides ostr = contiguous_strides(out.shape());
  Strides accb(nd), ab(nd);
  for (int d = 0; d < nd; ++d) {
    accb[d] = red[d] ? 0 : ostr[d] * static_cast<int64_t>(sizeof(double));
    ab[d] = strides[d] * static_cast<int64_t>(sizeof(T));
  }
  const int64_t len = shape[last];
  const int threads = worth_parallel(a.numel()) ? omp_get_max_threads() : 1;
  const int64_t chunks = std::min<int64_t>(threads, len);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = len * c / chunks, hi = len * (c + 1) / chunks;
    Shape sub = shape;
    sub[last] = hi - lo;
    char* pacc = reinterpret_cast<char*>(acc.data()) + lo * accb[last];
    char* pa = reinterpret_cast<char*>(a.data<T>()) + lo * ab[last];
    for_each_strided<2>(
        sub, {&accb, &ab}, std::array<char*, 2>{pacc, pa},
        [&](std::array<char*, 2> p, std::array<int64_t, 2> st, int64_t n) {
          double* q = reinterpret_cast<double*>(p[0]);
          const T* x = reinterpret_cast<const T*>(p[1]);
          if (st[0] == static_cast<int64_t>(sizeof(double)) && st[1] == static_cast<int64_t>(sizeof(T))) {
            for (int64_t i = 0; i < n; ++i) q[i] += static_cast<double>(x[i]);
          } else {
            const int64_t sq = st[0] / static_cast<int64_t>(sizeof(double)),
                          sx = st[1] / static_cast<int64_t>(sizeof(T));
            for (int64_t i = 0; i < n; ++i) q[i * sq] += static_cast<double>(x[i * sx]);
          }
        },
        false);
  }
  for (int64_t i = 0; i < out_n; ++i) o[i] = static_cast<T>(acc[static_cast<size_t>(i)] * scale);
}

template <class T>
void max_typed(const Tensor& a, int dim, const Tensor& values, const Tensor& indices) {
  Shape rs = a.shape();
  const int64_t n = rs[dim];
  rs[dim] = 1;
  const int64_t sd = a.stride(dim);
  Strides vb = values.strides(), ib = indices.strides(), ab = a.strides();  // in bytes below
  for (auto& v : vb) v *= static_cast<int64_t>(sizeof(T));
  for (auto& v : ib) v *= static_cast<int64_t>(sizeof(int64_t));
  for (auto& v : ab) v *= static_cast<int64_t>(sizeof(T));
  for_each_strided<3>(
      rs, {&vb, &ib, &ab},
      std::array<char*, 3>{reinterpret_cast<char*>(values.data<T>()), reinterpret_cast<char*>(indices.data<int64_t>()),
                           reinterpret_cast<char*>(a.data<T>())},
      [&](std::array<char*, 3> p, std::array<int64_t, 3> st, int64_t runs) {
        for (int64_t j = 0; j < runs; ++j) {
          const T* row = reinterpret_cast<const T*>(p[2] + j * st[2]);
          T best = row[0];
          int64_t bi = 0;
          for (int64_t k = 1; k < n && best == best; ++k) {
            const T cur = row[k * sd];
            if (cur > best || cur != cur) {
              best = cur;
              bi = k;
            }
          }
          *reinterpret_cast<T*>(p[0] + j * st[0]) = best;
          *reinterpret_cast<int64_t*>(p[1] + j * st[1]) = bi;
        }
      });
}

// One contiguous row of softmax / log_softmax.
template <class T>
inline void softmax_row(const T* x, T* y, int64_t n, bool log) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  T s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += exp_t<T>(x[i] - m);
    const T ls = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      const T e = exp_t<T>(x[i] - m);
      y[i] = e;
      s += e;
    }
    const T inv = T(1) / s;
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

// The same over a row with strides (dim not last).
template <class T>
inline void softmax_strided(const T* x, int64_t xs, T* y, int64_t ys, int64_t n, bool log) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i * xs] > m ? x[i * xs] : m;
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += exp_t<T>(x[i * xs] - m);
  if (log) {
    const T ls = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i * ys] = (x[i * xs] - m) - ls;
  } else {
    const T inv = T(1) / s;
    for (int64_t i = 0; i < n; ++i) y[i * ys] = exp_t<T>(x[i * xs] - m) * inv;
  }
}

template <class T>
inline void softmax_backward_row(const T* y, const T* dy, T* dx, int64_t n, bool log) {
  T s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += dy[i];
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - exp_t<T>(y[i]) * s;
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += dy[i] * y[i];
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - s);
  }
}

template <class T>
inline void softmax_backward_strided(const T* y, int64_t ys, const T* dy, int64_t gs, T* dx, int64_t xs, int64_t n,
                                     bool log) {
  T s = 0;
  if (log) {
    for (int64_t i = 0; i < n; ++i) s += dy[i * gs];
    for (int64_t i = 0; i < n; ++i) dx[i * xs] = dy[i * gs] - exp_t<T>(y[i * ys]) * s;
  } else {
    for (int64_t i = 0; i < n; ++i) s += dy[i * gs] * y[i * ys];
    for (int64_t i = 0; i < n; ++i) dx[i * xs] = y[i * ys] * (dy[i * gs] - s);
  }
}

template <class T>
void softmax_typed(const Tensor& x, int dim, const Tensor& y, bool log) {
  const int64_t n = x.size(dim);
  if (y.numel() == 0) return;
  if (dim == x.dim() - 1) {
    const Tensor xc = x.contiguous();
    const T* px = xc.data<T>();
    T* py = y.data<T>();
    const int64_t rows = xc.numel() / n;
#pragma omp parallel for schedule(static) if (rows > 1 && worth_parallel(xc.numel()))
    for (int64_t r = 0; r < rows; ++r) softmax_row<T>(px + r * n, py + r * n, n, log);
    return;
  }
  Shape rs = x.shape();
  rs[dim] = 1;
  const int64_t xs = x.stride(dim), ys = y.stride(dim);
  for_each_strided<2>(rs, {&y.strides(), &x.strides()}, std::array<T*, 2>{y.data<T>(), x.data<T>()},
                      [&](std::array<T*, 2> p, std::array<int64_t, 2> st, int64_t runs) {
                        for (int64_t j = 0; j < runs; ++j)
                          softmax_strided<T>(p[1] + j * st[1], xs, p[0] + j * st[0], ys, n, log);
                      });
}

template <class T>
void softmax_backward_typed(const Tensor& y, const Tensor& dy, int dim, const Tensor& dx, bool log) {
  const int64_t n = y.size(dim);
  if (dx.numel() == 0) return;
  if (dim == y.dim() - 1) {
    const Tensor yc = y.contiguous(), gc = dy.contiguous();
    const T* py = yc.data<T>();
    const T* pg = gc.data<T>();
    T* px = dx.data<T>();
    const int64_t rows = yc.numel() / n;
#pragma omp parallel for schedule(static) if (rows > 1 && worth_parallel(yc.numel()))
    for (int64_t r = 0; r < rows; ++r) softmax_backward_row<T>(py + r * n, pg + r * n, px + r * n, n, log);
    return;
  }
  Shape rs = y.shape();
  rs[dim] = 1;
  const int64_t ys = y.stride(dim), gs = dy.stride(dim), xs = dx.stride(dim);
  for_each_strided<3>(
      rs, {&dx.strides(), &y.strides(), &dy.strides()}, std::array<T*, 3>{dx.data<T>(), y.data<T>(), dy.data<T>()},
      [&](std::array<T*, 3> p, std::array<int64_t, 3> st, int64_t runs) {
        for (int64_t j = 0; j < runs; ++j)
          softmax_backward_strided<T>(p[1] + j * st[1], ys, p[2] + j * st[2], gs, p[0] + j * st[0], xs, n, log);
      });
}

}  // namespace

void sum_forward(const Tensor& a, const std::vector<bool>& reduce, const Tensor& out, double scale) {
  dispatch_float(a.dtype(), [&](auto tag) { sum_typed<decltype(tag)>(a, reduce, out, scale); });
}

void max_forward(const Tensor& a, int dim, const Tensor& values, const Tensor& indices) {
  dispatch_float(a.dtype(), [&](auto tag) { max_typed<decltype(tag)>(a, dim, values, indices); });
}

void softmax_forward(const Tensor& x, int dim, const Tensor& y, bool log) {
  dispatch_float(x.dtype(), [&](auto tag) { softmax_typed<decltype(tag)>(x, dim, y, log); });
}

void softmax_backward(const Tensor& y, const Tensor& dy, int dim, const Tensor& dx, bool log) {
  dispatch_float(y.dtype(), [&](auto tag) { softmax_backward_typed<decltype(tag)>(y, dy, dim, dx, log); });
}

}  // namespace qkv::cpu
