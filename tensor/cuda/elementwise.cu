// CUDA elementwise kernels: one thread per output element (grid-stride), each operand addressed
// through its own sizes and strides, so broadcast (stride-0) and transposed views need no copy.
// A contiguous operand is described as one dim of stride 1, which makes its address i itself.
// The formulas are those of tensor/cpu/elementwise.cpp:
//   sigmoid x = 1/(1+e) for x >= 0, e/(1+e) otherwise, e = exp(-|x|)   (no overflow)
//   gelu_tanh x = x·sigmoid(2u), u = sqrt(2/pi)·(x + 0.044715 x³)
//   gelu_erf x = 0.5 x (1 + erf(x/sqrt 2))
//   d gelu_tanh = s + 2 x s (1-s) u',  s = sigmoid(2u), u' = sqrt(2/pi)(1 + 3·0.044715 x²)
//   d gelu_erf = Phi(x) + x phi(x);  d silu = s (1 + x (1 - s)), s = sigmoid x
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/geometry.cuh"
#include "tensor/cuda/kernels.h"

namespace qkv::cuda {
namespace {

using detail::Geometry;
using detail::geometry_of;
using detail::offset_of;
using detail::ptr;

constexpr int kThreads = 256;
inline int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 16)); }

#define QKV_GRID_LOOP(i, n)                                                              \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <class T>
__device__ __forceinline__ T sigmoid_of(T x) {
  const T e = exp(-fabs(x));
  const T r = T(1) / (T(1) + e);
  return x >= T(0) ? r : e * r;
}

template <class T>
__device__ T apply_unary(int op, T x, T s) {
  switch (static_cast<UnaryOp>(op)) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::exp:
      return exp(x);
    case UnaryOp::log:
      return log(x);
    case UnaryOp::sqrt:
      return sqrt(x);
    case UnaryOp::rsqrt:
      return T(1) / sqrt(x);
    case UnaryOp::tanh:
      return tanh(x);
    case UnaryOp::sigmoid:
      return sigmoid_of(x);
    case UnaryOp::relu:
      return x > T(0) ? x : (x != x ? x : T(0));
    case UnaryOp::abs:
      return fabs(x);
    case UnaryOp::gelu_tanh: {
      const T u = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      return x * sigmoid_of(T(2) * u);
    }
    case UnaryOp::gelu_erf:
      return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
    case UnaryOp::silu:
      return x * sigmoid_of(x);
    case UnaryOp::add_scalar:
      return x + s;
    case UnaryOp::mul_scalar:
      return x * s;
    case UnaryOp::rsub_scalar:
      return s - x;
    case UnaryOp::rdiv_scalar:
      return s / x;
    case UnaryOp::pow_scalar:
      if (s == T(2)) return x * x;
      if (s == T(3)) return x * x * x;
      if (s == T(1)) return x;
      if (s == T(0.5)) return sqrt(x);
      if (s == T(-1)) return T(1) / x;
      if (s == T(-0.5)) return T(1) / sqrt(x);
      return pow(x, s);
  }
  return x;
}

template <class T>
__device__ T apply_unary_grad(int op, T v, T g) {
  switch (static_cast<UnaryGradOp>(op)) {
    case UnaryGradOp::relu:
      return v > T(0) ? g : T(0);
    case UnaryGradOp::gelu_tanh: {
      const T v2 = v * v;
      const T s = sigmoid_of(T(2 * kSqrt2OverPi) * (v + T(kGeluCubic) * v2 * v));
      const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * v2);
      return g * (s + T(2) * v * s * (T(1) - s) * du);
    }
    case UnaryGradOp::gelu_erf: {
      const T cdf = T(0.5) * (T(1) + erf(v * T(kInvSqrt2)));
      const T pdf = T(kInvSqrt2Pi) * exp(T(-0.5) * v * v);
      return g * (cdf + v * pdf);
    }
    case UnaryGradOp::silu: {
      const T s = sigmoid_of(v);
      return g * (s * (T(1) + v * (T(1) - s)));
    }
  }
  return g;
}

template <class T>
__device__ T apply_binary(int op, T x, T y) {
  switch (static_cast<BinaryOp>(op)) {
    case BinaryOp::add:
      return static_cast<T>(x + y);
    case BinaryOp::sub:
      return static_cast<T>(x - y);
    case BinaryOp::mul:
      return static_cast<T>(x * y);
    case BinaryOp::div:
      return static_cast<T>(x / y);
    // NaN in either operand propagates, as std::fmax would not.
    case BinaryOp::maximum:
      return x != x ? x : (y != y ? y : (x > y ? x : y));
  }
  return x;
}

template <class T>
__global__ void binary_kernel(int op, const T* a, Geometry ga, const T* b, Geometry gb, T* out, int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = apply_binary<T>(op, a[offset_of(i, ga)], b[offset_of(i, gb)]);
}

template <class T>
__global__ void unary_kernel(int op, const T* a, Geometry ga, T* out, int64_t n, T s) {
  QKV_GRID_LOOP(i, n) out[i] = apply_unary<T>(op, a[offset_of(i, ga)], s);
}

template <class T>
__global__ void unary_grad_kernel(int op, const T* x, Geometry gx, const T* dy, Geometry gdy, T* out, int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = apply_unary_grad<T>(op, x[offset_of(i, gx)], dy[offset_of(i, gdy)]);
}

// The bias-fused forms: a Linear's bias (bias[i mod C], out contiguous) and its activation in one
// pass, x + b rounded to T first as a separate add would round it.
template <class T>
__global__ void bias_unary_kernel(int op, const T* a, Geometry ga, const T* bias, int64_t C, T* out, int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = apply_unary<T>(op, static_cast<T>(a[offset_of(i, ga)] + bias[i % C]), T(0));
}

template <class T>
__global__ void bias_unary_grad_kernel(int op, const T* x, Geometry gx, const T* bias, int64_t C, const T* dy,
                                       Geometry gdy, T* out, int64_t n) {
  QKV_GRID_LOOP(i, n) {
    out[i] = apply_unary_grad<T>(op, static_cast<T>(x[offset_of(i, gx)] + bias[i % C]), dy[offset_of(i, gdy)]);
  }
}

template <class T>
__global__ void add_inplace_kernel(T* a, Geometry ga, const T* b, Geometry gb, int64_t n, T alpha, bool unit) {
  QKV_GRID_LOOP(i, n) {
    T& dst = a[offset_of(i, ga)];
    const T v = b[offset_of(i, gb)];
    dst = unit ? static_cast<T>(dst + v) : static_cast<T>(dst + alpha * v);
  }
}

template <class T>
__global__ void mul_inplace_kernel(T* a, Geometry ga, int64_t n, T s) {
  QKV_GRID_LOOP(i, n) a[offset_of(i, ga)] *= s;
}

// Conversions through one wide type: int64 between integer/bool types (exact), double otherwise.
template <class T>
struct Wide {
  using type = double;
};
template <>
struct Wide<int32_t> {
  using type = int64_t;
};
template <>
struct Wide<int64_t> {
  using type = int64_t;
};
template <>
struct Wide<bool> {
  using type = int64_t;
};

template <class T>
__device__ __forceinline__ double to_double(T v) {
  return static_cast<double>(v);
}
template <>
__device__ __forceinline__ double to_double(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}
template <>
__device__ __forceinline__ double to_double(__half v) {
  return static_cast<double>(__half2float(v));
}

template <class T>
__device__ __forceinline__ T from_double(double v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ bool from_double(double v) {
  return v != 0.0;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_double(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));
}
template <>
__device__ __forceinline__ __half from_double(double v) {
  return __float2half_rn(static_cast<float>(v));
}

template <class S, class D>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else if constexpr ((std::is_integral_v<S>)&&(std::is_integral_v<D>)) {
    if constexpr (std::is_same_v<D, bool>) return v != 0;
    return static_cast<D>(static_cast<int64_t>(v));
  } else {
    return from_double<D>(to_double<S>(v));
  }
}

template <class T>
__global__ void compare_kernel(int op, const T* a, Geometry ga, const T* b, Geometry gb, bool* out, int64_t n) {
  QKV_GRID_LOOP(i, n) {
    const T x = a[offset_of(i, ga)], y = b[offset_of(i, gb)];
    const auto kind = static_cast<CompareOp>(op);
    out[i] = kind == CompareOp::eq ? x == y : kind == CompareOp::gt ? x > y : x < y;
  }
}

__global__ void logical_kernel(bool is_and, const bool* a, Geometry ga, const bool* b, Geometry gb, bool* out,
                               int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = is_and ? (a[offset_of(i, ga)] && b[offset_of(i, gb)]) : !a[offset_of(i, ga)];
}

template <class T>
__global__ void where_kernel(const bool* c, Geometry gc, const T* a, Geometry ga, const T* b, Geometry gb, T* out,
                             int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = c[offset_of(i, gc)] ? a[offset_of(i, ga)] : b[offset_of(i, gb)];
}

template <class T>
__global__ void masked_fill_kernel(const T* a, Geometry ga, const bool* m, Geometry gm, T value, T* out, int64_t n) {
  QKV_GRID_LOOP(i, n) out[i] = m[offset_of(i, gm)] ? value : a[offset_of(i, ga)];
}

template <class T>
__global__ void fill_kernel(T* t, Geometry g, int64_t n, T value) {
  QKV_GRID_LOOP(i, n) t[offset_of(i, g)] = value;
}

template <class S, class D>
__global__ void copy_kernel(const S* src, Geometry gs, D* dst, Geometry gd, int64_t n) {
  QKV_GRID_LOOP(i, n) dst[offset_of(i, gd)] = convert<S, D>(src[offset_of(i, gs)]);
}

// Calls f(T{}) with T the C++ type of dtype.
template <class F>
void with_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::bf16:
      return f(__nv_bfloat16{});
    case DType::f16:
      return f(__half{});
    case DType::boolean:
      return f(bool{});
  }
  fail("[", op, "] no CUDA kernel for ", dtype_name(t));
}

template <class F>
void with_float(DType t, const char* op, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  fail("[", op, "] CUDA kernel needs float32 or float64, not ", dtype_name(t));
}

template <class F>
void with_arith(DType t, const char* op, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::f64) return f(double{});
  if (t == DType::i32) return f(int32_t{});
  if (t == DType::i64) return f(int64_t{});
  fail("[", op, "] no CUDA kernel for ", dtype_name(t));
}

}  // namespace

void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "binary"), gb = geometry_of(b, "binary");
  with_arith(out.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(a), ga, ptr<T>(b), gb, ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("binary_kernel");
}

void unary_forward(UnaryOp op, const Tensor& a, const Tensor& out, double s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "unary");
  with_float(out.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T>
        <<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(a), ga, ptr<T>(out), n, static_cast<T>(s));
  });
  QKV_CUDA_LAUNCHED("unary_kernel");
}

void unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& dy, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry gx = geometry_of(x, "unary_backward"), gdy = geometry_of(dy, "unary_backward");
  with_float(out.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    unary_grad_kernel<T>
        <<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(x), gx, ptr<T>(dy), gdy, ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("unary_grad_kernel");
}

void bias_unary_forward(UnaryOp op, const Tensor& a, const Tensor& bias, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor b = bias.contiguous();
  const Geometry ga = geometry_of(a, "bias_unary");
  with_float(out.dtype(), "bias_unary", [&](auto tag) {
    using T = decltype(tag);
    bias_unary_kernel<T>
        <<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(a), ga, ptr<T>(b), b.numel(), ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("bias_unary_kernel");
}

void bias_unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& bias, const Tensor& dy, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor b = bias.contiguous();
  const Geometry gx = geometry_of(x, "bias_unary_backward"), gdy = geometry_of(dy, "bias_unary_backward");
  with_float(out.dtype(), "bias_unary_backward", [&](auto tag) {
    using T = decltype(tag);
    bias_unary_grad_kernel<T><<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(x), gx, ptr<T>(b), b.numel(),
                                                           ptr<T>(dy), gdy, ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("bias_unary_grad_kernel");
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "add_"), gb = geometry_of(b, "add_");
  with_arith(a.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    add_inplace_kernel<T>
        <<<blocks_for(n), kThreads>>>(ptr<T>(a), ga, ptr<T>(b), gb, n, static_cast<T>(alpha), alpha == 1.0);
  });
  QKV_CUDA_LAUNCHED("add_inplace_kernel");
}

void mul_inplace(const Tensor& a, double s) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "mul_");
  with_float(a.dtype(), "mul_", [&](auto tag) {
    using T = decltype(tag);
    mul_inplace_kernel<T><<<blocks_for(n), kThreads>>>(ptr<T>(a), ga, n, static_cast<T>(s));
  });
  QKV_CUDA_LAUNCHED("mul_inplace_kernel");
}

void compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "compare"), gb = geometry_of(b, "compare");
  with_arith(a.dtype(), "compare", [&](auto tag) {
    using T = decltype(tag);
    compare_kernel<T>
        <<<blocks_for(n), kThreads>>>(static_cast<int>(op), ptr<T>(a), ga, ptr<T>(b), gb, ptr<bool>(out), n);
  });
  QKV_CUDA_LAUNCHED("compare_kernel");
}

void logical_and_forward(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  logical_kernel<<<blocks_for(n), kThreads>>>(true, ptr<bool>(a), geometry_of(a, "logical_and"), ptr<bool>(b),
                                              geometry_of(b, "logical_and"), ptr<bool>(out), n);
  QKV_CUDA_LAUNCHED("logical_kernel");
}

void logical_not_forward(const Tensor& a, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "logical_not");
  logical_kernel<<<blocks_for(n), kThreads>>>(false, ptr<bool>(a), ga, ptr<bool>(a), ga, ptr<bool>(out), n);
  QKV_CUDA_LAUNCHED("logical_kernel");
}

void where_forward(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry gc = geometry_of(cond, "where"), ga = geometry_of(a, "where"), gb = geometry_of(b, "where");
  with_type(out.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<blocks_for(n), kThreads>>>(ptr<bool>(cond), gc, ptr<T>(a), ga, ptr<T>(b), gb, ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("where_kernel");
}

void masked_fill_forward(const Tensor& a, const Tensor& mask, double value, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Geometry ga = geometry_of(a, "masked_fill"), gm = geometry_of(mask, "masked_fill");
  with_arith(out.dtype(), "masked_fill", [&](auto tag) {
    using T = decltype(tag);
    masked_fill_kernel<T>
        <<<blocks_for(n), kThreads>>>(ptr<T>(a), ga, ptr<bool>(mask), gm, static_cast<T>(value), ptr<T>(out), n);
  });
  QKV_CUDA_LAUNCHED("masked_fill_kernel");
}

void fill(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const Geometry g = geometry_of(t, "fill_");
  with_type(t.dtype(), "fill_", [&](auto tag) {
    using T = decltype(tag);
    T v{};
    if constexpr (std::is_same_v<T, __nv_bfloat16>) v = __float2bfloat16_rn(static_cast<float>(value));
    else if constexpr (std::is_same_v<T, __half>) v = __float2half_rn(static_cast<float>(value));
    else if constexpr (std::is_same_v<T, bool>) v = value != 0.0;
    else v = static_cast<T>(value);
    fill_kernel<T><<<blocks_for(n), kThreads>>>(ptr<T>(t), g, n, v);
  });
  QKV_CUDA_LAUNCHED("fill_kernel");
}

void copy_cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  QKV_CHECK(src.device() == Device::cuda && dst.device() == Device::cuda, "[copy] CUDA copy between devices: use to()");
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    QKV_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(n) * dst.element_size(),
                                   cudaMemcpyDeviceToDevice));
    return;
  }
  const Geometry gs = geometry_of(src, "copy"), gd = geometry_of(dst, "copy");
  with_type(src.dtype(), "copy", [&](auto s_tag) {
    using S = decltype(s_tag);
    with_type(dst.dtype(), "copy", [&](auto d_tag) {
      using D = decltype(d_tag);
      copy_kernel<S, D><<<blocks_for(n), kThreads>>>(ptr<S>(src), gs, ptr<D>(dst), gd, n);
    });
  });
  QKV_CUDA_LAUNCHED("copy_kernel");
}

}  // namespace qkv::cuda
