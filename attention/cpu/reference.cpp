// Reference attention: the textbook formula O = softmax(S)·V composed of differentiable ops, so
// autograd derives its backward. It is the oracle for the fused kernel and the path that returns
// the weights. Shapes as in attention.h; per kv head the G query heads are stacked along rows:
//   Qg [B, Hkv, G·Nq, D] (a view of q; G = Hq/Hkv)  S = s·Qg·Kᵀ [B, Hkv, G·Nq, Nk] ≡ [B, Hq, Nq, Nk]
// so K and V are read in place by every head of their group, never repeated in memory.
//
// Fully masked rows: filling a whole row with -inf would make softmax 0/0 = NaN (every exp is 0),
// so those rows (and rows whose visible keys all have a bias of -inf) are set to 0 and their
// weights multiplied by 0 afterwards — zero output and zero gradient, the same policy as the
// fused kernel. Every other masked logit is -inf before
// softmax.
#include <cmath>

#include "attention/cpu/reference.h"
#include "tensor/ops.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace qkv::attn {

namespace {

// [B, Hkv, G·Nq, X] -> [B, Hq, Nq, X] and back: query head h = hk·G + g is row block g of kv head hk.
Tensor groups_to_heads(const Tensor& x, const Problem& p) { return ag::reshape(x, {p.B, p.Hq, p.Nq, x.size(3)}); }
Tensor heads_to_groups(const Tensor& x, const Problem& p) {
  return ag::reshape(ag::contiguous(x), {p.B, p.Hkv, p.G * p.Nq, x.size(3)});
}

template <class T>
Tensor alibi_tensor(const Problem& p, const MaskPlan& plan) {
  Tensor t = Tensor::empty({1, p.Hq, p.Nq, p.Nk}, p.dtype);
  T* d = t.data<T>();
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t i = 0; i < p.Nq; ++i)
      for (int64_t j = 0; j < p.Nk; ++j)
        d[(h * p.Nq + i) * p.Nk + j] = -static_cast<T>(plan.alibi_slope(h)) * static_cast<T>(plan.pos(i) - j);
  return t;
}

template <class T>
Tensor row_flags(const std::vector<uint8_t>& valid, const Problem& p) {
  Tensor t = Tensor::empty({p.B, p.Hq, p.Nq, 1}, p.dtype);
  T* d = t.data<T>();
  for (size_t r = 0; r < valid.size(); ++r) d[r] = valid[r] ? T(1) : T(0);
  return t;
}

}  // namespace

AttentionWeights reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                     const Problem& p) {
  const MaskPlan plan(p.shape(), opts, p.dtype);
  Tensor bias = opts.bias;
  if (bias.defined() && bias.dtype() != p.dtype) {
    // A conversion would cut the graph: a learned bias must already have q's dtype.
    QKV_CHECK(!autograd::any_requires_grad({&bias}), "[attention] bias is ", dtype_name(bias.dtype()), " but q is ",
              dtype_name(p.dtype), "; a bias that requires grad must match q's dtype");
    bias = bias.to(p.dtype);
  }

  // The combined mask and, per row, whether any key survives it.
  const Tensor vis = visibility_mask(p.shape(), opts);
  const int64_t rows = p.B * p.Hq * p.Nq;
  std::vector<uint8_t> row_valid(rows, 0);
  {
    const bool* vd = vis.data<bool>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < p.Nk && !row_valid[r]; ++j) row_valid[r] = vd[r * p.Nk + j];
  }
  AttentionWeights res;
  for (int64_t r = 0; r < rows; ++r) res.fully_masked_rows += row_valid[r] ? 0 : 1;
  if (res.fully_masked_rows > 0 && opts.fully_masked == FullyMasked::error) {
    int64_t b = 0, h = 0, i = 0;
    plan.first_fully_masked(&b, &h, &i);
    fail_fully_masked(p, (b * p.Hq + h) * p.Nq + i);
  }

  // Masks are built on the host and moved to q's device (a no-op on the CPU).
  const Device dev = q.device();
  // Rules whose head map is not h / G (explicit ones): K and V gathered per query head, G = 1.
  Problem g = p;
  Tensor kk = k, vv = v;
  if (!plan.grouped_heads()) {
    const Tensor index = from_vector_i64(plan.rules().kv_head, {p.Hq}).to(dev);
    kk = ag::index_select(k, 1, index);
    vv = ag::index_select(v, 1, index);
    g.Hkv = p.Hq;
    g.G = 1;
  }
  // S = s·Q·Kᵀ (+ bias + alibi), [B, Hq, Nq, Nk]
  Tensor s = ag::mul(ag::matmul(heads_to_groups(q, g), ag::transpose(kk, 2, 3)), p.scale);
  s = groups_to_heads(s, g);
  if (bias.defined()) s = ag::add(s, bias);
  if (!opts.alibi_slopes.empty())
    s = ag::add(s, (p.dtype == DType::f32 ? alibi_tensor<float>(p, plan) : alibi_tensor<double>(p, plan)).to(dev));

  // A row is live when some visible key also has a bias above -inf (a bias of -inf masks too).
  std::vector<uint8_t> row_live = row_valid;
  if (bias.defined()) {
    Tensor bh = bias.detach().to(Device::cpu);
    Shape padded(static_cast<size_t>(4 - bh.dim()), 1);
    padded.insert(padded.end(), bh.shape().begin(), bh.shape().end());
    bh = bh.reshape(padded).expand(vis.shape()).to(DType::f64).contiguous();
    const double* bd = bh.data<double>();
    const bool* vd = vis.data<bool>();
    for (int64_t r = 0; r < rows; ++r) {
      if (!row_live[r]) continue;
      bool live = false;
      for (int64_t j = 0; j < p.Nk && !live; ++j) live = vd[r * p.Nk + j] && bd[r * p.Nk + j] != -INFINITY;
      row_live[r] = live;
    }
  }
  bool any_dead = false;
  for (int64_t r = 0; r < rows; ++r) any_dead = any_dead || !row_live[r];
  const Tensor valid = (p.dtype == DType::f32 ? row_flags<float>(row_live, p) : row_flags<double>(row_live, p)).to(dev);
  // fill = masked on live rows; a row that is not live is set to 0 (finite, so softmax stays a
  // number there) and zeroed after softmax.
  Tensor fill = Tensor::empty(vis.shape(), DType::boolean), dead = Tensor::empty(vis.shape(), DType::boolean);
  bool any_fill = false;
  {
    const bool* vd = vis.data<bool>();
    bool* fd = fill.data<bool>();
    bool* dd = dead.data<bool>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < p.Nk; ++j) {
        fd[r * p.Nk + j] = !vd[r * p.Nk + j] && row_live[r];
        dd[r * p.Nk + j] = !row_live[r];
        any_fill = any_fill || fd[r * p.Nk + j];
      }
  }
  if (any_dead) s = ag::masked_fill(s, dead.to(dev), 0.0);
  fill = fill.to(dev);
  Tensor a = ag::softmax(any_fill ? ag::masked_fill(s, fill, -INFINITY) : s, -1);
  if (any_dead) a = ag::mul(a, valid);
  res.weights = a;
  if (opts.dropout_p > 0) a = ag::mul(a, dropout_scale_mask(p.shape(), opts, p.dtype).to(dev));
  Tensor o = ag::matmul(heads_to_groups(a, g), vv);  // [B, Hkv, G·Nq, Dv]
  res.out = groups_to_heads(o, g);
  if (opts.check_invariants) {
    QKV_CHECK(dev == Device::cpu, "[attention] check_invariants reads the weights on the host: CPU tensors only");
    check_reference_invariants(res, p, plan);
  }
  return res;
}

}  // namespace qkv::attn
