// The differentiable op set. Each function runs the raw op (tensor/ops.h) and, when grad mode is
// on and an input requires grad, records one named backward node (autograd/rules/*.cpp) holding
// what it saved. nn/, attention/ and train/ build models from these.
#pragma once
#include <vector>

#include "tensor/ops.h"

namespace qkv::ag {

// views (rules/views.cpp)
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor permute(const Tensor& a, const std::vector<int>& dims);
Tensor transpose(const Tensor& a, int d0, int d1);
Tensor narrow(const Tensor& a, int dim, int64_t start, int64_t length);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor unsqueeze(const Tensor& a, int dim);
Tensor squeeze(const Tensor& a, int dim);
Tensor contiguous(const Tensor& a);

// elementwise (rules/elementwise.cpp)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::tanh);
// gelu(a + bias), bias [C] along a's last dim: a Linear's bias and GELU in one kernel each way.
Tensor bias_gelu(const Tensor& a, const Tensor& bias, GeluApprox approx = GeluApprox::tanh);
Tensor silu(const Tensor& a);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // grads to a and b
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);

// reductions (rules/reduce.cpp)
Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim = false);
Tensor sum(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<int>& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor max(const Tensor& a, int dim, bool keepdim = false);  // grad to the first max
Tensor softmax(const Tensor& a, int dim);
Tensor log_softmax(const Tensor& a, int dim);

// shape ops that copy (rules/shape.cpp)
Tensor cat(const std::vector<Tensor>& tensors, int dim);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int dim);
Tensor index_select(const Tensor& a, int dim, const Tensor& index);

// linear algebra and fused nn ops (rules/matmul.cpp, rules/nn.cpp)
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] @ weight^T (weight [out, in]) + bias [out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// Inverted dropout with a Philox mask keyed by (seed, offset, element index); identity when p == 0.
Tensor dropout(const Tensor& a, double p, uint64_t seed, uint64_t offset);

// bf16 autocast helpers (rules/elementwise.cpp), float32 in and out:
// round_bf16(x) = x rounded to the nearest bfloat16 (ties to even); its gradient passes through.
Tensor round_bf16(const Tensor& x);
// round_grad_bf16(y) = y; its gradient is rounded to bfloat16 on the way back.
Tensor round_grad_bf16(const Tensor& y);
// When autocast is on and x is float32: round_bf16(x) (on the GPU x itself: the tensor-core GEMM
// rounds its operands in converting them); otherwise x itself. For GEMM operands only.
Tensor autocast_input(const Tensor& x);
// When autocast is on and y is float32: round_grad_bf16(y); otherwise y itself.
Tensor autocast_output(const Tensor& y);

}  // namespace qkv::ag
