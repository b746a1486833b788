// Internal to attention/: the tensor-core (bf16 MMA) attention kernels (device code in
// attention/cuda/mma_attention_kernels.cuh, host side in mma_attention.cu), built only with
// QKV_WITH_CUDA and used for calls made under bf16 autocast, whose q, k, v (and the incoming
// gradient dO) are bf16 values held in float32 tensors. Same semantics and outputs as the
// float32 CUDA kernels of fused_cuda.h (O float32, lse float32 with −inf on rows that see no key,
// zero gradients for them), FlashAttention-2 style:
//   forward   one CTA per 64 query rows of one (b, h), 4 warps × 16 rows; K/V tiles of 64 keys are
//             converted to bf16 in shared memory; S = Q·Kᵀ and O += P·V by mma.sync m16n8k16 (bf16
//             operands, float32 accumulators); online softmax in float32 registers, P rounded to bf16
//             for P·V; O = acc / l, lse = m + log l.
//   backward  Di = rowsum(dO∘O) (float32); a key-block kernel (one CTA per 64 keys of one kv head)
//             recomputes P and dS = P∘(dP − Di) for every query block and query head of the group, in
//             a fixed order, into dK, dV; a query-block kernel recomputes them again into dQ. No
//             atomics: every gradient element is summed by one thread in one order (deterministic).
// Supported: head dim D = Dv ∈ {64, 128}, float32 tensors, causal (bottom-right), sliding window,
// key_lengths, GQA/MQA (kv head h / G, never copied), and every sparse pattern: the kernels walk
// its block layout on a 64 × 64 grid (cuda_fused::make_plan with KernelSet::tensor_core), never
// staging an empty tile, testing the pattern per element only in partial ones (pattern_predicate.cuh).
// Everything else keeps the float32 kernels.
#pragma once
#include <cstdint>
#include <memory>

#include "attention/cuda/fused_cuda.h"

namespace qkv::attn::cuda_mma {

// True when these kernels handle the call (options, dtype, head dim and sizes).
bool supported(const AttentionOptions& o, const Problem& p);
// Whether bf16 autocast sends supported calls to these kernels (on by default); off keeps the
// float32 kernels. The config key train.cuda_mma sets it for a run (run_training applies it). It
// stays a user-facing switch, unlike the untiled kernel variants (test-only, attention/cuda/dev/):
// it is how a user on a new GPU or driver, and scripts/gpu_check.sh, tell a bad tensor-core kernel
// apart from the rest of a bf16 run without rebuilding. Process-wide, read at each dispatch.
void set_enabled(bool on);
bool enabled();

// out [B, Hq, Nq, D] contiguous float32, lse [B, Hq, Nq] (−inf on rows with no visible key).
FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const cuda_fused::Plan& plan);
// dq, dk, dv contiguous float32, shaped like q, k, v.
FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const cuda_fused::Plan& plan);

// Launch counts since the process started (tests check that autocast dispatch reaches these kernels).
int64_t forward_calls();
int64_t backward_calls();

}  // namespace qkv::attn::cuda_mma
