// The CUDA kernels behind the raw ops (tensor/ops_*.cpp) for tensors on Device::cuda. Same
// contracts as their CPU counterparts in tensor/cpu/ (the front ends check shapes, dtypes and
// devices, broadcast operands as stride-0 views and allocate results on the device). Every
// kernel runs on one stream (the default stream), so calls are ordered as on the CPU.
// A build without CUDA links tensor/no_cuda/cuda_stubs.cpp instead: every entry point there throws
// "qkv was built without CUDA" (that is its whole job, not missing work).
#pragma once
#include <vector>

#include "tensor/elementwise_ops.h"
#include "tensor/tensor.h"

namespace qkv::cuda {

// Views of up to this many dims (after merging none): more is refused with a message.
constexpr int kMaxDims = 8;

void binary_forward(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void unary_forward(UnaryOp op, const Tensor& a, const Tensor& out, double s);
void unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& dy, const Tensor& out);
void bias_unary_forward(UnaryOp op, const Tensor& a, const Tensor& bias, const Tensor& out);
void bias_unary_backward(UnaryGradOp op, const Tensor& x, const Tensor& bias, const Tensor& dy, const Tensor& out);
void compare_forward(CompareOp op, const Tensor& a, const Tensor& b, const Tensor& out);
void logical_and_forward(const Tensor& a, const Tensor& b, const Tensor& out);
void logical_not_forward(const Tensor& a, const Tensor& out);
void where_forward(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);
void masked_fill_forward(const Tensor& a, const Tensor& mask, double value, const Tensor& out);
void add_inplace(const Tensor& a, const Tensor& b, double alpha);
void mul_inplace(const Tensor& a, double s);
void fill(const Tensor& t, double value);
// dst = src converted elementwise (any strides, any of f32/f64/bf16/f16/i32/i64/bool), one device.
void copy_cast(const Tensor& src, const Tensor& dst);

// The GEMM of cpu::matmul_forward on cuBLAS (float32: SGEMM with fp32 accumulation, float64:
// DGEMM); a and b have a BLAS layout (cpu::gemm_layout ok), out has unit stride along its rows.
// bf16_operands (float32 only): a and b hold bf16 values; they are converted (exactly) and the
// product runs on bf16 tensor cores with float32 accumulation (cublasGemmStridedBatchedEx).
void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta,
                    bool bf16_operands = false);
// numerics = invariant: y [..., N] = x [..., K]·weight [N, K]^T (+ bias [N]), float32, each element
// reduced as tensor/cpu/invariant_matmul.h states (the same bits as the CPU kernel).
Tensor invariant_linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// out [R, C] rows each set to `row` [C] (the bias pre-broadcast of linear).
void fill_rows(const Tensor& out, const Tensor& row);

// Reductions and softmax of tensor/cpu/reduce.h (tensor/cuda/reduce.cu); one block per output
// element or row, fixed combination trees: deterministic.
void sum_forward(const Tensor& a, const std::vector<bool>& reduce, const Tensor& out, double scale);
void max_forward(const Tensor& a, int dim, const Tensor& values, const Tensor& indices);
void softmax_forward(const Tensor& x, int dim, const Tensor& y, bool log);
void softmax_backward(const Tensor& y, const Tensor& dy, int dim, const Tensor& dx, bool log);

// RoPE rotate-half on x [B, H, N, D] (rows contiguous along D or strided): out contiguous,
// out[.., f] = x1·cos − x2·sin, out[.., f + D/2] = x2·cos + x1·sin with angle pos·inv_freq[f]·sign;
// pos has N entries (or B·N with per_row), inv_freq D/2, both host vectors copied to the device.
void rope(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, const std::vector<double>& inv_freq,
          double sign, const Tensor& out);

// The fused neural-net ops of tensor/cpu/nn_kernels.h, same arguments and results
// (tensor/cuda/nn.cu, norm.cu, cross_entropy.cu). Sums run in orders fixed by the shapes: results are deterministic.
void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dweight);
void sum_rows(const Tensor& x, const Tensor& out);
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd);
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         bool accumulate_dx = false);
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);
double cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                            int64_t ignore_index, const Tensor& dlogits);
void dropout_forward(const Tensor& a, double p, uint64_t seed, uint64_t offset, const Tensor& out);

}  // namespace qkv::cuda
