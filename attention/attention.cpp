// attention() and attention_packed(): validate, pick the kernels by one fallback rule
// (fused_backend) and, for fused kernels of any backend, record the one autograd node
// (AttentionBackward) whose backward is the hand-derived vjp (attention/cpu/fused_backward.cpp and its
// CUDA twins).
#include "attention/attention.h"

#include <cmath>
#include <functional>
#include <memory>
#include <optional>

#include "attention/cpu/reference.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#ifdef QKV_WITH_CUDA
#include "attention/cuda/fused_cuda.h"
#include "attention/cuda/mma_attention.h"
#endif

namespace qkv::attn {

namespace {

// ---- The fused kernels of one backend, behind one interface ----

// Which fused kernels run a call: the CPU ones (attention/cpu/fused.h), the CUDA float32 ones
// (attention/cuda/fused_cuda.h) or the CUDA tensor-core ones (attention/cuda/mma_attention.h).
enum class Backend { cpu, cuda, cuda_mma };

// One call's plan for its backend: the checked sizes and what the kernels read besides q, k, v.
struct Kernels {
  Backend backend = Backend::cpu;
  Problem p;
  std::shared_ptr<const MaskPlan> mask;     // cpu
  std::shared_ptr<const DropoutDraw> drop;  // cpu
#ifdef QKV_WITH_CUDA
  std::shared_ptr<const cuda_fused::Plan> device;  // cuda, cuda_mma
#endif

  Kernels(Backend b, const AttentionOptions& o, const Problem& problem) : backend(b), p(problem) {
#ifdef QKV_WITH_CUDA
    if (b != Backend::cpu) {
      device = cuda_fused::make_plan(
          o, p, b == Backend::cuda_mma ? cuda_fused::KernelSet::tensor_core : cuda_fused::KernelSet::tiled);
      return;
    }
#endif
    mask = std::make_shared<const MaskPlan>(p.shape(), o, p.dtype);
    drop = std::make_shared<const DropoutDraw>(o, p.Hq);
  }

  // O and lse. The CPU kernels write O token-major when asked (a [B, Nq, Hq, Dv] buffer viewed as
  // [B, Hq, Nq, Dv]); the CUDA ones always head-major. The fully-masked-row policy `error` and the
  // invariant checks (CPU) are applied here.
  FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                       bool token_major) const {
#ifdef QKV_WITH_CUDA
    if (backend != Backend::cpu) {
      FusedForward f =
          backend == Backend::cuda_mma ? cuda_mma::forward(q, k, v, *device) : cuda_fused::forward(q, k, v, *device);
      if (o.fully_masked == FullyMasked::error) {  // needs the lse on the host
        const std::vector<double> lse = f.lse.to_vector();
        for (size_t r = 0; r < lse.size(); ++r)
          if (std::isinf(lse[r])) fail_fully_masked(p, static_cast<int64_t>(r));
      }
      return f;
    }
#endif
    FusedForward f = fused_attention_forward(q, k, v, p, *mask, *drop, o.fully_masked, token_major);
    if (o.check_invariants) check_fused_invariants(q, k, v, f, p, *mask, *drop);
    return f;
  }

  // dq, dk, dv. With `into`, they land in the views it returns (slices of one packed gradient):
  // the CPU kernels write them in place; the CUDA ones copy their results in once done, so `into`
  // is called only then (after the kernels' scratch is freed).
  FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const std::function<FusedGrads()>& into = {}) const {
#ifdef QKV_WITH_CUDA
    if (backend != Backend::cpu) {
      FusedGrads g = backend == Backend::cuda_mma ? cuda_mma::backward(dout, q, k, v, out, lse, *device)
                                                  : cuda_fused::backward(dout, q, k, v, out, lse, *device);
      if (!into) return g;
      FusedGrads d = into();
      copy_(d.dq, g.dq);
      copy_(d.dk, g.dk);
      copy_(d.dv, g.dv);
      return d;
    }
#endif
    if (!into) return fused_attention_backward(dout, q, k, v, out, lse, p, *mask, *drop);
    const FusedGrads d = into();
    return fused_attention_backward(dout, q, k, v, out, lse, p, *mask, *drop, &d);
  }
};

bool bias_requires_grad(const AttentionOptions& o) {
  return o.bias.defined() && autograd::any_requires_grad({&o.bias});
}

// The one fallback rule: the fused kernels of the tensors' device where they support the call,
// else nothing, and the caller takes the composed path (attention(): the reference kernel, which
// handles every option on any device; attention_packed(): attention() on views of qkv).
//   - kernel = reference asks for the composed path;
//   - CPU: every option, except that packed calls leave invariant checks and a bias that
//     requires grad to attention() (which checks, or refuses the bias, on separate q, k, v);
//   - CUDA: the options cuda_fused::supported accepts, no invariant checks; the tensor-core
//     kernels for bf16 operands (a call under bf16 autocast) where they apply;
//   - packed calls need rows of qkv contiguous (the kernels read q, k, v in place).
std::optional<Backend> fused_backend(const AttentionOptions& o, const Problem& p, Device dev, bool packed,
                                     bool rows_contiguous, bool bf16_operands) {
  if (o.kernel == Kernel::reference || (packed && !rows_contiguous)) return std::nullopt;
  if (dev == Device::cpu) {
    if (packed && (o.check_invariants || bias_requires_grad(o))) return std::nullopt;
    return Backend::cpu;
  }
#ifdef QKV_WITH_CUDA
  if (dev == Device::cuda && !o.check_invariants && cuda_fused::supported(o, p))
    return bf16_operands && cuda_mma::enabled() && cuda_mma::supported(o, p) ? Backend::cuda_mma : Backend::cuda;
#else
  (void)p;
  (void)bf16_operands;
#endif
  return std::nullopt;
}

// ---- The one autograd node ----

// The fused vjp of attention.h, by the kernels that ran the forward:
//   dQ = s·dS·K, dK = s·dSᵀ·Q, dV = (P∘Z)ᵀ·dO with dS = P∘(dP∘Z − rowsum(dO∘O)), P recomputed from lse.
// Layout heads: inputs q, k, v; grads dq, dk, dv. Layout packed (attention_packed): input qkv
// [B, N, Hq + 2·Hkv, D], out and dO token-major [B, N, Hq, D]; the kernels read q, k, v as head
// views of qkv and dq, dk, dv land in the head slices of one dqkv (no zero fill, no sum of three
// full-size narrow gradients).
struct AttentionBackward : autograd::Node {
  enum class Layout { heads, packed };
  Layout layout = Layout::heads;
  std::shared_ptr<const Kernels> kernels;
  Tensor q, k, v, qkv;  // heads: q, k, v; packed: qkv (all detached)
  Tensor out, lse;      // out as the caller got it (detached), lse [B, Hq, Nq]

  const char* name() const override {
    static const char* const names[2][3] = {
        {"FusedAttentionBackward", "CudaAttentionBackward", "CudaMmaAttentionBackward"},
        {"PackedAttentionBackward", "CudaPackedAttentionBackward", "CudaMmaPackedAttentionBackward"}};
    return names[static_cast<int>(layout)][static_cast<int>(kernels ? kernels->backend : Backend::cpu)];
  }
  std::vector<Tensor> backward(const Tensor& dout) override {
    if (layout == Layout::heads) {
      FusedGrads g = kernels->backward(dout, q, k, v, out, lse);
      return {g.dq, g.dk, g.dv};
    }
    const Problem& p = kernels->p;
    auto heads = [&](const Tensor& t, int64_t start, int64_t len) { return t.narrow(2, start, len).transpose(1, 2); };
    Tensor dqkv;
    auto into = [&] {
      dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
      return FusedGrads{heads(dqkv, 0, p.Hq), heads(dqkv, p.Hq, p.Hkv), heads(dqkv, p.Hq + p.Hkv, p.Hkv)};
    };
    kernels->backward(dout.transpose(1, 2), heads(qkv, 0, p.Hq), heads(qkv, p.Hq, p.Hkv),
                      heads(qkv, p.Hq + p.Hkv, p.Hkv), out.transpose(1, 2), lse, into);
    return {dqkv};
  }
  void release() override {
    q = k = v = qkv = out = lse = Tensor();
    kernels.reset();
  }
};

// ---- The two entry paths (past the autocast branch; `bf16_operands` says it was taken) ----

Tensor attention_on(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                    bool bf16_operands) {
  const Problem p = check_problem(q, k, v, opts);
  const std::optional<Backend> backend =
      fused_backend(opts, p, q.device(), /*packed=*/false, /*rows_contiguous=*/true, bf16_operands);
  if (!backend) return reference_attention(q, k, v, opts, p).out;
  QKV_CHECK(!bias_requires_grad(opts), "[attention] the fused kernel treats bias as a constant, but bias ",
            shape_str(opts.bias.shape()), " requires grad: use kernel = reference to learn it");
  auto kernels = std::make_shared<const Kernels>(*backend, opts, p);
  FusedForward f = kernels->forward(q, k, v, opts, /*token_major=*/false);
  if (!autograd::any_requires_grad({&q, &k, &v})) return f.out;
  auto node = std::make_shared<AttentionBackward>();
  node->kernels = kernels;
  node->q = q.detach();
  node->k = k.detach();
  node->v = v.detach();
  node->out = f.out.detach();
  node->lse = f.lse;
  return autograd::record(f.out, node, {q, k, v});
}

Tensor attention_packed_on(const Tensor& qkv, int64_t q_heads, int64_t kv_heads, const AttentionOptions& opts,
                           bool bf16_operands) {
  QKV_CHECK(qkv.defined() && qkv.dim() == 4 && q_heads > 0 && kv_heads > 0 && qkv.size(2) == q_heads + 2 * kv_heads,
            "[attention] packed qkv must be [B, N, Hq + 2·Hkv, D] with Hq=", q_heads, ", Hkv=", kv_heads, ", got ",
            qkv.defined() ? shape_str(qkv.shape()) : std::string("undefined"));
  const bool rows_contiguous = qkv.stride(3) == 1;
  if (rows_contiguous && opts.kernel != Kernel::reference) {
    // q, k, v read in place: [B, H, N, D] views of qkv's head slices (rows contiguous).
    auto heads = [&](int64_t start, int64_t len) { return qkv.narrow(2, start, len).transpose(1, 2); };
    const Tensor q = heads(0, q_heads), k = heads(q_heads, kv_heads), v = heads(q_heads + kv_heads, kv_heads);
    const Problem p = check_problem(q, k, v, opts);
    if (const std::optional<Backend> backend =
            fused_backend(opts, p, qkv.device(), /*packed=*/true, rows_contiguous, bf16_operands)) {
      auto kernels = std::make_shared<const Kernels>(*backend, opts, p);
      FusedForward f = kernels->forward(q, k, v, opts, /*token_major=*/true);
      // [B, N, Hq, D]: a view of the CPU kernels' token-major buffer, a copy of the CUDA ones' output
      const Tensor out = f.out.transpose(1, 2).contiguous();
      f.out = Tensor();  // the head-major result is not kept
      if (!autograd::any_requires_grad({&qkv})) return out;
      auto node = std::make_shared<AttentionBackward>();
      node->layout = AttentionBackward::Layout::packed;
      node->kernels = kernels;
      node->qkv = qkv.detach();
      node->out = out.detach();
      node->lse = f.lse;
      return autograd::record(out, node, {qkv});
    }
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
    return ag::round_grad_bf16(
        attention_packed_on(ag::round_bf16(qkv), q_heads, kv_heads, opts, /*bf16_operands=*/true));
  }
  return attention_packed_on(qkv, q_heads, kv_heads, opts, /*bf16_operands=*/false);
}

AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& opts) {
  const Problem p = check_problem(q, k, v, opts);
  return reference_attention(q, k, v, opts, p);
}

}  // namespace qkv::attn
