// Internal to attention/: the one mask predicate and dropout draw that both kernels share, so the
// reference and fused paths cannot disagree on which (b, h, i, j) is visible or dropped, and so
// explicit rules (MaskRules in attention.h, wrong ones included) reach both.
//
// Structural masks (the rules' interval, key_lengths) make each row's visible keys one interval
// [lo(pos), hi(pos)) whose ends are pos plus constants, so it only moves right as pos grows; the
// fused kernels use that to skip whole tiles and to mask a tile's edge without evaluating the
// predicate per element. The elementwise masks (key_padding, segment_ids, allow_mask) need it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention/attention.h"
#include "tensor/philox.h"

namespace qkv::attn {

// Checked sizes of one call (check_problem throws qkv::Error naming the shapes at fault).
struct Problem {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 1, Nq = 0, Nk = 0, D = 0, Dv = 0;
  double scale = 1;
  DType dtype = DType::f32;
  AttentionShape shape() const { return {B, Hq, Hkv, Nq, Nk}; }
};
Problem check_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o);
// The FullyMasked::error failure for query row `flat_row` = (b·Hq + h)·Nq + i, naming b, h and i.
[[noreturn]] void fail_fully_masked(const Problem& p, int64_t flat_row);

// The tile grid of the fused CPU kernels, in which a sparse pattern's block layout is computed
// (fused.h's kBlockQ / kBlockK are these).
constexpr int64_t kTileQ = 32;
constexpr int64_t kTileK = 32;

class MaskPlan {
 public:
  // Validates the mask options (and explicit rules) against `s` (throws naming shapes). When
  // `bias_dtype` is given the bias is converted to it for the fused kernels' raw reads.
  MaskPlan(const AttentionShape& s, const AttentionOptions& o, DType bias_dtype = DType::f32);

  int64_t B, Hq, Hkv, G, Nq, Nk;

  const MaskRules& rules() const { return rules_; }
  int64_t pos(int64_t i) const { return rules_.q_offset + i; }
  int64_t kv_head(int64_t h) const { return rules_.kv_head[h]; }
  // True when query head h reads kv head h / G (the layout the reference kernel stacks by group).
  bool grouped_heads() const;

  // Structural interval of keys visible at absolute query position p in batch row b.
  int64_t lo(int64_t p) const { return rules_.has_lo ? std::max<int64_t>(0, p + rules_.lo) : 0; }
  int64_t hi(int64_t b, int64_t p) const {
    int64_t h = Nk;
    if (rules_.has_hi) h = std::min<int64_t>(h, p + rules_.hi);
    if (key_len_) h = std::min<int64_t>(h, key_len_[b]);
    return std::max<int64_t>(h, 0);
  }
  // Keys that some row in [i0, i1) may see (outside: nothing is visible).
  void key_range(int64_t b, int64_t i0, int64_t i1, int64_t* j_lo, int64_t* j_hi) const {
    *j_lo = lo(pos(i0));
    *j_hi = hi(b, pos(i1 - 1));
  }
  // Rows that may see some key in [j0, j1).
  void query_range(int64_t b, int64_t j0, int64_t j1, int64_t* i_lo, int64_t* i_hi) const {
    *i_lo = 0;
    *i_hi = Nq;
    if (key_len_ && j0 >= key_len_[b]) {
      *i_hi = 0;
      return;
    }
    // j0 < pos + hi  <=>  pos >= j0 - hi + 1
    if (rules_.has_hi) *i_lo = std::max<int64_t>(0, j0 - rules_.hi + 1 - rules_.q_offset);
    if (rules_.has_lo)  // pos + lo < j1  <=>  pos < j1 - lo
      *i_hi = std::min<int64_t>(Nq, std::max<int64_t>(0, j1 - rules_.lo - rules_.q_offset));
  }
  bool elementwise() const { return elementwise_; }
  // True when every (i, j) in the block passes the mask (no per-element work needed). Never with
  // a pattern: the kernels ask the layout (tile_full) instead.
  bool block_all_visible(int64_t b, int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return !elementwise_ && !pat_ && j0 >= lo(pos(i1 - 1)) && j1 <= hi(b, pos(i0));
  }
  // Sparse pattern: its predicate and block layout on the kTileQ × kTileK grid (null without one).
  bool has_pattern() const { return pat_ != nullptr; }
  // True when the fused CPU kernels may take a regrouped walk instead of the grid (fused.h): a
  // causal strided pattern, or a causal window (the pattern's or the structural one).
  bool has_walk() const { return layout_ && layout_->regrouped; }
  const PatternPredicate* pattern() const { return pat_.get(); }
  const BlockLayout& layout() const { return *layout_; }
  // True when the layout's tile (qt, kt) is full and no per-batch or elementwise mask cuts the
  // keys [.., j1) of it in batch row b.
  bool tile_full(int64_t b, int64_t qt, int64_t kt, int64_t j1) const {
    return layout_->at(qt, kt) == BlockLayout::full && !elementwise_ && (!key_len_ || j1 <= key_len_[b]);
  }

  // The full predicate (documented in attention.h).
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t p = pos(i);
    if (rules_.has_hi && j >= p + rules_.hi) return false;
    if (rules_.has_lo && j < p + rules_.lo) return false;
    if (key_len_ && j >= key_len_[b]) return false;
    if (key_pad_ && !key_pad_[b * kp_sb_ + j * kp_sj_]) return false;
    if (seg_ && seg_[b * Nk + p] != seg_[b * Nk + j]) return false;
    if (allow_ && !allow_[b * al_s_[0] + h * al_s_[1] + i * al_s_[2] + j * al_s_[3]]) return false;
    if (pat_ && !pat_->allows(p, j)) return false;
    return true;
  }
  // Elementwise-only part, for keys already inside the structural interval.
  bool visible_elementwise(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return visible_masks(b, h, i, j) && (!pat_ || pat_->allows(pos(i), j));
  }
  // The elementwise masks alone (key padding, segments, allow_mask), without the pattern.
  bool visible_masks(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (key_pad_ && !key_pad_[b * kp_sb_ + j * kp_sj_]) return false;
    if (seg_ && seg_[b * Nk + pos(i)] != seg_[b * Nk + j]) return false;
    if (allow_ && !allow_[b * al_s_[0] + h * al_s_[1] + i * al_s_[2] + j * al_s_[3]]) return false;
    return true;
  }
  // True when a key inside the structural interval may still be masked (elementwise masks or a pattern).
  bool per_element() const { return elementwise_ || pat_; }

  // Additive terms: bias (as the dtype given to the constructor) and ALiBi.
  bool has_bias() const { return bias_ != nullptr; }
  template <class T>
  const T* bias_row(int64_t b, int64_t h, int64_t i) const {
    return static_cast<const T*>(bias_) + b * bi_s_[0] + h * bi_s_[1] + i * bi_s_[2];
  }
  int64_t bias_col_stride() const { return bi_s_[3]; }
  bool has_alibi() const { return !alibi_.empty(); }
  float alibi_slope(int64_t h) const { return alibi_[h]; }

  // Applies bias, ALiBi and the mask to a tile of logits s[r * lds + c] for rows i0 + r (r < nr)
  // and keys j0 + c (c < nc): masked entries become -inf. `full` skips the mask when the caller
  // already knows the block is all visible.
  template <class T>
  void apply(int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t j0, int64_t nc, T* s, int64_t lds, bool full) const;

  // Counts rows with no visible key (bias not consulted).
  int64_t count_fully_masked() const;
  // First fully masked row in (b, h, i) order, or false.
  bool first_fully_masked(int64_t* b, int64_t* h, int64_t* i) const;

 private:
  MaskRules rules_;
  bool elementwise_ = false;
  const int64_t* key_len_ = nullptr;
  std::vector<int64_t> key_len_store_;
  const bool* key_pad_ = nullptr;
  int64_t kp_sb_ = 0, kp_sj_ = 0;
  const int64_t* seg_ = nullptr;
  const bool* allow_ = nullptr;
  int64_t al_s_[4] = {0, 0, 0, 0};
  const void* bias_ = nullptr;
  int64_t bi_s_[4] = {0, 0, 0, 0};
  std::vector<float> alibi_;
  std::vector<Tensor> keep_;  // owns converted / expanded mask tensors
  std::shared_ptr<const PatternPredicate> pat_;
  std::shared_ptr<const BlockLayout> layout_;
};

template <class T>
void MaskPlan::apply(int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t j0, int64_t nc, T* s, int64_t lds,
                     bool full) const {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nr; ++r) {
    T* row = s + r * lds;
    const int64_t i = i0 + r;
    if (bias_) {
      const T* br = bias_row<T>(b, h, i);
      const int64_t cs = bi_s_[3];
      if (cs == 1) {
        for (int64_t c = 0; c < nc; ++c) row[c] += br[j0 + c];
      } else {
        for (int64_t c = 0; c < nc; ++c) row[c] += br[(j0 + c) * cs];
      }
    }
    if (!alibi_.empty()) {
      const T slope = static_cast<T>(alibi_[h]);
      const int64_t p = pos(i);
      for (int64_t c = 0; c < nc; ++c) row[c] -= slope * static_cast<T>(p - (j0 + c));
    }
    if (full) continue;
    const int64_t p = pos(i);
    const int64_t a = std::clamp<int64_t>(lo(p) - j0, 0, nc);
    const int64_t e = std::clamp<int64_t>(hi(b, p) - j0, a, nc);
    for (int64_t c = 0; c < a; ++c) row[c] = ninf;
    for (int64_t c = e; c < nc; ++c) row[c] = ninf;
    if (pat_) pat_->mask_row(p, j0 + a, j0 + e, row + a);
    if (elementwise_)
      for (int64_t c = a; c < e; ++c)
        if (!visible_masks(b, h, i, j0 + c)) row[c] = ninf;
  }
}

// The dropout draw documented in attention.h.
class DropoutDraw {
 public:
  DropoutDraw(const AttentionOptions& o, int64_t Hq)
      : on_(o.dropout_p > 0),
        Hq_(Hq),
        k0_(static_cast<uint32_t>(o.dropout_seed)),
        k1_(static_cast<uint32_t>(o.dropout_seed >> 32) ^ static_cast<uint32_t>(o.dropout_offset >> 32)),
        c3_(static_cast<uint32_t>(o.dropout_offset)),
        thr_(static_cast<uint32_t>(std::ceil(o.dropout_p * 16777216.0))),
        keep_scale_(o.dropout_p > 0 ? 1.0 / (1.0 - o.dropout_p) : 1.0) {}
  bool on() const { return on_; }
  double keep_scale() const { return keep_scale_; }
  // The Philox key and counter word and the keep threshold (for the CUDA kernels' own draw).
  struct Key {
    uint32_t k0, k1, c3, thr;
  };
  Key key() const { return {k0_, k1_, c3_, thr_}; }
  // z[c] = keep(b, h, i, j0 + c) ? 1/(1-p) : 0 for c < n.
  template <class T>
  void row(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, T* z) const {
    const uint32_t c1 = static_cast<uint32_t>(i), c2 = static_cast<uint32_t>(b * Hq_ + h);
    const T ks = static_cast<T>(keep_scale_);
    int64_t c = 0;
    while (c < n) {
      const int64_t j = j0 + c;
      const Philox4 r = philox4x32_10(static_cast<uint32_t>(j >> 2), c1, c2, c3_, k0_, k1_);
      for (int64_t lane = j & 3; lane < 4 && c < n; ++lane, ++c) z[c] = (r.v[lane] >> 8) >= thr_ ? ks : T(0);
    }
  }

 private:
  bool on_;
  int64_t Hq_;
  uint32_t k0_, k1_, c3_, thr_;
  double keep_scale_;
};

}  // namespace qkv::attn
