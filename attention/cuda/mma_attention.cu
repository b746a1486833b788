// Tensor-core attention for bf16 autocast: the host side (design and limits in mma_attention.h; the
// kernels, their formulas and MMA fragment layouts in mma_attention_kernels.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "attention/cuda/mma_attention.h"
#include "attention/cuda/mma_attention_kernels.cuh"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/geometry.cuh"
#include "tensor/ops.h"

namespace qkv::attn::cuda_mma {
namespace {

using cuda::detail::ptr;

std::atomic<int64_t> g_forward_calls{0}, g_backward_calls{0};
std::atomic<bool> g_enabled{true};

// float4 reads need 16-byte aligned rows: a view that is not gets a contiguous copy.
Tensor vector_rows(const Tensor& t) {
  bool ok = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (t.size(d) <= 1 || t.stride(d) % 4 == 0);
  return ok ? t : t.clone();
}

Operand operand_of(const Tensor& t) { return {ptr<float>(t), t.stride(0), t.stride(1), t.stride(2)}; }

Params params_of(const Tensor& q, const Tensor& k, const Tensor& v, const cuda_fused::Plan& plan) {
  const Problem& p = plan.p;
  const cuda_fused::DeviceMask& m = plan.m;
  Params a;
  a.q = operand_of(q);
  a.k = operand_of(k);
  a.v = operand_of(v);
  a.Hq = static_cast<int>(p.Hq);
  a.Hkv = static_cast<int>(p.Hkv);
  a.G = static_cast<int>(p.G);
  a.Nq = static_cast<int>(p.Nq);
  a.Nk = static_cast<int>(p.Nk);
  a.q_offset = static_cast<int>(m.q_offset);
  // The window is int64 and unbounded (e.g. INT64_MAX for "no limit"); the kernels do int position
  // arithmetic (pos − w, j + w − q_offset). A window of Nk + 1 or more hides nothing the causal mask
  // does not (pos <= Nk − 1), so clamp it there: no truncation, no overflow, same visible keys.
  a.window = static_cast<int>(std::min<int64_t>(m.window, p.Nk + 1));
  a.causal_like = m.causal_like;
  a.key_len = m.key_len;
  a.scale = static_cast<float>(p.scale);
  a.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  if (m.pat.kind != 0) {
    static_assert(kLayoutTile == cuda_fused::kTensorCoreTile, "one layout grid for plan and kernels");
    QKV_CHECK(
        m.by_q.tq == kLayoutTile && m.by_q.tk == kLayoutTile && m.by_k.tq == kLayoutTile && m.by_k.tk == kLayoutTile,
        "[attention] the tensor-core kernels need a plan made for them (cuda_fused::make_plan with "
        "KernelSet::tensor_core): its pattern layout is on a ",
        m.by_q.tq, "x", m.by_q.tk, " grid");
    a.pat = m.pat;
    a.by_q = m.by_q;
    a.by_k = m.by_k;
  }
  return a;
}

// Dynamic shared memory beyond the default 48 KB must be allowed per kernel.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    QKV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

dim3 grid_of(int64_t heads, int64_t rows) {
  return dim3(static_cast<unsigned>(heads), static_cast<unsigned>((rows + kBlockRows - 1) / kBlockRows));
}

template <int D>
void launch_forward(const Params& a, int64_t heads) {
  constexpr size_t smem = forward_smem<D>();
  allow_smem(forward_kernel<D>, smem);
  forward_kernel<D><<<grid_of(heads, a.Nq), kThreads, smem>>>(a);
  QKV_CUDA_LAUNCHED("mma forward_kernel");
}

template <int D>
void launch_backward(const Params& a, int64_t B, int64_t qrows, int64_t krows) {
  constexpr int tile = kBackwardTile<D>;
  if (qrows > 0) {
    di_kernel<<<static_cast<unsigned>((qrows + kWarps - 1) / kWarps), kThreads>>>(a, qrows, D);
    QKV_CUDA_LAUNCHED("mma di_kernel");
    constexpr size_t smem = dq_smem<D, tile>();
    allow_smem(dq_kernel<D, tile>, smem);
    dq_kernel<D, tile><<<grid_of(B * a.Hq, a.Nq), kThreads, smem>>>(a);
    QKV_CUDA_LAUNCHED("mma dq_kernel");
  }
  if (krows > 0) {
    constexpr size_t smem = dkv_smem<D, tile>();
    allow_smem(dkv_kernel<D, tile>, smem);
    dkv_kernel<D, tile><<<grid_of(B * a.Hkv, a.Nk), kThreads, smem>>>(a);
    QKV_CUDA_LAUNCHED("mma dkv_kernel");
  }
}

}  // namespace

bool supported(const AttentionOptions& o, const Problem& p) {
  constexpr int64_t kMaxLen = INT_MAX / 4;  // positions and tile bounds are int in the kernels
  return p.dtype == DType::f32 && p.D == p.Dv && (p.D == 64 || p.D == 128) && !o.bias.defined() &&
         !o.allow_mask.defined() && !o.key_padding.defined() && !o.segment_ids.defined() && o.alibi_slopes.empty() &&
         o.dropout_p == 0 && !o.rules && p.Nq <= kMaxLen && p.Nk <= kMaxLen &&
         (p.Nq + kBlockRows - 1) / kBlockRows <= 65535 && (p.Nk + kBlockRows - 1) / kBlockRows <= 65535 &&
         p.B * p.Hq <= INT_MAX;
}

void set_enabled(bool on) { g_enabled.store(on); }
bool enabled() { return g_enabled.load(); }

int64_t forward_calls() { return g_forward_calls.load(); }
int64_t backward_calls() { return g_backward_calls.load(); }

FusedForward forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const cuda_fused::Plan& plan) {
  const Problem& p = plan.p;
  QKV_CHECK(p.D == p.Dv && (p.D == 64 || p.D == 128) && p.dtype == DType::f32,
            "[attention] the tensor-core kernels take float32 head dim 64 or 128, got D=", p.D, ", Dv=", p.Dv);
  const Tensor q = vector_rows(q_in), k = vector_rows(k_in), v = vector_rows(v_in);
  FusedForward r;
  r.out = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.dtype, Device::cuda);
  r.lse = Tensor::empty({p.B, p.Hq, p.Nq}, p.dtype, Device::cuda);
  ++g_forward_calls;
  if (p.B * p.Hq * p.Nq == 0) return r;
  Params a = params_of(q, k, v, plan);
  a.o_w = ptr<float>(r.out);
  a.lse_w = ptr<float>(r.lse);
  if (p.D == 64) launch_forward<64>(a, p.B * p.Hq);
  else launch_forward<128>(a, p.B * p.Hq);
  return r;
}

FusedGrads backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                    const Tensor& out_in, const Tensor& lse, const cuda_fused::Plan& plan) {
  const Problem& p = plan.p;
  QKV_CHECK(dout_in.shape() == Shape({p.B, p.Hq, p.Nq, p.Dv}) && lse.is_contiguous(),
            "[attention] tensor-core backward: dout is ", shape_str(dout_in.shape()), ", expected [", p.B, ", ", p.Hq,
            ", ", p.Nq, ", ", p.Dv, "] with a contiguous lse");
  const Tensor q = vector_rows(q_in), k = vector_rows(k_in), v = vector_rows(v_in), dout = vector_rows(dout_in),
               out = out_in.stride(3) == 1 ? out_in : out_in.contiguous();
  FusedGrads g;
  g.dq = Tensor::empty({p.B, p.Hq, p.Nq, p.D}, p.dtype, Device::cuda);
  g.dk = Tensor::empty({p.B, p.Hkv, p.Nk, p.D}, p.dtype, Device::cuda);
  g.dv = Tensor::empty({p.B, p.Hkv, p.Nk, p.Dv}, p.dtype, Device::cuda);
  ++g_backward_calls;
  const int64_t qrows = p.B * p.Hq * p.Nq, krows = p.B * p.Hkv * p.Nk;
  Tensor di = Tensor::empty({std::max<int64_t>(qrows, 1)}, p.dtype, Device::cuda);
  Params a = params_of(q, k, v, plan);
  a.out = operand_of(out);
  a.dout = operand_of(dout);
  a.lse = ptr<float>(lse);
  a.di = ptr<float>(di);
  a.di_w = ptr<float>(di);
  a.dq = ptr<float>(g.dq);
  a.dk = ptr<float>(g.dk);
  a.dv = ptr<float>(g.dv);
  if (p.D == 64) launch_backward<64>(a, p.B, qrows, krows);
  else launch_backward<128>(a, p.B, qrows, krows);
  return g;
}

}  // namespace qkv::attn::cuda_mma
