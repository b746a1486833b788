// Rotary position embedding (RoPE), rotate-half pairing as in GPT-NeoX / Llama: dimension f of
// the first half pairs with f + D/2. For a token at absolute position p and f in [0, D/2):
//   ω_f = θ^(−2f/D)      c = cos(p·ω_f)      s = sin(p·ω_f)
//   out[f]       = x[f]·c − x[f + D/2]·s
//   out[f + D/2] = x[f + D/2]·c + x[f]·s          (out = x·cos + rotate_half(x)·sin)
// The backward is the inverse rotation (the transpose): dx[f] = dy[f]·c + dy[f+D/2]·s,
// dx[f+D/2] = dy[f+D/2]·c − dy[f]·s. Angles are computed in float64.
// Rotating by absolute position makes q_i·k_j depend only on i − j, and lets a KV cache keep
// already rotated keys: new tokens are rotated at positions [cache.length(), …).
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace qkv::attn {

// x [B, H, N, D] (D even, float32/float64, any strides); positions int32/int64 [N] (shared by the
// batch) or [B, N] (per row: left padding, packed documents). Differentiable in x (RopeBackward).
Tensor apply_rope(const Tensor& x, const Tensor& positions, double theta = 10000.0);
// Positions start_pos, start_pos + 1, … for every batch row.
Tensor apply_rope(const Tensor& x, int64_t start_pos, double theta = 10000.0);

}  // namespace qkv::attn
