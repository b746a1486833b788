// CPU elementwise kernels. Callers (tensor/ops_*.cpp) have checked dtypes and shapes and pass
// operands already broadcast to the output's shape (expand views, stride 0 on broadcast dims);
// outputs are freshly allocated contiguous tensors unless the kernel is an in-place one.
#pragma once
#include <cstdint>

#include "tensor/elementwise_ops.h"
#include "tensor/tensor.h"

namespace qkv::cpu {

// The op codes (tensor/elementwise_ops.h), also spelled cpu::BinaryOp etc. here.
using qkv::BinaryOp;
using qkv::CompareOp;
using qkv::UnaryGradOp;
using qkv::UnaryOp;

// out = a (op) b; a, b, out: same dtype (float32/float64, or int32/int64 except div), same shape.
void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
// out = f(a) (scalar ops use s); float32/float64.
void unary_forward(UnaryOp op, const Tensor& a, const Tensor& out, double s = 0.0);
void unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& dy, const Tensor& out);
// Bias-fused forms (a Linear's bias and its activation in one pass): out = f(a + bias) and
// out = dy * f'(x + bias), bias a 1-d [C] added along the last dim of a (x, dy: a's shape).
void bias_unary_forward(UnaryOp op, const Tensor& a, const Tensor& bias, const Tensor& out);
void bias_unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& bias, const Tensor& dy, const Tensor& out);
// out (bool) = a (op) b for any equal dtype of a and b.
void compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void logical_and_forward(const Tensor& a, const Tensor& b, const Tensor& out);
void logical_not_forward(const Tensor& a, const Tensor& out);
// out = cond ? a : b (cond bool; a, b, out one dtype).
void where_forward(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
// out = mask ? value : a.
void masked_fill_forward(const Tensor& a, const Tensor& mask, double value, const Tensor& out);

// In place: a += alpha * b (b already expanded to a's shape); a *= s; t = value.
void add_inplace(const Tensor& a, const Tensor& b, double alpha);
void mul_inplace(const Tensor& a, double s);
void fill(const Tensor& t, double value);
bool all_finite(const Tensor& a);
// max |a - b| over float tensors of one shape (any float dtypes), NaN if either holds a NaN.
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace qkv::cpu
