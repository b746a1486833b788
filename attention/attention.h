// The attention op: scaled dot-product attention (Vaswani et al. 2017, Attention Is All You Need)
// with masks, ALiBi (Press et al. 2022), GQA/MQA and dropout; one fused kernel (Dao et al. 2022,
// FlashAttention) and one composed reference. docs/design.md has the backends and fallback rule.
//
// Shapes:  q [B, Hq, Nq, D]   k [B, Hkv, Nk, D]   v [B, Hkv, Nk, Dv]   out [B, Hq, Nq, Dv]
//          Hq % Hkv == 0; query head h reads K/V head h / G with G = Hq / Hkv (GQA; Hkv == 1 is
//          MQA). K/V are never copied per query head; dK/dV sum over the G heads of a group.
//
// Forward, per (b, h), with s = scale (default 1/sqrt(D)) and pos_i = Nk - Nq + i (bottom-right):
//   S   = s·Q·Kᵀ + bias + alibi          alibi_ij = -slope_h · (pos_i - j)
//   S'  = S where visible(b,h,i,j), -inf elsewhere (every mask ANDed, applied BEFORE softmax)
//   P   = softmax_j(S')                  row log-sum-exp lse_i = log Σ_j exp(S'_ij)
//   P~  = P ∘ Z                          inverted dropout: Z_ij ∈ {0, 1/(1-p)} (Philox, below)
//   O   = P~ · V
// Backward (the vjp of each line above, in reverse), given dO:
//   dV  = P~ᵀ·dO          dP~ = dO·Vᵀ          dP = dP~ ∘ Z
//   Di  = Σ_j P_ij dP_ij = rowsum(dO ∘ O)      (holds with dropout too: rowsum(dP∘P) = rowsum(dO∘O))
//   dS  = P ∘ (dP − Di)   dQ = s·dS·K           dK = s·dSᵀ·Q
// The fused kernel saves only O and lse and recomputes P = exp(S' − lse) tile by tile.
//
// visible(b,h,i,j) is the AND of every mask that is set:
//   causal          j <= pos_i
//   window w > 0    pos_i - w < j <= pos_i        (a causal sliding window)
//   key_padding     key_padding[b, j]             (true = valid key)
//   key_lengths     j < key_lengths[b]
//   segment_ids     seg[b, pos_i] == seg[b, j]    (queries are the last Nq positions)
//   allow_mask      allow_mask[b, h, i, j]        (broadcast; true = may attend)
//   pattern         allows(pos_i, j)              (a sparse pattern, below; attention/pattern/pattern.h)
//
// Sparse patterns (AttentionOptions::pattern), on absolute positions p = pos_i and d = p - j, so a
// KV-cache decode row sees the same keys as that row of the full forward. Each is ANDed with the
// masks above: under causal only j <= p of it survives (a decoder never reads the future).
// Parameters: l (local), s (stride), G (global positions: the first g, or an explicit list),
// r (random blocks), bs (block size), seed. qb = floor(p / bs), kb = floor(j / bs).
//   full          true
//   window        |d| < l                                        (l default bs = 64; causal: p-l < j <= p)
//   strided       |d| < l  or  d mod s == 0                      (s default ceil(sqrt(Nk)), l default s;
//                                                                 causal: p-l < j <= p or s | (p-j))
//   global        |d| < l  or  p ∈ G  or  j ∈ G                  (l default 1: itself; G default {0};
//                                                                 l = w gives Longformer)
//   bigbird       |d| < l  or  p ∈ G  or  j ∈ G  or  kb ∈ R(qb)  (l default bs, G default {0}, r default 2)
//                 R(qb) = { rand(qb, k) : k < r },  rand(qb, k) = X mod m, X = the 64-bit word
//                 (x0 << 32 | x1) of Philox4x32-10 with key (seed & 0xffffffff, seed >> 32) and
//                 counter (qb, k, 0x5ba25e00, qb >> 32); m = qb + 1 under a causal mask (blocks
//                 of the past), else ceil(Nk / bs). The same on every kernel, device and resume.
//   block_sparse  layout[qb][kb]: "local_global": |qb - kb| <= 1 or kb == 0 or qb == 0;
//                 "fixed": kb == qb or kb mod 4 == 3; or a 0/1 table loaded from a file.
// A stride or local width of 0 means "auto" and is resolved from this call's Nk; models resolve it
// once from their block_size so that decode keeps it. The fused kernels visit only the non-empty
// tiles of the pattern's block layout (patterns.h), and skip the per-element mask in full ones.
// A row with no visible key ("fully masked", e.g. left padding under causal) yields a zero output
// row, lse = -inf and zero gradients (FullyMasked::zero), or an error naming batch, head and row
// (FullyMasked::error). Never NaN. A bias of -inf also masks (and can empty a row the same way).
//
// Dropout mask (shared by both kernels, so they agree bit for bit on which weights survive):
//   Philox4x32-10 with key (k0, k1) = (seed & 0xffffffff, (seed >> 32) ^ (offset >> 32)) and
//   counter (c0, c1, c2, c3) = (j / 4, i, b·Hq + h, offset & 0xffffffff); output word j % 4 is x;
//   keep iff (x >> 8) >= ceil(p · 2^24), i.e. a 24-bit uniform u = (x >> 8) / 2^24 satisfies u >= p.
//   i is the query row index in [0, Nq), h the query head. Callers give each layer / step its own
//   offset (or seed) so masks do not repeat.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/pattern/pattern.h"
#include "autograd/gradcheck.h"
#include "tensor/tensor.h"

namespace qkv::attn {

enum class Kernel { fused, reference };
enum class FullyMasked { zero, error };

// Sizes of one attention call, for the mask helpers below (no tensors needed).
struct AttentionShape {
  int64_t batch = 1, q_heads = 1, kv_heads = 1, nq = 1, nk = 1;
};

// The structural mask as plain values: where query row i sits, which keys a position may see
// before the per-key masks, and which kv head a query head reads. attention() derives them from
// the options (mask_rules below); tests and leakcheck's self-test build deliberately wrong ones
// (AttentionOptions::rules) to prove that their detectors notice a wrong mask.
//   pos_i      = q_offset + i
//   structural key interval of position p: [p + lo, p + hi), an end left open when has_lo/has_hi is off
//   query head h reads kv head kv_head[h]
struct MaskRules {
  int64_t q_offset = 0;
  bool has_lo = false, has_hi = false;
  int64_t lo = 0, hi = 0;
  std::vector<int64_t> kv_head;  // [Hq], entries in [0, Hkv)
  // A causal sliding window that drops a key of some row of nq queries (a window at least as
  // long as the last position cuts nothing: that is causal attention).
  bool sliding_window_cuts(int64_t nq) const { return has_lo && has_hi && hi <= 1 && q_offset + nq - 1 + lo > 0; }
};

struct AttentionOptions {
  double scale = 0;                  // 0 -> 1/sqrt(D)
  bool causal = false;               // bottom-right aligned: query i at absolute position Nk - Nq + i
  int64_t window = 0;                // w > 0: key j visible iff pos_i - w < j <= pos_i
  Tensor key_padding;                // optional bool [B, Nk], true = valid key
  std::vector<int64_t> key_lengths;  // optional: keys [0, len_b) valid in batch row b
  Tensor allow_mask;                 // optional bool broadcastable to [B, Hq, Nq, Nk], true = may attend
  Tensor bias;                       // optional additive float, broadcastable to [B, Hq, Nq, Nk]; a
                                     // constant for the fused kernel (no gradient); the reference
                                     // kernel differentiates it when it requires grad
  std::vector<float> alibi_slopes;   // optional, one per query head: adds -slope·(pos_i - j) on the fly
  Tensor segment_ids;                // optional int [B, Nk]: attend only within the same segment
  double dropout_p = 0;              // training only: the caller passes 0 in eval
  uint64_t dropout_seed = 0, dropout_offset = 0;
  FullyMasked fully_masked = FullyMasked::zero;
  Kernel kernel = Kernel::fused;
  bool check_invariants = false;  // attention/cpu/invariants.cpp (debug mode); throws on failure
  // Optional explicit rules replacing mask_rules(shape, *this) (tests, leakcheck's self-test). The
  // CPU kernels follow any rules; the CUDA kernels derive the standard ones themselves, so a call
  // with explicit rules takes the reference path there.
  std::shared_ptr<const MaskRules> rules;
  // Optional sparse pattern (definitions above), ANDed with every mask. CUDA kernels that cannot
  // walk it route the call to the reference path (supported() is false).
  std::shared_ptr<const SparsePattern> pattern;
};

// The rules the options mean: q_offset = Nk - Nq (bottom-right); causal: hi = 1; window w > 0:
// lo = 1 - w, hi = 1; kv_head[h] = h / (Hq / Hkv).
MaskRules mask_rules(const AttentionShape& shape, const AttentionOptions& opts);

// Differentiable in q, k, v. The fused kernel records ONE autograd node (FusedAttentionBackward);
// the reference kernel records the composed graph (matmul, masked_fill, softmax, mul, matmul).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {});

// Self-attention on a fused projection, the layout of GPT-2's c_attn output viewed by heads:
// qkv [B, N, Hq + 2·Hkv, D] holds per token the Hq query heads, then Hkv key heads, then Hkv
// value heads. Returns out [B, N, Hq, D], token-major and contiguous, so [B, N, Hq·D] for the
// output projection is a view. The same values as
//   attention(q, k, v, opts).transpose(1, 2), q = qkv[:, :, :Hq].transpose(1, 2), k, v likewise,
// and differentiable in qkv. The fused kernel records ONE node (PackedAttentionBackward) that
// writes dq, dk and dv straight into one [B, N, Hq + 2·Hkv, D] gradient: no head transposes, no
// zero-filled per-piece gradients summed by the engine. Options that route to the reference kernel
// (or check invariants) fall back to those composed views.
Tensor attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads, const AttentionOptions& opts = {});

// Reference kernel, returning the weights P [B, Hq, Nq, Nk] (after softmax, before dropout) too.
struct AttentionWeights {
  Tensor out, weights;
  int64_t fully_masked_rows = 0;
};
AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionOptions& opts = {});

// Rows (b, h, i) whose mask admits no key (bias is not consulted): what leakcheck and the
// training metrics report.
int64_t count_fully_masked_rows(const AttentionShape& shape, const AttentionOptions& opts);
// The combined mask as a bool tensor [B, Hq, Nq, Nk] (true = visible), for tests and tools.
Tensor visibility_mask(const AttentionShape& shape, const AttentionOptions& opts);
// The figures of a call's sparse pattern: kept_pairs = visible (i, j) pairs counted over the whole
// [B, Hq, Nq, Nk] problem (every mask; computed from the block layout when no elementwise mask is
// set), and the fused CPU kernel's tiles: visited (non-empty) of total, and how many are full.
// Without a pattern the layout is the structural mask's own (causal, window).
struct PatternStats {
  int64_t kept_pairs = 0, visited_tiles = 0, full_tiles = 0, total_tiles = 0, tile_q = 0, tile_k = 0;
};
PatternStats pattern_stats(const AttentionShape& shape, const AttentionOptions& opts);
// The dropout multipliers Z [B, Hq, Nq, Nk] (0 or 1/(1-p)) in `dtype`, drawn as documented above.
Tensor dropout_scale_mask(const AttentionShape& shape, const AttentionOptions& opts, DType dtype = DType::f32);

// Gradcheck cases of the fused op (the mask × heads × lengths × dropout grid), RoPE and the
// reference path (attention/gradchecks.cpp).
void register_attention_gradchecks(autograd::GradcheckRegistry& r);

}  // namespace qkv::attn
