// Elementwise, comparison and selection front ends: check dtypes/devices, broadcast the operands
// (expand views, no copies), allocate a contiguous result on the operands' device, call the kernel
// in tensor/cpu/elementwise.cpp or tensor/cuda/elementwise.cu.
#include <cmath>

#include "tensor/cpu/elementwise.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"

namespace qkv {

namespace {

using detail::require_defined;
using detail::require_float;
using detail::require_same_dtype;

using detail::require_same_device;

// Both defined, on one device, of one dtype.
void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  require_defined(op, a, "a");
  require_defined(op, b, "b");
  require_same_device(op, a, b);
  require_same_dtype(op, a, b);
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

Tensor binary(const char* op, cpu::BinaryOp kind, const Tensor& a, const Tensor& b) {
  check_pair(op, a, b);
  const DType t = a.dtype();
  const bool ints_ok = kind != cpu::BinaryOp::div;
  QKV_CHECK(t == DType::f32 || t == DType::f64 || (ints_ok && is_integral(t)), "[", op, "] needs ",
            ints_ok ? "float32, float64, int32 or int64" : "float32 or float64", " operands, not ", dtype_name(t));
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = Tensor::empty(shape, t, a.device());
  if (on_cuda(a)) cuda::binary_forward(kind, a.expand(shape), b.expand(shape), out);
  else cpu::binary_forward(kind, a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor unary(const char* op, cpu::UnaryOp kind, const Tensor& a, double s = 0.0) {
  require_defined(op, a, "input");
  require_float(op, a);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::unary_forward(kind, a, out, s);
  else cpu::unary_forward(kind, a, out, s);
  return out;
}

Tensor unary_grad(const char* op, cpu::UnaryGradOp kind, const Tensor& x, const Tensor& dy) {
  check_pair(op, x, dy);
  require_float(op, x);
  QKV_CHECK(x.shape() == dy.shape(), "[", op, "] x is ", shape_str(x.shape()), " but dy is ", shape_str(dy.shape()));
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (on_cuda(x)) cuda::unary_backward(kind, x, dy, out);
  else cpu::unary_backward(kind, x, dy, out);
  return out;
}

Tensor compare(const char* op, cpu::CompareOp kind, const Tensor& a, const Tensor& b) {
  check_pair(op, a, b);
  QKV_CHECK(a.dtype() != DType::bf16 && a.dtype() != DType::f16, "[", op, "] no kernel for ", dtype_name(a.dtype()));
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = Tensor::empty(shape, DType::boolean, a.device());
  if (on_cuda(a)) cuda::compare_forward(kind, a.expand(shape), b.expand(shape), out);
  else cpu::compare_forward(kind, a.expand(shape), b.expand(shape), out);
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", cpu::BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", cpu::BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", cpu::BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", cpu::BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary("maximum", cpu::BinaryOp::maximum, a, b); }

Tensor add(const Tensor& a, double s) { return unary("add", cpu::UnaryOp::add_scalar, a, s); }
Tensor mul(const Tensor& a, double s) { return unary("mul", cpu::UnaryOp::mul_scalar, a, s); }
Tensor rsub(const Tensor& a, double s) { return unary("rsub", cpu::UnaryOp::rsub_scalar, a, s); }
Tensor rdiv(const Tensor& a, double s) { return unary("rdiv", cpu::UnaryOp::rdiv_scalar, a, s); }
Tensor pow(const Tensor& a, double exponent) { return unary("pow", cpu::UnaryOp::pow_scalar, a, exponent); }
Tensor neg(const Tensor& a) { return unary("neg", cpu::UnaryOp::neg, a); }
Tensor exp(const Tensor& a) { return unary("exp", cpu::UnaryOp::exp, a); }
Tensor log(const Tensor& a) { return unary("log", cpu::UnaryOp::log, a); }
Tensor sqrt(const Tensor& a) { return unary("sqrt", cpu::UnaryOp::sqrt, a); }
Tensor rsqrt(const Tensor& a) { return unary("rsqrt", cpu::UnaryOp::rsqrt, a); }
Tensor tanh(const Tensor& a) { return unary("tanh", cpu::UnaryOp::tanh, a); }
Tensor sigmoid(const Tensor& a) { return unary("sigmoid", cpu::UnaryOp::sigmoid, a); }
Tensor relu(const Tensor& a) { return unary("relu", cpu::UnaryOp::relu, a); }
Tensor abs(const Tensor& a) { return unary("abs", cpu::UnaryOp::abs, a); }
Tensor gelu(const Tensor& a, GeluApprox approx) {
  return unary("gelu", approx == GeluApprox::tanh ? cpu::UnaryOp::gelu_tanh : cpu::UnaryOp::gelu_erf, a);
}
Tensor silu(const Tensor& a) { return unary("silu", cpu::UnaryOp::silu, a); }

Tensor gelu_backward(const Tensor& x, const Tensor& dy, GeluApprox approx) {
  return unary_grad("gelu_backward",
                    approx == GeluApprox::tanh ? cpu::UnaryGradOp::gelu_tanh : cpu::UnaryGradOp::gelu_erf, x, dy);
}
namespace {

// The bias of a bias-fused activation: 1-d, as long as a's last dim, a's dtype and device.
void check_row_bias(const char* op, const Tensor& a, const Tensor& bias) {
  check_pair(op, a, bias);
  require_float(op, a);
  QKV_CHECK(a.dim() >= 1 && bias.dim() == 1 && bias.size(0) == a.size(-1), "[", op, "] bias ", shape_str(bias.shape()),
            " does not match the last dim of ", shape_str(a.shape()));
}

}  // namespace

Tensor bias_gelu(const Tensor& a, const Tensor& bias, GeluApprox approx) {
  check_row_bias("bias_gelu", a, bias);
  const cpu::UnaryOp op = approx == GeluApprox::tanh ? cpu::UnaryOp::gelu_tanh : cpu::UnaryOp::gelu_erf;
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::bias_unary_forward(op, a, bias, out);
  else cpu::bias_unary_forward(op, a, bias, out);
  return out;
}

Tensor bias_gelu_backward(const Tensor& a, const Tensor& bias, const Tensor& dy, GeluApprox approx) {
  check_row_bias("bias_gelu_backward", a, bias);
  check_pair("bias_gelu_backward", a, dy);
  QKV_CHECK(a.shape() == dy.shape(), "[bias_gelu_backward] a is ", shape_str(a.shape()), " but dy is ",
            shape_str(dy.shape()));
  const cpu::UnaryGradOp op = approx == GeluApprox::tanh ? cpu::UnaryGradOp::gelu_tanh : cpu::UnaryGradOp::gelu_erf;
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::bias_unary_backward(op, a, bias, dy, out);
  else cpu::bias_unary_backward(op, a, bias, dy, out);
  return out;
}

Tensor silu_backward(const Tensor& x, const Tensor& dy) {
  return unary_grad("silu_backward", cpu::UnaryGradOp::silu, x, dy);
}
Tensor relu_backward(const Tensor& x, const Tensor& dy) {
  return unary_grad("relu_backward", cpu::UnaryGradOp::relu, x, dy);
}

void add_(const Tensor& a, const Tensor& b, double alpha) {
  check_pair("add_", a, b);
  QKV_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::f64 || is_integral(a.dtype()), "[add_] no kernel for ",
            dtype_name(a.dtype()));
  QKV_CHECK(broadcast_shapes(b.shape(), a.shape(), "add_") == a.shape(), "[add_] b ", shape_str(b.shape()),
            " does not broadcast to a ", shape_str(a.shape()));
  for (int d = 0; d < a.dim(); ++d)
    QKV_CHECK(a.size(d) <= 1 || a.stride(d) != 0, "[add_] destination ", shape_str(a.shape()),
              " is a broadcast view (stride 0 on dim ", d, "): its elements overlap");
  if (on_cuda(a)) cuda::add_inplace(a, b.expand(a.shape()), alpha);
  else cpu::add_inplace(a, b.expand(a.shape()), alpha);
}

void mul_(const Tensor& a, double s) {
  require_defined("mul_", a, "input");
  require_float("mul_", a);
  for (int d = 0; d < a.dim(); ++d)
    QKV_CHECK(a.size(d) <= 1 || a.stride(d) != 0, "[mul_] destination ", shape_str(a.shape()),
              " is a broadcast view (stride 0 on dim ", d, "): its elements overlap");
  if (on_cuda(a)) cuda::mul_inplace(a, s);
  else cpu::mul_inplace(a, s);
}

// ---- comparisons and selection ----

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", cpu::CompareOp::eq, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", cpu::CompareOp::gt, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", cpu::CompareOp::lt, a, b); }

Tensor logical_and(const Tensor& a, const Tensor& b) {
  check_pair("logical_and", a, b);
  QKV_CHECK(a.dtype() == DType::boolean, "[logical_and] needs bool operands, not ", dtype_name(a.dtype()));
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "logical_and");
  Tensor out = Tensor::empty(shape, DType::boolean, a.device());
  if (on_cuda(a)) cuda::logical_and_forward(a.expand(shape), b.expand(shape), out);
  else cpu::logical_and_forward(a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor logical_not(const Tensor& a) {
  require_defined("logical_not", a, "input");
  QKV_CHECK(a.dtype() == DType::boolean, "[logical_not] needs a bool operand, not ", dtype_name(a.dtype()));
  Tensor out = Tensor::empty(a.shape(), DType::boolean, a.device());
  if (on_cuda(a)) cuda::logical_not_forward(a, out);
  else cpu::logical_not_forward(a, out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  require_defined("where", cond, "cond");
  check_pair("where", a, b);
  require_same_device("where", cond, a);
  QKV_CHECK(cond.dtype() == DType::boolean, "[where] cond must be bool, not ", dtype_name(cond.dtype()));
  QKV_CHECK(a.dtype() != DType::bf16 && a.dtype() != DType::f16, "[where] no kernel for ", dtype_name(a.dtype()));
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (on_cuda(a)) cuda::where_forward(cond.expand(shape), a.expand(shape), b.expand(shape), out);
  else cpu::where_forward(cond.expand(shape), a.expand(shape), b.expand(shape), out);
  return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  require_defined("masked_fill", a, "input");
  require_defined("masked_fill", mask, "mask");
  require_same_device("masked_fill", a, mask);
  QKV_CHECK(mask.dtype() == DType::boolean, "[masked_fill] mask must be bool, not ", dtype_name(mask.dtype()));
  QKV_CHECK(a.dtype() != DType::bf16 && a.dtype() != DType::f16, "[masked_fill] no kernel for ", dtype_name(a.dtype()));
  QKV_CHECK(broadcast_shapes(mask.shape(), a.shape(), "masked_fill") == a.shape(), "[masked_fill] mask ",
            shape_str(mask.shape()), " does not broadcast to input ", shape_str(a.shape()));
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::masked_fill_forward(a, mask.expand(a.shape()), value, out);
  else cpu::masked_fill_forward(a, mask.expand(a.shape()), value, out);
  return out;
}

bool all_finite(const Tensor& a) {
  require_defined("all_finite", a, "input");
  return cpu::all_finite(a.to(Device::cpu));
}

// ---- comparisons for tests and tools ----

double max_abs_diff(const Tensor& a, const Tensor& b) {
  require_defined("max_abs_diff", a, "a");
  require_defined("max_abs_diff", b, "b");
  QKV_CHECK(a.shape() == b.shape(), "[max_abs_diff] a is ", shape_str(a.shape()), " but b is ", shape_str(b.shape()));
  return cpu::max_abs_diff(a.to(Device::cpu), b.to(Device::cpu));
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  require_defined("allclose", a, "a");
  require_defined("allclose", b, "b");
  QKV_CHECK(a.shape() == b.shape(), "[allclose] a is ", shape_str(a.shape()), " but b is ", shape_str(b.shape()));
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

}  // namespace qkv
