// ALiBi (attention with linear biases): query head h adds −m_h·(pos_i − j) to its logits, a
// penalty growing with distance. attention() computes it on the fly from
// AttentionOptions::alibi_slopes (no N×N tensor); under GQA the slopes stay per query head.
//
// Slopes: for H a power of two, m_h = 2^(−8(h+1)/H), h = 0..H−1 (a geometric sequence starting
// and stepping at 2^(−8/H)). Otherwise, with P the largest power of two below H: the P slopes of
// P heads, then every other slope of 2P heads (the 1st, 3rd, 5th, …) until H slopes are taken.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::attn {

std::vector<float> alibi_slopes(int64_t n_heads);
// The explicit bias [1, H, Nq, Nk] with query i at position Nk − Nq + i (for tests and study; the
// kernels never build it).
Tensor alibi_bias(const std::vector<float>& slopes, int64_t nq, int64_t nk, DType dtype = DType::f32);

}  // namespace qkv::attn
