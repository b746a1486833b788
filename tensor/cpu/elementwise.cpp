// Elementwise kernels: out[i] = f(a[i], b[i], ...) over operands already broadcast to one shape.
//
// Every kernel walks its operands with for_each_strided (tensor/cpu/loops.h), which merges
// dims that are laid out back to back and hands us runs of the innermost dim. Inside a run we
// branch once on the strides: all unit strides (the contiguous case, a loop GCC vectorises),
// one operand with stride 0 (a scalar or a broadcast row: hoisted out of the loop), or the
// general strided loop. The per-element function is a lambda inlined into each branch: no
// virtual call or function pointer per element. float32 exp/tanh/sigmoid/gelu/silu use the
// branch-free expf_vec below so those loops vectorise; float64 calls libm.
//
// Float formulas:
//   gelu (tanh) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi), computed as x sigmoid(2u)
//   gelu (erf)  = 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x)
//   silu        = x sigmoid(x);  sigmoid(x) = 1 / (1 + e^-x), computed from e^-|x| (never overflows)
#include "tensor/cpu/elementwise.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/cpu/loops.h"

namespace qkv::cpu {
namespace {

// The per-element math below is forced inline: GCC's size heuristics otherwise leave a call to
// expf_vec in the larger lambdas (the activation derivatives), and a call blocks vectorisation.
#define QKV_INLINE inline __attribute__((always_inline))

constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;     // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;

template <class F>
void dispatch_float(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::f64) f(double{});
  else fail("[elementwise] float kernel given ", dtype_name(t));
}

template <class F>
void dispatch_numeric(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::boolean:
      return f(bool{});
    default:
      fail("[elementwise] no kernel for ", dtype_name(t));
  }
}

// out = f(x) over typed operands of one dtype. The run body is `flatten`ed so f (and what it
// calls) is inlined into each loop: an out-of-line call per element would block vectorisation.
template <class T, class F>
void map1(const Tensor& x, const Tensor& out, F f) {
  for_each_strided<2>(
      out.shape(), {&out.strides(), &x.strides()}, std::array<T*, 2>{out.data<T>(), x.data<T>()},
      [&](std::array<T*, 2> p, std::array<int64_t, 2> s, int64_t n) __attribute__((flatten)) {
        T* o = p[0];
        const T* a = p[1];
        if (s[0] == 1 && s[1] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
        } else if (s[1] == 0) {
          const T v = f(*a);
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = v;
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(a[i * s[1]]);
        }
      });
}

// out = f(x, y) over typed operands of one dtype.
template <class T, class F>
void map2(const Tensor& x, const Tensor& y, const Tensor& out, F f) {
  for_each_strided<3>(
      out.shape(), {&out.strides(), &x.strides(), &y.strides()},
      std::array<T*, 3>{out.data<T>(), x.data<T>(), y.data<T>()},
      [&](std::array<T*, 3> p, std::array<int64_t, 3> s, int64_t n) __attribute__((flatten)) {
        T* o = p[0];
        const T* a = p[1];
        const T* b = p[2];
        if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
        } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
          const T bv = *b;
          for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
        } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
          const T av = *a;
          for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(a[i * s[1]], b[i * s[2]]);
        }
      });
}

// out = f(x, y, z) over typed operands of one dtype.
template <class T, class F>
void map3(const Tensor& x, const Tensor& y, const Tensor& z, const Tensor& out, F f) {
  for_each_strided<4>(
      out.shape(), {&out.strides(), &x.strides(), &y.strides(), &z.strides()},
      std::array<T*, 4>{out.data<T>(), x.data<T>(), y.data<T>(), z.data<T>()},
      [&](std::array<T*, 4> p, std::array<int64_t, 4> s, int64_t n) __attribute__((flatten)) {
        T* o = p[0];
        const T* a = p[1];
        const T* b = p[2];
        const T* c = p[3];
        if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
          for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i], c[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(a[i * s[1]], b[i * s[2]], c[i * s[3]]);
        }
      });
}

// Operands of different element types: walk with byte strides; F gets (ptrs, byte strides, n).
template <int N, class F>
void for_each_bytes(const Shape& shape, const std::array<const Tensor*, N>& ts, F&& f) {
  std::array<Strides, N> st;
  std::array<const Strides*, N> stp;
  std::array<char*, N> base;
  for (int k = 0; k < N; ++k) {
    st[k] = ts[k]->strides();
    for (auto& v : st[k]) v *= static_cast<int64_t>(ts[k]->element_size());
    stp[k] = &st[k];
    base[k] = static_cast<char*>(ts[k]->raw_data());
  }
  for_each_strided<N>(shape, stp, base, f);
}

// float32 e^x over the whole float range, branch-free so loops of it vectorise (std::expf is a
// scalar libm call). e^x = 2^n e^r, n = round(x log2 e), r = x - n ln2 with ln2 split in a high
// part exact in float and a low correction; e^r by its degree-6 Taylor polynomial (|r| <= ln2/2,
// truncation < 2e-8 relative); 2^n built in the exponent bits in two halves so n = -126..128
// stays representable. Relative error <= ~4 ulp; x < -87.34 gives 0, x > 88.72 gives inf, NaN stays.
QKV_INLINE float expf_vec(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.72283f;
  const float xc = x < kLo ? kLo : (x > kHi ? kHi : x);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t's low mantissa bits then hold round(x log2 e)
  const float t = xc * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  int32_t ti;
  std::memcpy(&ti, &t, 4);
  const int32_t ni = ti - 0x4B400000;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? __builtin_inff() : y;
  return x != x ? x : y;
}

template <class T>
QKV_INLINE T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>) return expf_vec(x);
  else return std::exp(x);
}

template <class T>
QKV_INLINE T sigmoid_of(T x) {
  const T e = exp_of<T>(-std::fabs(x));  // in (0, 1]: no overflow for either sign
  const T r = T(1) / (T(1) + e);
  return x >= 0 ? r : e * r;
}

// tanh x = sign(x) (1 - e) / (1 + e), e = e^(-2|x|); below |x| = 0.2 that loses digits to
// cancellation, so use the series x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 (error < 1e-9 there).
template <class T>
QKV_INLINE T tanh_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const float ax = std::fabs(x);
    const float e = expf_vec(-2.0f * ax);
    const float big = (1.0f - e) / (1.0f + e);
    const float z = x * x;
    const float small = x + x * z * (-1.0f / 3.0f + z * (2.0f / 15.0f + z * (-17.0f / 315.0f + z * (62.0f / 2835.0f))));
    const float r = ax < 0.2f ? small : (x < 0 ? -big : big);
    return x != x ? x : r;
  } else {
    return std::tanh(x);
  }
}

// gelu_tanh(x) = 0.5 x (1 + tanh u) = x sigmoid(2u): one exp, no cancellation in the negative tail.
template <class T>
QKV_INLINE T gelu_tanh_of(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
  return x * sigmoid_of<T>(T(2) * u);
}

template <class T>
QKV_INLINE T gelu_erf_of(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2)));
}

// Calls run(f) with f(x) the op's function (scalar ops use s), so one list of formulas serves the
// plain kernel and the bias-fused one.
template <class T, class Run>
void with_unary(UnaryOp op, double sd, Run&& run) {
  const T s = static_cast<T>(sd);
  switch (op) {
    case UnaryOp::neg:
      return run([](T x) { return -x; });
    case UnaryOp::exp:
      return run([](T x) { return exp_of(x); });
    case UnaryOp::log:
      return run([](T x) { return std::log(x); });
    case UnaryOp::sqrt:
      return run([](T x) { return std::sqrt(x); });
    case UnaryOp::rsqrt:
      return run([](T x) { return T(1) / std::sqrt(x); });
    case UnaryOp::tanh:
      return run([](T x) { return tanh_of(x); });
    case UnaryOp::sigmoid:
      return run([](T x) { return sigmoid_of(x); });
    // x > 0 ? x : 0 keeps NaN as NaN (x > 0 is false for NaN, so write x's NaN explicitly).
    case UnaryOp::relu:
      return run([](T x) { return x > T(0) ? x : (x != x ? x : T(0)); });
    case UnaryOp::abs:
      return run([](T x) { return std::fabs(x); });
    case UnaryOp::gelu_tanh:
      return run([](T x) { return gelu_tanh_of(x); });
    case UnaryOp::gelu_erf:
      return run([](T x) { return gelu_erf_of(x); });
    case UnaryOp::silu:
      return run([](T x) { return x * sigmoid_of(x); });
    case UnaryOp::add_scalar:
      return run([s](T x) { return x + s; });
    case UnaryOp::mul_scalar:
      return run([s](T x) { return x * s; });
    case UnaryOp::rsub_scalar:
      return run([s](T x) { return s - x; });
    case UnaryOp::rdiv_scalar:
      return run([s](T x) { return s / x; });
    case UnaryOp::pow_scalar:
      // Common exponents get exact, vectorisable forms instead of the generic pow().
      if (sd == 2.0) return run([](T x) { return x * x; });
      if (sd == 3.0) return run([](T x) { return x * x * x; });
      if (sd == 1.0) return run([](T x) { return x; });
      if (sd == 0.5) return run([](T x) { return std::sqrt(x); });
      if (sd == -1.0) return run([](T x) { return T(1) / x; });
      if (sd == -0.5) return run([](T x) { return T(1) / std::sqrt(x); });
      return run([s](T x) { return std::pow(x, s); });
  }
}

// Calls run(f) with f(v, g) = g · f'(v) for the derivative kernel `op`.
template <class T, class Run>
void with_unary_grad(UnaryGradOp op, Run&& run) {
  switch (op) {
    case UnaryGradOp::relu:
      return run([](T v, T g) { return v > T(0) ? g : T(0); });
    case UnaryGradOp::gelu_tanh:
      // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u',  t = tanh u, u = k (x + c x^3), u' = k (1 + 3 c x^2);
      // with s = sigmoid(2u): 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s), so d/dx = s + 2 x s (1 - s) u'.
      return run([](T v, T g) {
        const T v2 = v * v;
        const T s = sigmoid_of<T>(T(2 * kSqrt2OverPi) * (v + T(kGeluCubic) * v2 * v));
        const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v2);
        return g * (s + T(2) * v * s * (T(1) - s) * du);
      });
    case UnaryGradOp::gelu_erf:
      // d/dx = Phi(x) + x phi(x)
      return run([](T v, T g) {
        const T cdf = T(0.5) * (T(1) + std::erf(v * T(kInvSqrt2)));
        const T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
        return g * (cdf + v * pdf);
      });
    case UnaryGradOp::silu:
      // d/dx = s (1 + x (1 - s)),  s = sigmoid(x)
      return run([](T v, T g) {
        const T sg = sigmoid_of(v);
        return g * (sg * (T(1) + v * (T(1) - sg)));
      });
  }
}

template <class T>
void unary_typed(UnaryOp op, const Tensor& a, const Tensor& out, double sd) {
  with_unary<T>(op, sd, [&](auto f) { map1<T>(a, out, f); });
}

template <class T>
void unary_grad_typed(UnaryGradOp op, const Tensor& x, const Tensor& dy, const Tensor& out) {
  with_unary_grad<T>(op, [&](auto f) { map2<T>(x, dy, out, f); });
}

// The bias-fused forms: the sum x + b is rounded to T first, as a separate add would round it.
template <class T>
void bias_unary_typed(UnaryOp op, const Tensor& a, const Tensor& bias, const Tensor& out) {
  with_unary<T>(op, 0.0, [&](auto f) { map2<T>(a, bias, out, [f](T x, T b) { return f(static_cast<T>(x + b)); }); });
}

template <class T>
void bias_unary_grad_typed(UnaryGradOp op, const Tensor& x, const Tensor& bias, const Tensor& dy, const Tensor& out) {
  with_unary_grad<T>(
      op, [&](auto f) { map3<T>(x, bias, dy, out, [f](T v, T b, T g) { return f(static_cast<T>(v + b), g); }); });
}

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::add:
      return map2<T>(a, b, out, [](T x, T y) { return static_cast<T>(x + y); });
    case BinaryOp::sub:
      return map2<T>(a, b, out, [](T x, T y) { return static_cast<T>(x - y); });
    case BinaryOp::mul:
      return map2<T>(a, b, out, [](T x, T y) { return static_cast<T>(x * y); });
    case BinaryOp::div:
      if constexpr (std::is_floating_point_v<T>) return map2<T>(a, b, out, [](T x, T y) { return x / y; });
      fail("[div] no integer kernel");
    case BinaryOp::maximum:
      // NaN propagates, as torch.maximum does.
      return map2<T>(a, b, out, [](T x, T y) { return (x != x || x > y) ? x : y; });
  }
}

}  // namespace

void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (out.dtype()) {
    case DType::f32:
      return binary_typed<float>(op, a, b, out);
    case DType::f64:
      return binary_typed<double>(op, a, b, out);
    case DType::i32:
      return binary_typed<int32_t>(op, a, b, out);
    case DType::i64:
      return binary_typed<int64_t>(op, a, b, out);
    default:
      fail("[elementwise] no arithmetic kernel for ", dtype_name(out.dtype()));
  }
}

void unary_forward(UnaryOp op, const Tensor& a, const Tensor& out, double s) {
  dispatch_float(out.dtype(), [&](auto tag) { unary_typed<decltype(tag)>(op, a, out, s); });
}

void unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& dy, const Tensor& out) {
  dispatch_float(out.dtype(), [&](auto tag) { unary_grad_typed<decltype(tag)>(op, x, dy, out); });
}

void bias_unary_forward(UnaryOp op, const Tensor& a, const Tensor& bias, const Tensor& out) {
  const Tensor rows = bias.expand(a.shape());
  dispatch_float(out.dtype(), [&](auto tag) { bias_unary_typed<decltype(tag)>(op, a, rows, out); });
}

void bias_unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& bias, const Tensor& dy, const Tensor& out) {
  const Tensor rows = bias.expand(x.shape());
  dispatch_float(out.dtype(), [&](auto tag) { bias_unary_grad_typed<decltype(tag)>(op, x, rows, dy, out); });
}

void compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_numeric(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto cmp) {
      for_each_bytes<3>(out.shape(), {&out, &a, &b}, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<bool*>(p[0] + i * s[0]) =
              cmp(*reinterpret_cast<const T*>(p[1] + i * s[1]), *reinterpret_cast<const T*>(p[2] + i * s[2]));
      });
    };
    switch (op) {
      case CompareOp::eq:
        return run([](T x, T y) { return x == y; });
      case CompareOp::gt:
        return run([](T x, T y) { return x > y; });
      case CompareOp::lt:
        return run([](T x, T y) { return x < y; });
    }
  });
}

void logical_and_forward(const Tensor& a, const Tensor& b, const Tensor& out) {
  map2<bool>(a, b, out, [](bool x, bool y) { return x && y; });
}

void logical_not_forward(const Tensor& a, const Tensor& out) {
  map1<bool>(a, out, [](bool x) { return !x; });
}

void where_forward(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_numeric(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_bytes<4>(
        out.shape(), {&out, &cond, &a, &b}, [&](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
          T* o = reinterpret_cast<T*>(p[0]);
          const bool* c = reinterpret_cast<const bool*>(p[1]);
          const T* x = reinterpret_cast<const T*>(p[2]);
          const T* y = reinterpret_cast<const T*>(p[3]);
          const int64_t so = s[0] / static_cast<int64_t>(sizeof(T)), sx = s[2] / static_cast<int64_t>(sizeof(T)),
                        sy = s[3] / static_cast<int64_t>(sizeof(T));
          if (so == 1 && s[1] == 1 && sx == 1 && sy == 1) {
            for (int64_t i = 0; i < n; ++i) {
              const T xv = x[i], yv = y[i];  // both loaded: a select, not a branch
              o[i] = c[i] ? xv : yv;
            }
          } else {
            for (int64_t i = 0; i < n; ++i) o[i * so] = c[i * s[1]] ? x[i * sx] : y[i * sy];
          }
        });
  });
}

void masked_fill_forward(const Tensor& a, const Tensor& mask, double value, const Tensor& out) {
  dispatch_numeric(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<T>(value);
    for_each_bytes<3>(out.shape(), {&out, &a, &mask}, [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
      T* o = reinterpret_cast<T*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      const bool* m = reinterpret_cast<const bool*>(p[2]);
      const int64_t so = s[0] / static_cast<int64_t>(sizeof(T)), sx = s[1] / static_cast<int64_t>(sizeof(T));
      if (so == 1 && sx == 1 && s[2] == 1) {
        for (int64_t i = 0; i < n; ++i) {
          const T xv = x[i];  // loaded unconditionally so the loop vectorises
          o[i] = m[i] ? v : xv;
        }
      } else if (so == 1 && sx == 1 && s[2] == 0) {
        if (*m)
          for (int64_t i = 0; i < n; ++i) o[i] = v;
        else std::memcpy(o, x, static_cast<size_t>(n) * sizeof(T));
      } else {
        for (int64_t i = 0; i < n; ++i) o[i * so] = m[i * s[2]] ? v : x[i * sx];
      }
    });
  });
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (alpha == 1.0) {
      map2<T>(a, b, a, [](T x, T y) { return static_cast<T>(x + y); });
    } else {
      const T al = static_cast<T>(alpha);
      map2<T>(a, b, a, [al](T x, T y) { return static_cast<T>(x + al * y); });
    }
  };
  switch (a.dtype()) {
    case DType::f32:
      return run(float{});
    case DType::f64:
      return run(double{});
    case DType::i32:
      return run(int32_t{});
    case DType::i64:
      return run(int64_t{});
    default:
      fail("[add_] no kernel for ", dtype_name(a.dtype()));
  }
}

void mul_inplace(const Tensor& a, double s) {
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<T>(s);
    map1<T>(a, a, [v](T x) { return x * v; });
  });
}

void fill(const Tensor& t, double value) {
  auto fill_bits = [&](auto bits) {
    using B = decltype(bits);
    for_each_bytes<1>(t.shape(), {&t}, [&](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
      if (s[0] == static_cast<int64_t>(sizeof(B))) {
        B* o = reinterpret_cast<B*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = bits;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<B*>(p[0] + i * s[0]) = bits;
      }
    });
  };
  switch (t.dtype()) {
    case DType::f32:
      return fill_bits(static_cast<float>(value));
    case DType::f64:
      return fill_bits(value);
    case DType::i32:
      return fill_bits(static_cast<int32_t>(value));
    case DType::i64:
      return fill_bits(static_cast<int64_t>(value));
    case DType::boolean:
      return fill_bits(static_cast<bool>(value != 0));
    case DType::bf16:
      return fill_bits(float_to_bf16(static_cast<float>(value)));
    case DType::f16:
      return fill_bits(float_to_f16(static_cast<float>(value)));
  }
}

bool all_finite(const Tensor& a) {
  if (!is_floating(a.dtype())) return true;
  if (a.dtype() != DType::f32 && a.dtype() != DType::f64) {
    for (double v : a.to_vector())
      if (!std::isfinite(v)) return false;
    return true;
  }
  bool finite = true;
  dispatch_float(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor c = a.contiguous();
    const T* p = c.data<T>();
    const int64_t n = c.numel();
    // x * 0 is 0 for finite x and NaN for +-inf and NaN: one vectorisable compare per element.
    int bad = 0;
#pragma omp parallel for reduction(| : bad) if (n >= 4 * kParallelGrain && !omp_in_parallel())
    for (int64_t i = 0; i < n; ++i) bad |= !(p[i] * T(0) == T(0));
    finite = bad == 0;
  });
  return finite;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // equal infinities differ by 0, not NaN
    const double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return NAN;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace qkv::cpu
