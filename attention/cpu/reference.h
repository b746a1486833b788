// Internal to attention/: the reference kernel (attention/cpu/reference.cpp) and the runtime
// invariant checks (attention/cpu/invariants.cpp: masked weights 0, rows sum to 1, O = A·V).
#pragma once
#include "attention/cpu/fused.h"

namespace qkv::attn {

// Composed of differentiable ops (ag::matmul → mask → softmax → dropout → ag::matmul), so autograd
// differentiates it (and a bias that requires grad). Materializes S and P: O(N²) memory.
AttentionWeights reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                     const Problem& p);

// Throw qkv::Error("[attention] invariant violated: ...") on the first failure.
// Reference: masked weights exactly 0; valid rows sum to 1, fully masked rows to 0; finite output.
void check_reference_invariants(const AttentionWeights& r, const Problem& p, const MaskPlan& plan);
// Fused: recomputes each row's weights P_ij = exp(S_ij − lse_i) with the full predicate (not the
// kernel's tile intervals) and checks rows sum to 1 (0 when fully masked) and O = (P∘Z)·V.
void check_fused_invariants(const Tensor& q, const Tensor& k, const Tensor& v, const FusedForward& f, const Problem& p,
                            const MaskPlan& plan, const DropoutDraw& drop);

}  // namespace qkv::attn
