// CPU kernels of the fused neural-net ops (front ends: tensor/ops_nn.cpp). Callers have checked
// shapes and dtypes; every tensor handed in is contiguous unless a comment says otherwise, and
// outputs are preallocated. float32 and float64; row statistics accumulate in float64.
// Every reduction here sums in an order fixed by the shapes alone, so results do not depend on
// the number of threads.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::cpu {

// Calls f(T{}, I{}) with T the element type of float dtype `ft` (f32/f64) and I that of index
// dtype `it` (i32/i64): the kernels' one dispatch point for (values, ids/targets) pairs.
template <class F>
void dispatch_float_index(DType ft, DType it, F&& f) {
  if (ft == DType::f32) it == DType::i32 ? f(float{}, int32_t{}) : f(float{}, int64_t{});
  else it == DType::i32 ? f(double{}, int32_t{}) : f(double{}, int64_t{});
}

// ---- embedding (tensor/cpu/nn_kernels.cpp) ----
// out [n, C] = weight[ids[i], :]; weight [V, C] with unit column stride (any row stride);
// ids [n] int32/int64, already range-checked.
void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out);
// dweight [V, C] (zero-filled by the caller) += dy[i, :] at row ids[i], in order of i.
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dweight);

// out [C] = sum over rows of x [R, C]: the bias gradient of a linear layer.
void sum_rows(const Tensor& x, const Tensor& out);

// ---- normalisation over the last dim (tensor/cpu/norm.cpp); x viewed as [R, C] ----
// weight/bias [C] may be undefined (then 1 and 0). mean/rstd are [R].
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd);
// dweight/dbias may be undefined (not wanted); dx always written (dx += ... with accumulate_dx).
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         bool accumulate_dx = false);
void rms_norm_forward(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                       const Tensor& dweight);

// ---- cross-entropy (tensor/cpu/cross_entropy.cpp) ----
// logits [N, V] with unit column stride (any row stride); targets [N] int32/int64, checked.
// Writes lse [N] and returns the summed loss of the rows whose target != ignore_index.
double cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse);
// dlogits [N, V] = (softmax - onehot(target)) * scale, zero rows where target == ignore_index.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double scale,
                            int64_t ignore_index, const Tensor& dlogits);

// ---- RoPE rotate-half (tensor/cpu/rope.cpp; formulas attention/rope.h) ----
// x [B, H, N, D] (any strides), out contiguous: out[.., f] = x1·cos − x2·sin,
// out[.., f + D/2] = x2·cos + x1·sin with angle pos·inv_freq[f]·sign; pos has N entries (or B·N
// with per_row), inv_freq D/2.
void rope(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, const std::vector<double>& inv_freq,
          double sign, const Tensor& out);

// ---- dropout (tensor/cpu/nn_kernels.cpp) ----
// out[i] = a[i] * keep(seed, offset + i) / (1 - p), i the row-major index; 0 < p < 1.
void dropout_forward(const Tensor& a, double p, uint64_t seed, uint64_t offset, const Tensor& out);

}  // namespace qkv::cpu
