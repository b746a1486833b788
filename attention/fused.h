// Internal to attention/: the fused CPU kernels (fused_forward.cpp, fused_backward.cpp) behind
// attention() and its FusedAttentionBackward node.
#pragma once
#include "attention/mask.h"

namespace qkv::attn {

// Tile sizes: query rows per block and keys per tile. Each thread holds a few Bq×Bk tiles, so
// extra memory is O(threads·Bq·Bk + N·D), never N×N.
constexpr int64_t kBlockQ = kTileQ;  // the grid of sparse block layouts (mask.h)
constexpr int64_t kBlockK = kTileK;

// Threads worth starting for `flops` of work split into `tasks` pieces: small calls (a decode
// step, a gradcheck case) stay on the calling thread, where a parallel region costs more than it saves.
inline int worth_threads(double flops, int64_t tasks, int max_threads) {
  constexpr double kFlopsPerThread = 4e6;  // ~50 µs of tile GEMMs
  const double by_work = std::max(1.0, flops / kFlopsPerThread);
  return static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({static_cast<int64_t>(max_threads), tasks, static_cast<int64_t>(by_work)})));
}

struct FusedForward {
  Tensor out;  // [B, Hq, Nq, Dv]: contiguous, or with token_major a view of a contiguous [B, Nq, Hq, Dv]
  Tensor lse;  // [B, Hq, Nq] in the compute dtype; -inf on fully masked rows
  int64_t fully_masked_rows = 0;
};
// q, k, v may be strided views whose last dim is contiguous (KV-cache views are). Under
// FullyMasked::error throws naming the first fully masked (batch, head, row).
FusedForward fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p,
                                     const MaskPlan& plan, const DropoutDraw& drop, FullyMasked policy,
                                     bool token_major = false);

struct FusedGrads {
  Tensor dq, dk, dv;  // shaped like q, k, v: contiguous, or the caller's views (rows contiguous)
};
// dout and out may be views with contiguous rows (token-major ones from attention_packed). When
// `into` is given its dq/dk/dv are the destinations (views with contiguous rows, e.g. slices of one
// packed gradient buffer); every element of them is written.
FusedGrads fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Problem& p, const MaskPlan& plan,
                                    const DropoutDraw& drop, const FusedGrads* into = nullptr);

// `t` itself when its rows are contiguous and BLAS can step between them, else a contiguous copy.
inline Tensor rows_contiguous(const Tensor& t) {
  const bool ok = t.stride(3) == 1 && (t.size(2) <= 1 || t.stride(2) >= t.size(3));
  return ok ? t : t.contiguous();
}

}  // namespace qkv::attn
