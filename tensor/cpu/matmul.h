// CPU GEMM on OpenBLAS: batched, broadcast, with transposed views folded into the BLAS call.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace qkv::cpu {

// How BLAS reads one 2-d matrix [rows, cols] of a view: row-major NoTrans with leading dimension
// `ld` (element (r,c) at r*ld + c), or Trans (stored as the row-major transpose: (r,c) at c*ld + r).
struct GemmLayout {
  bool ok = false;  // false: the strides fit neither form, the caller must make a contiguous copy
  bool trans = false;
  int64_t ld = 1;
};
GemmLayout gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);
// Layout of the last two dims of t (t.dim() >= 2).
GemmLayout gemm_layout(const Tensor& t);

// out[i] = alpha * a[i] @ b[i] + beta * out[i] for every batch index i, where a is [batch..., M, K],
// b is [batch..., K, N] and out is [batch..., M, N], all three with the same batch shape (broadcast
// batch dims as stride-0 views). Preconditions (the front end checks them): same float dtype, a and
// b have gemm_layout(...).ok, out's last dim has unit stride (or N == 1) and rows do not overlap.
// beta == 0 overwrites out without reading it (NaNs in it do not propagate).
// bf16_operands (float32 a and b holding bf16 values, bf16 autocast): the matrix products run on
// the bf16 GEMM (tensor/cpu/gemm/bf16_gemm.h: the CPU's bf16 units where it has them).
void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta,
                    bool bf16_operands = false);

// out [R, C] (row stride >= C, unit column stride) gets `row` [C] (any stride) copied into every row:
// the bias pre-broadcast that lets a linear layer add its bias through GEMM's beta = 1.
void fill_rows(const Tensor& out, const Tensor& row);

// The GEMM kernel family the linked BLAS chose at run time (OpenBLAS's openblas_get_corename(),
// e.g. "Haswell", "SkylakeX", "Zen", "Prescott"; OPENBLAS_CORETYPE overrides its choice), or
// "unknown" when the BLAS does not say (another BLAS linked in its place).
std::string blas_kernel_name();

}  // namespace qkv::cpu
