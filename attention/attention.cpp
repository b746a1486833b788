// attention(): validates, picks the kernel and, for the fused one, records the single autograd
// node whose backward is the hand-derived vjp (attention/fused_backward.cpp).
#include "attention/attention.h"

#include <cmath>

#include "attention/reference.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#ifdef QKV_WITH_CUDA
#include "attention/cuda/fused_cuda.h"
#include "attention/cuda/mma_attention.h"
#endif

namespace qkv::attn {

namespace {

// dQ = s·dS·K, dK = s·dSᵀ·Q, dV = (P∘Z)ᵀ·dO with dS = P∘(dP∘Z − rowsum(dO∘O)), P recomputed from lse
struct FusedAttentionBackward : autograd::Node {
  Tensor q, k, v, out, lse;
  Problem p;
  std::shared_ptr<const MaskPlan> plan;  // the mask (explicit rules included) the forward used
  std::shared_ptr<const DropoutDraw> drop;
  const char* name() const override { return "FusedAttentionBackward"; }
  std::vector<Tensor> backward(const Tensor& dout) override {
    FusedGrads g = fused_attention_backward(dout, q, k, v, out, lse, p, *plan, *drop);
    return {g.dq, g.dk, g.dv};
  }
  void release() override {
    q = k = v = out = lse = Tensor();
    plan.reset();
    drop.reset();
  }
};

// attention_packed's node: dqkv [B,N,Hq+2Hkv,D] with dq, dk, dv written into its head slices.
struct PackedAttentionBackward : autograd::Node {
  Tensor qkv, out, lse;  // out: the token-major [B,N,Hq,D] result (detached)
  Problem p;
  std::shared_ptr<const MaskPlan> plan;
  std::shared_ptr<const DropoutDraw> drop;
  const char* name() const override { return "PackedAttentionBackward"; }
  std::vector<Tensor> backward(const Tensor& dout) override {
    auto heads = [](const Tensor& t, int64_t start, int64_t len) { return t.narrow(2, start, len).transpose(1, 2); };
    Tensor dqkv = Tensor::empty(qkv.shape(), p.dtype);
    FusedGrads into{heads(dqkv, 0, p.Hq), heads(dqkv, p.Hq, p.Hkv), heads(dqkv, p.Hq + p.Hkv, p.Hkv)};
    fused_attention_backward(dout.transpose(1, 2), heads(qkv, 0, p.Hq), heads(qkv, p.Hq, p.Hkv),
                             heads(qkv, p.Hq + p.Hkv, p.Hkv), out.transpose(1, 2), lse, p, *plan, *drop, &into);
    return {dqkv};
  }
  void release() override {
    qkv = out = lse = Tensor();
    plan.reset();
    drop.reset();
  }
};

bool routes_to_reference(const AttentionOptions& o) { return o.kernel == Kernel::reference; }

#ifdef QKV_WITH_CUDA
// The CUDA kernels' node: the same vjp, on the device, by the kernels that ran the forward: the
// float32 ones (attention/cuda/fused_cuda.h) or the tensor-core ones (attention/cuda/mma_attention.h).
struct CudaAttentionBackward : autograd::Node {
  Tensor q, k, v, out, lse;
  std::shared_ptr<const cuda_fused::Plan> plan;
  bool tensor_cores = false;
  const char* name() const override { return tensor_cores ? "CudaMmaAttentionBackward" : "CudaAttentionBackward"; }
  std::vector<Tensor> backward(const Tensor& dout) override {
    FusedGrads g = tensor_cores ? cuda_mma::backward(dout, q, k, v, out, lse, *plan)
                                : cuda_fused::backward(dout, q, k, v, out, lse, *plan);
    return {g.dq, g.dk, g.dv};
  }
  void release() override {
    q = k = v = out = lse = Tensor();
    plan.reset();
  }
};

// attention_packed's node on the device: the kernels read q, k, v in place from qkv and dO from the
// token-major gradient (transposed views, rows contiguous); dq, dk, dv come back per head and are
// copied into the head slices of one dqkv, with no zero fill and no sum of three full-size
// narrow gradients. Only the token-major output is kept (the head-major one is freed).
struct CudaPackedAttentionBackward : autograd::Node {
  Tensor qkv, out, lse;  // out: the token-major [B,N,Hq,D] result (detached)
  std::shared_ptr<const cuda_fused::Plan> plan;
  bool tensor_cores = false;
  const char* name() const override {
    return tensor_cores ? "CudaMmaPackedAttentionBackward" : "CudaPackedAttentionBackward";
  }
  std::vector<Tensor> backward(const Tensor& dout) override {
    const Problem& p = plan->p;
    auto heads = [&](const Tensor& t, int64_t start, int64_t len) { return t.narrow(2, start, len).transpose(1, 2); };
    const Tensor q = heads(qkv, 0, p.Hq), k = heads(qkv, p.Hq, p.Hkv), v = heads(qkv, p.Hq + p.Hkv, p.Hkv);
    const Tensor dout_h = dout.transpose(1, 2), out_h = out.transpose(1, 2);
    FusedGrads g = tensor_cores ? cuda_mma::backward(dout_h, q, k, v, out_h, lse, *plan)
                                : cuda_fused::backward(dout_h, q, k, v, out_h, lse, *plan);
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
    copy_(heads(dqkv, 0, p.Hq), g.dq);
    copy_(heads(dqkv, p.Hq, p.Hkv), g.dk);
    copy_(heads(dqkv, p.Hq + p.Hkv, p.Hkv), g.dv);
    return {dqkv};
  }
  void release() override {
    qkv = out = lse = Tensor();
    plan.reset();
  }
};
#endif

#ifdef QKV_WITH_CUDA
// The CUDA forward by the kernels chosen (tensor cores or float32), then the fully-masked-row
// policy `error`, which needs the lse on the host.
FusedForward device_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                            const cuda_fused::Plan& plan, bool tensor_cores) {
  FusedForward f = tensor_cores ? cuda_mma::forward(q, k, v, plan) : cuda_fused::forward(q, k, v, plan);
  if (opts.fully_masked == FullyMasked::error) {
    const std::vector<double> lse = f.lse.to_vector();
    for (size_t r = 0; r < lse.size(); ++r)
      if (std::isinf(lse[r])) fail_fully_masked(plan.p, static_cast<int64_t>(r));
  }
  return f;
}
#endif

// Device tensors: the CUDA fused kernels where they support the options, else the composed
// reference path (which handles everything on any device). `bf16_operands` (a call made under bf16
// autocast: q, k, v and the incoming gradient are bf16 values) selects the tensor-core kernels
// where they support the call, unless QKV_CUDA_ATTENTION asks for the float32 ones.
Tensor device_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                        const Problem& p, bool bf16_operands) {
#ifdef QKV_WITH_CUDA
  if (q.device() == Device::cuda && !routes_to_reference(opts) && !opts.check_invariants &&
      cuda_fused::supported(opts, p)) {
    QKV_CHECK(k.device() == q.device() && v.device() == q.device(), "[attention] q, k and v must be on one device");
    auto plan = cuda_fused::make_plan(opts, p);
    const bool tensor_cores = bf16_operands && cuda_mma::enabled() && cuda_mma::supported(opts, p);
    FusedForward f = device_forward(q, k, v, opts, *plan, tensor_cores);
    if (!autograd::any_requires_grad({&q, &k, &v})) return f.out;
    auto node = std::make_shared<CudaAttentionBackward>();
    node->q = q.detach();
    node->k = k.detach();
    node->v = v.detach();
    node->out = f.out.detach();
    node->lse = f.lse;
    node->plan = plan;
    node->tensor_cores = tensor_cores;
    return autograd::record(f.out, node, {q, k, v});
  }
#else
  (void)bf16_operands;
#endif
  return reference_attention(q, k, v, opts, p).out;
}

// attention() past its autocast branch; `bf16_operands` says that branch was taken (see device_attention).
Tensor attention_on(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                    bool bf16_operands) {
  const Problem p = check_problem(q, k, v, opts);
  if (q.device() != Device::cpu) return device_attention(q, k, v, opts, p, bf16_operands);
  if (routes_to_reference(opts)) return reference_attention(q, k, v, opts, p).out;
  QKV_CHECK(!(opts.bias.defined() && autograd::any_requires_grad({&opts.bias})),
            "[attention] the fused kernel treats bias as a constant, but bias ", shape_str(opts.bias.shape()),
            " requires grad: use kernel = reference to learn it");
  auto plan = std::make_shared<const MaskPlan>(p.shape(), opts, p.dtype);
  auto drop = std::make_shared<const DropoutDraw>(opts, p.Hq);
  FusedForward f = fused_attention_forward(q, k, v, p, *plan, *drop, opts.fully_masked);
  if (opts.check_invariants) check_fused_invariants(q, k, v, f, p, *plan, *drop);
  if (!autograd::any_requires_grad({&q, &k, &v})) return f.out;
  auto node = std::make_shared<FusedAttentionBackward>();
  node->q = q.detach();
  node->k = k.detach();
  node->v = v.detach();
  node->out = f.out.detach();
  node->lse = f.lse;
  node->p = p;
  node->plan = plan;
  node->drop = drop;
  return autograd::record(f.out, node, {q, k, v});
}

// attention_packed on the CPU fused kernel: O written token-major, dqkv by PackedAttentionBackward.
Tensor packed_on_cpu(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
                     const AttentionOptions& opts) {
  auto plan = std::make_shared<const MaskPlan>(p.shape(), opts, p.dtype);
  auto drop = std::make_shared<const DropoutDraw>(opts, p.Hq);
  FusedForward f = fused_attention_forward(q, k, v, p, *plan, *drop, opts.fully_masked, /*token_major=*/true);
  Tensor out = f.out.transpose(1, 2);  // [B, N, Hq, D], contiguous
  if (!autograd::any_requires_grad({&qkv})) return out;
  auto node = std::make_shared<PackedAttentionBackward>();
  node->qkv = qkv.detach();
  node->out = out.detach();
  node->lse = f.lse;
  node->p = p;
  node->plan = plan;
  node->drop = drop;
  return autograd::record(out, node, {qkv});
}

#ifdef QKV_WITH_CUDA
// attention_packed on the CUDA kernels (tensor cores under bf16 autocast where they apply).
Tensor packed_on_device(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
                        const AttentionOptions& opts, bool bf16_operands) {
  auto plan = cuda_fused::make_plan(opts, p);
  const bool tensor_cores = bf16_operands && cuda_mma::enabled() && cuda_mma::supported(opts, p);
  FusedForward f = device_forward(q, k, v, opts, *plan, tensor_cores);
  Tensor out = f.out.transpose(1, 2).contiguous();  // [B, N, Hq, D]
  f.out = Tensor();                                  // the head-major result is not kept
  if (!autograd::any_requires_grad({&qkv})) return out;
  auto node = std::make_shared<CudaPackedAttentionBackward>();
  node->qkv = qkv.detach();
  node->out = out.detach();
  node->lse = f.lse;
  node->plan = plan;
  node->tensor_cores = tensor_cores;
  return autograd::record(out, node, {qkv});
}
#endif

// attention_packed() past its autocast branch (`bf16_operands` as in attention_on).
Tensor attention_packed_on(const Tensor& qkv, int64_t q_heads, int64_t kv_heads, const AttentionOptions& opts,
                           bool bf16_operands) {
  QKV_CHECK(qkv.defined() && qkv.dim() == 4 && q_heads > 0 && kv_heads > 0 && qkv.size(2) == q_heads + 2 * kv_heads,
            "[attention] packed qkv must be [B, N, Hq + 2·Hkv, D] with Hq=", q_heads, ", Hkv=", kv_heads, ", got ",
            qkv.defined() ? shape_str(qkv.shape()) : std::string("undefined"));
  // q, k, v read in place: [B, H, N, D] views of qkv's head slices (rows contiguous).
  const bool in_place = qkv.stride(3) == 1 && !routes_to_reference(opts) && !opts.check_invariants &&
                        !(opts.bias.defined() && autograd::any_requires_grad({&opts.bias}));
  if (in_place) {
    auto heads = [&](int64_t start, int64_t len) { return qkv.narrow(2, start, len).transpose(1, 2); };
    const Tensor q = heads(0, q_heads), k = heads(q_heads, kv_heads), v = heads(q_heads + kv_heads, kv_heads);
    const Problem p = check_problem(q, k, v, opts);
    if (qkv.device() == Device::cpu) return packed_on_cpu(qkv, q, k, v, p, opts);
#ifdef QKV_WITH_CUDA
    if (qkv.device() == Device::cuda && cuda_fused::supported(opts, p))
      return packed_on_device(qkv, q, k, v, p, opts, bf16_operands);
#endif
  }
  // The composed views: the plain op handles every option (and its errors).
  auto heads = [&](int64_t start, int64_t len) { return ag::transpose(ag::narrow(qkv, 2, start, len), 1, 2); };
  Tensor y = attention_on(heads(0, q_heads), heads(q_heads, kv_heads), heads(q_heads + kv_heads, kv_heads), opts,
                          bf16_operands);
  return ag::contiguous(ag::transpose(y, 1, 2));
}

}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  if (autograd::autocast_bf16() && q.defined() && q.dtype() == DType::f32) {
    // bf16 autocast: q, k, v rounded to bf16, the kernel accumulating in float32, dO rounded.
    autograd::AutocastGuard inside(false);  // the kernels below see plain float32 tensors
    return ag::round_grad_bf16(
        attention_on(ag::round_bf16(q), ag::round_bf16(k), ag::round_bf16(v), opts, /*bf16_operands=*/true));
  }
  return attention_on(q, k, v, opts, /*bf16_operands=*/false);
}

Tensor attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads, const AttentionOptions& opts) {
  if (autograd::autocast_bf16() && qkv.defined() && qkv.dtype() == DType::f32) {
    autograd::AutocastGuard inside(false);  // as in attention()
    return ag::round_grad_bf16(attention_packed_on(ag::round_bf16(qkv), q_heads, kv_heads, opts, /*bf16_operands=*/true));
  }
  return attention_packed_on(qkv, q_heads, kv_heads, opts, /*bf16_operands=*/false);
}

AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& opts) {
  const Problem p = check_problem(q, k, v, opts);
  return reference_attention(q, k, v, opts, p);
}

}  // namespace qkv::attn
