// The elementwise op codes that both devices' kernels take (tensor/cpu/elementwise.h,
// tensor/cuda/kernels.h). Device-neutral, so neither backend's header includes the other's.
#pragma once

namespace qkv {

enum class BinaryOp { add, sub, mul, div, maximum };
enum class UnaryOp {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  abs,
  gelu_tanh,
  gelu_erf,
  silu,
  add_scalar,
  mul_scalar,
  rsub_scalar,
  rdiv_scalar,
  pow_scalar
};
// Fused derivative kernels: out = dy * f'(x).
enum class UnaryGradOp { relu, gelu_tanh, gelu_erf, silu };
enum class CompareOp { eq, gt, lt };

}  // namespace qkv
