// Front end of matmul / matmul_into / linear: checks shapes and dtypes, broadcasts the batch dims
// as stride-0 views (no copies), copies an operand only when its strides fit no BLAS layout, then
// hands off to the CPU kernel (tensor/cpu/matmul.cpp) or cuBLAS (tensor/cuda/matmul.cu).
#include <algorithm>
#include <climits>

#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/invariant_matmul.h"
#include "tensor/cpu/matmul.h"
#include "tensor/cuda/kernels.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"

namespace qkv {

namespace {

struct MatmulPlan {
  Tensor a, b;      // [batch..., M, K] and [batch..., K, N], batch dims broadcast, BLAS-readable
  Shape out_full;   // [batch..., M, N]
  Shape out_final;  // out_full without the dims a 1-d operand added
};

// t [..., r, c] viewed as [batch..., r, c]; batch dims t lacks or has as 1 get stride 0.
Tensor expand_batch(const Tensor& t, const Shape& batch) {
  const int nd = t.dim(), nb = static_cast<int>(batch.size());
  if (nd == nb + 2 && std::equal(batch.begin(), batch.end(), t.shape().begin())) return t;  // nothing to add
  Shape shape = batch;
  Strides strides(batch.size(), 0);
  const int own = nd - 2;
  for (int d = 0; d < own; ++d) {
    const int bd = nb - own + d;
    if (t.shape()[d] == batch[bd]) strides[bd] = t.strides()[d];
  }
  for (int d = own; d < nd; ++d) {
    shape.push_back(t.shape()[d]);
    strides.push_back(t.strides()[d]);
  }
  return Tensor::make_view(t, shape, strides, t.offset());
}

MatmulPlan plan_matmul(const char* op, const Tensor& a, const Tensor& b) {
  detail::require_defined(op, a, "a");
  detail::require_defined(op, b, "b");
  detail::require_same_device(op, a, b);
  detail::require_float(op, a, "a");
  detail::require_same_dtype(op, a, b);
  QKV_CHECK(a.dim() >= 1 && b.dim() >= 1, "[", op, "] a is ", shape_str(a.shape()), " but b is ", shape_str(b.shape()),
            ": operands need at least one dim");
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  QKV_CHECK(b2.size(-2) == k, "[", op, "] a is ", shape_str(a.shape()), " but b is ", shape_str(b.shape()),
            ": inner dims ", k, " and ", b2.size(-2), " differ");
  QKV_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "[", op, "] a is ", shape_str(a.shape()), " but b is ",
            shape_str(b.shape()), ": a matrix dim exceeds the BLAS int range");

  const int na = a2.dim() - 2, nbb = b2.dim() - 2, nb = std::max(na, nbb);
  Shape batch(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i) {  // right-aligned, as NumPy
    const int da = i - (nb - na), db = i - (nb - nbb);
    const int64_t sa = da >= 0 ? a2.shape()[da] : 1, sb = db >= 0 ? b2.shape()[db] : 1;
    QKV_CHECK(sa == sb || sa == 1 || sb == 1, "[", op, "] a is ", shape_str(a.shape()), " but b is ",
              shape_str(b.shape()), ": batch dims do not broadcast");
    batch[i] = sa == 1 ? sb : sa;
  }
  if (!cpu::gemm_layout(a2).ok) a2 = a2.contiguous();
  if (!cpu::gemm_layout(b2).ok) b2 = b2.contiguous();

  MatmulPlan p;
  p.a = expand_batch(a2, batch);
  p.b = expand_batch(b2, batch);
  p.out_full = batch;
  p.out_full.push_back(m);
  p.out_full.push_back(n);
  p.out_final = batch;
  if (a.dim() > 1) p.out_final.push_back(m);
  if (b.dim() > 1) p.out_final.push_back(n);
  return p;
}

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, bool bf16_operands) {
  if (out.device() == Device::cuda) cuda::matmul_forward(a, b, out, alpha, beta, bf16_operands);
  else cpu::matmul_forward(a, b, out, alpha, beta, bf16_operands);
}

// numerics = invariant (tensor/numerics.h): the Linear GEMM in one fixed reduction order per
// output element. float32 only: the float64 GEMM (gradient checks) has no such kernel, and taking
// the BLAS one would break the mode's promise without a word.
Tensor invariant_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool bf16_operands) {
  QKV_CHECK(x.dtype() == DType::f32 && weight.dtype() == DType::f32,
            "[linear] numerics = invariant computes float32 only; x is ", dtype_name(x.dtype()), ", weight ",
            dtype_name(weight.dtype()));
  if (x.device() == Device::cpu)
    return cpu::invariant_linear(x, weight, bias,
                                 bf16_operands ? cpu::InvariantBf16::operands : cpu::InvariantBf16::none);
  detail::require_same_device("linear", x, weight);
  return cuda::invariant_linear(x, weight, bias);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool bf16_operands) {
  const MatmulPlan p = plan_matmul("matmul", a, b);
  Tensor out = Tensor::empty(p.out_full, a.dtype(), a.device());
  gemm(p.a, p.b, out, 1.0, 0.0, bf16_operands);
  return p.out_final == p.out_full ? out : out.view(p.out_final);
}

void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, bool bf16_operands) {
  const MatmulPlan p = plan_matmul("matmul_into", a, b);
  detail::require_defined("matmul_into", out, "out");
  detail::require_same_device("matmul_into", a, out);
  QKV_CHECK(out.dtype() == a.dtype(), "[matmul_into] out is ", dtype_name(out.dtype()), " but a is ",
            dtype_name(a.dtype()));
  QKV_CHECK(out.shape() == p.out_final, "[matmul_into] a is ", shape_str(a.shape()), " and b is ", shape_str(b.shape()),
            " but out is ", shape_str(out.shape()), ", not ", shape_str(p.out_final));
  for (int d = 0; d < out.dim(); ++d)
    QKV_CHECK(out.shape()[d] == 1 || out.strides()[d] != 0, "[matmul_into] out ", shape_str(out.shape()),
              " is a broadcast view (stride 0 in dim ", d, ")");
  const Tensor o = out.view(p.out_full);  // only inserts size-1 dims: always a view
  const cpu::GemmLayout lc = cpu::gemm_layout(o);
  QKV_CHECK(lc.ok && !lc.trans, "[matmul_into] out ", shape_str(out.shape()),
            " must have unit stride along its last dim (strides ", shape_str(out.strides()), ")");
  gemm(p.a, p.b, o, alpha, beta, bf16_operands);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool bf16_operands) {
  detail::require_defined("linear", x, "x");
  detail::require_defined("linear", weight, "weight");
  QKV_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "[linear] x is ", shape_str(x.shape()),
            " but weight is ", shape_str(weight.shape()), ": need x [..., in] and weight [out, in]");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  if (bias.defined()) {
    QKV_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "[linear] weight is ", shape_str(weight.shape()),
              " but bias is ", shape_str(bias.shape()), ", not [", out_features, "]");
    QKV_CHECK(bias.dtype() == weight.dtype(), "[linear] bias is ", dtype_name(bias.dtype()), " but weight is ",
              dtype_name(weight.dtype()));
    detail::require_same_device("linear", weight, bias);
  }
  if (numerics() == Numerics::invariant) return invariant_linear(x, weight, bias, bf16_operands);
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  const Tensor x2 = x.reshape({rows, in});  // a view unless x's leading dims cannot merge
  Tensor y = Tensor::empty({rows, out_features}, x.dtype(), x.device());
  // matmul_into checks dtypes and devices of x and weight.
  if (bias.defined() && rows > 0 && out_features > 0) {
    detail::require_same_device("linear", x, bias);
    if (y.device() == Device::cuda) cuda::fill_rows(y, bias);
    else cpu::fill_rows(y, bias);
    matmul_into(x2, weight.transpose(0, 1), y, 1.0, 1.0, bf16_operands);
  } else {
    matmul_into(x2, weight.transpose(0, 1), y, 1.0, 0.0, bf16_operands);
  }
  lead.push_back(out_features);
  return y.view(lead);
}

bool linear_rounds_bf16_operands(const Tensor& x, const Tensor& weight) {
  if (!x.defined() || !weight.defined() || x.device() != Device::cpu || weight.device() != Device::cpu ||
      x.dtype() != DType::f32 || weight.dtype() != DType::f32 || weight.dim() != 2 || x.dim() < 1)
    return false;
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t rows = in > 0 ? x.numel() / in : 0;
  return in > 1 && out > 1 && rows >= 12 && x.size(-1) == in && cpu::invariant_bf16_on_units();
}

Tensor linear_bf16_weight(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::require_defined("linear", x, "x");
  detail::require_defined("linear", weight, "weight");
  if (numerics() == Numerics::invariant && x.device() == Device::cpu && weight.device() == Device::cpu &&
      x.dtype() == DType::f32 && weight.dtype() == DType::f32)
    return cpu::invariant_linear(x, weight, bias, cpu::InvariantBf16::round_weight);
  return linear(x, weight.to(DType::bf16).to(weight.dtype()), bias, /*bf16_operands=*/true);
}

}  // namespace qkv
