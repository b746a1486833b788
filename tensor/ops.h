// Raw tensor ops: they check their inputs (shapes, dtypes, devices), allocate the result and hand
// the work to a device kernel (tensor/cpu/…, tensor/cuda/…). They record nothing: the
// differentiable versions live in autograd/functions.h.
//
// Conventions: binary ops broadcast like NumPy/PyTorch; every op accepts non-contiguous inputs and
// returns a contiguous result; float ops accept float32 and float64 (both operands the same dtype);
// `dim` may be negative. Errors throw qkv::Error("[op] ..."), naming the shapes at fault.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace qkv {

// ---- factories (tensor/ops_factory.cpp) ----
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu);
Tensor arange(int64_t start, int64_t end, DType dtype = DType::i64, Device device = Device::cpu);
// Philox 4x32-10 draws keyed by `seed`; element i uses counter (offset + i): the same values on any
// thread count. rand: uniform [lo, hi); randn: normal(mean, std) by Box-Muller.
Tensor rand(const Shape& shape, uint64_t seed, uint64_t offset = 0, double lo = 0.0, double hi = 1.0,
            DType dtype = DType::f32);
Tensor randn(const Shape& shape, uint64_t seed, uint64_t offset = 0, double mean = 0.0, double std = 1.0,
             DType dtype = DType::f32);
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32);
Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64);
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t);

// ---- in place (tensor/ops_factory.cpp) ----
void fill_(const Tensor& t, double value);
void copy_(const Tensor& dst, const Tensor& src);  // src broadcast to dst's shape, dtype converted
// float32 x rounded to bfloat16 (nearest, ties to even) and widened back: x.to(bf16).to(f32), on
// the CPU in one pass. Contiguous result.
Tensor round_to_bf16(const Tensor& x);

// ---- elementwise (tensor/ops_elementwise.cpp, kernels tensor/cpu/elementwise.cpp) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor rdiv(const Tensor& a, double s);  // s / a
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor abs(const Tensor& a);
enum class GeluApprox { none, tanh };
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::tanh);
Tensor silu(const Tensor& a);
// Fused derivative kernels used by the autograd rules: return dy * f'(x).
Tensor gelu_backward(const Tensor& x, const Tensor& dy, GeluApprox approx);
// gelu(a + bias) with bias [C] added along a's last dim, in one pass: a Linear's bias and its GELU
// fused (the Linear runs without bias). The backward gives dy · gelu'(a + bias); the bias's
// gradient is its column sum.
Tensor bias_gelu(const Tensor& a, const Tensor& bias, GeluApprox approx = GeluApprox::tanh);
Tensor bias_gelu_backward(const Tensor& a, const Tensor& bias, const Tensor& dy, GeluApprox approx);
Tensor silu_backward(const Tensor& x, const Tensor& dy);
Tensor relu_backward(const Tensor& x, const Tensor& dy);
// a += alpha * b in place (b broadcast to a). The accumulation primitive of the engine and optimizers.
void add_(const Tensor& a, const Tensor& b, double alpha = 1.0);
void mul_(const Tensor& a, double s);

// ---- comparisons and selection (tensor/ops_elementwise.cpp) ----
Tensor eq(const Tensor& a, const Tensor& b);  // -> bool
Tensor gt(const Tensor& a, const Tensor& b);  // -> bool
Tensor lt(const Tensor& a, const Tensor& b);  // -> bool
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);     // cond bool, broadcast all three
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);  // a where !mask, value where mask
bool all_finite(const Tensor& a);

// ---- reductions (tensor/ops_reduce.cpp, kernels tensor/cpu/reduce.cpp) ----
Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim = false);
Tensor sum(const Tensor& a);  // all elements -> shape []
Tensor mean(const Tensor& a, const std::vector<int>& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor max(const Tensor& a, int dim, bool keepdim = false);     // values
Tensor argmax(const Tensor& a, int dim, bool keepdim = false);  // int64 indices, first max wins
// Sum `grad` down to `shape` (undoing broadcasting): the reduction every broadcasting vjp needs.
Tensor sum_to(const Tensor& grad, const Shape& shape);

// Numerically stable: max subtracted before exp (exp(x - m) <= 1, softmax unchanged).
Tensor softmax(const Tensor& a, int dim);
Tensor log_softmax(const Tensor& a, int dim);
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int dim);      // y * (dy - sum(dy*y))
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int dim);  // dy - exp(y) * sum(dy)

// ---- shape ops that copy (tensor/ops_shape.cpp) ----
Tensor cat(const std::vector<Tensor>& tensors, int dim);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int dim);  // views
Tensor index_select(const Tensor& a, int dim, const Tensor& index);                      // index int32/int64 1-d
// out = zeros(shape) then out.index_select(dim, index) += src: the vjp of index_select.
Tensor index_add(const Shape& shape, int dim, const Tensor& index, const Tensor& src);

// ---- linear algebra (tensor/ops_matmul.cpp, kernels tensor/cpu/matmul.cpp) ----
// a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast; 1-d b is a vector.
// Transposed views (stride 1 along the row) are passed to BLAS as transposes, never copied.
// bf16_operands: the caller promises float32 operands whose values are all bfloat16 (bf16
// autocast rounds them); on CUDA the GEMM then runs on bf16 tensor cores with float32
// accumulation (the conversion is exact), on the CPU on the bf16 GEMM (tensor/cpu/gemm/bf16_gemm.h:
// AMX or AVX512-BF16 where the CPU has them, else the float32 GEMM, exact on bf16 values).
Tensor matmul(const Tensor& a, const Tensor& b, bool bf16_operands = false);
// out = alpha * a @ b + beta * out, in place on a contiguous `out` of the right shape.
void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha = 1.0, double beta = 0.0,
                 bool bf16_operands = false);
// x [..., in] @ weight^T + bias -> [..., out]; weight [out, in], bias [out] or undefined. One GEMM
// on x viewed as [rows, in] with weight read transposed in place, bias added through beta = 1.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool bf16_operands = false);
// Whether linear(x, weight, bias, true) rounds x and weight to bf16 itself, so that bf16 autocast
// may hand it float32 values: on the CPU where its bf16 units run the products (their kernels round
// as they pack, tensor/cpu/gemm/bf16_gemm.h), for x [rows >= 12, in > 1] and out > 1 (no
// matrix-vector product, which takes the float32 path). Elsewhere the operands must hold bf16 values.
bool linear_rounds_bf16_operands(const Tensor& x, const Tensor& weight);
// bf16 inference: linear(x, bf16(W), bias, true) with W rounded to bf16 (nearest, ties to even) by
// the op, x holding bf16 values already (autocast rounds it). Under numerics = invariant on the
// CPU the rounding is the packing: inside a PackedWeightScope (a decode loop) W is packed once as
// bf16 panels and each step reads half the bytes of float32 (tensor/cpu/invariant_matmul.h). The
// values are those of rounding W first.
Tensor linear_bf16_weight(const Tensor& x, const Tensor& weight, const Tensor& bias);

// ---- fused neural-net ops (tensor/ops_nn.cpp, kernels tensor/cpu/nn_kernels.cpp) ----
// weight [V, C], ids int32/int64 of any shape -> [..., C]; ids out of range are errors.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// dweight [V, C] = scatter-add of dy rows at ids.
Tensor embedding_backward(const Tensor& ids, const Tensor& dy, int64_t num_embeddings);
// dweight [V, C] += scatter-add of dy rows at ids, in place on a contiguous dweight (a gradient
// already being accumulated, e.g. a tied LM head's).
void embedding_backward_into(const Tensor& ids, const Tensor& dy, const Tensor& dweight);

// x [R, C] -> [C], the column sums in row order (float64 accumulation on the CPU): the bias
// gradient of a Linear. The _into form writes a preallocated contiguous out [C].
Tensor sum_rows(const Tensor& x);
void sum_rows_into(const Tensor& x, const Tensor& out);

// LayerNorm over the last dim: y = (x - mean) * rstd * w + b; returns y and saves mean/rstd ([...]).
struct NormResult {
  Tensor y, mean, rstd;
};
NormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
struct NormGrads {
  Tensor dx, dweight, dbias;
};
NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd);
// The same into preallocated contiguous outputs: dx (x's shape) is written, or added to with
// accumulate_dx (a residual stream's pending gradient); dweight/dbias [C] may be undefined (not
// wanted).
void layer_norm_backward_into(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                              bool accumulate_dx);
// RMSNorm over the last dim: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
NormResult rms_norm(const Tensor& x, const Tensor& weight, double eps);  // mean left undefined
NormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd);

// Cross-entropy of logits [N, V] against targets [N] (int32/int64); targets == ignore_index count
// neither in the loss nor in the mean's denominator. Returns the mean loss (shape []) and the row
// log-sum-exp (saved for backward). Targets out of [0, V) (other than ignore_index) are errors.
struct CrossEntropyResult {
  Tensor loss, lse;
  int64_t count = 0;  // targets that counted
};
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// dlogits = (softmax(logits) - onehot(target)) * dloss / count, zero rows for ignored targets.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                              int64_t count, int64_t ignore_index = -100);
// The same written over the logits (contiguous) in place: for a caller holding their only reference.
void cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                             int64_t count, int64_t ignore_index = -100);

// Inverted dropout: a * keep / (1 - p), keep drawn by Philox from (seed, offset + row-major element
// index) (tensor/cpu/random_bits.h), so the same call on dy is its backward. p == 0 returns a;
// p outside [0, 1) is an error.
Tensor dropout(const Tensor& a, double p, uint64_t seed, uint64_t offset);

// ---- comparisons for tests and tools ----
double max_abs_diff(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace qkv
