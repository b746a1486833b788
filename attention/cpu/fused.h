// Internal to attention/: the fused CPU kernels (fused_forward.cpp, fused_backward.cpp) behind
// attention() and its FusedAttentionBackward node.
#pragma once
#include <limits>

#include "attention/mask.h"
#include "attention/cpu/tile_products.h"
#include "tensor/numerics.h"

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

// The regrouped walk (patterns.h, StridedWalk: a causal strided pattern's band and residue groups,
// or a causal window's band alone) is taken where the layout chose it and this switch is on (the
// default). Tests turn it off to compare against the grid walk.
void set_strided_regroup(bool on);
bool strided_regroup();
// Not under numerics = invariant: the walk's tiles follow the residue groups of the call's rows,
// so one row's keys would be grouped differently alone (decoding) than in a block.
inline bool use_strided_walk(const MaskPlan& plan) {
  return plan.has_walk() && strided_regroup() && numerics() != Numerics::invariant;
}

// Query rows per tile of the regrouped walk. Its tiles sit on triangles (the band's parallelogram,
// each residue group's causal triangle): at 64 rows they waste half their area, at 16 about a
// fifth, at 8 about a tenth. The tile products (tile_products.h) keep their speed down to a few
// rows, so 8 computes the fewest logits for the least time (4 rows: more per-tile work than it saves).
constexpr int64_t kWalkQ = 8;
// The backward's band tiles are twice as tall: its dK and dV products (add_tn) run as deep as a
// tile has rows, and at 8 they loaded and stored each dK, dV element once per 8 multiply-adds. At
// 16 the walk took 0.98× the time (with dQ's product on the row groups' spans, below: 0.977×); at
// 24 and 32 rows it took 0.994× and 0.987× (their tiles' staggered corners hold more masked logits).
// The forward's band stays at kWalkQ (its product, P·V, runs as deep as a tile has keys).
constexpr int64_t kWalkBandQBackward = 16;
constexpr int64_t kWalkMaxQ = std::max(kWalkQ, kWalkBandQBackward);
// Keys per tile of the regrouped walk, so the band (l + kWalkQ − 1 keys) and a residue group's
// keys are one product each up to l, n/s ≈ 250 (N = 64K), not two of which the second is a
// thin tail. The walk's scratch rows are kWalkK apart.
constexpr int64_t kWalkK = 256;
// Rows per forward task of a band-only walk (a multiple of kWalkQ, so a chunk's band blocks are
// the whole head's and the values do not depend on the chunking).
constexpr int64_t kWalkChunkRows = 256;
static_assert(kWalkChunkRows % kWalkQ == 0);

// The row loops of a walk tile (mask, max, exp) run over its nc logits rounded up to a multiple of
// 8, the extra columns masked: exp and max then take whole vectors (8 floats under AVX2), where
// the band's 71 columns and the residue groups' 7, 15, … 63 left 7 for a scalar tail loop —
// which made the walk's exp cost twice full attention's per logit. The scratch rows are kWalkK
// wide, a multiple of 8; the products read the first nc columns only.
inline int64_t walk_row_width(int64_t nc) { return std::min(kWalkK, (nc + 7) / 8 * 8); }

// One tile of the regrouped walk: rows i = i0 + qstep·r (r < nr), keys j = j0 + kstep·c (c < nc);
// `band` says which of the walk's two key sets it belongs to (the band, kstep 1, or a residue
// group, qstep = kstep = s).
struct StridedTile {
  int64_t i0, qstep, nr, j0, kstep, nc;
  bool band;
};

// One residue group of the walk: its rows are i + s·n, its tiles' keys j = r + s·m, m in [m_lo, m_hi).
struct ResidueGroup {
  int64_t r, m_lo, m_hi;
  int64_t keys() const { return m_hi - m_lo; }
};

// Calls visit(tile) for every tile of the regrouped walk of one (b, h) whose batch row has `cap`
// keys, in the one order forward and backward share: each residue group (the one whose first row
// is i, i < s) in kWalkQ-row × kWalkK-key tiles, between group_begin(g) and group_end(g), then the
// band along the diagonal in blocks of band_rows (≤ kWalkMaxQ) rows. After each band block's tiles,
// band_done(i0, i1): rows [i0, i1) have all their terms (the band comes last), so the forward
// finishes them there, while they are in cache, rather than in one more pass over N rows: at ~100
// logits per row, the walk's passes over O(N·D) memory weigh far more than full attention's.
// With a row range [row_begin, row_end) (a band-only walk's chunk of rows; row_begin a multiple of
// band_rows, so the chunk's tiles are the whole walk's) only the band blocks of those rows.
template <class Begin, class Visit, class End, class Done>
void for_each_walk_tile(const StridedWalk& w, int64_t cap, Begin&& group_begin, Visit&& visit, End&& group_end,
                        Done&& band_done, int64_t band_rows, int64_t row_begin = 0,
                        int64_t row_end = std::numeric_limits<int64_t>::max()) {
  const int64_t Nq = w.nq, sw = w.s;
  int64_t ka, ke;
  for (int64_t i = 0; i < w.groups(); ++i) {
    const int64_t r = ((w.pos(i) % sw) + sw) % sw, rows = w.rows(r);
    ResidueGroup g{r, 0, 0};
    for (int64_t n0 = 0; n0 < rows; n0 += kWalkQ) {
      w.residue(r, n0, std::min(rows, n0 + kWalkQ), cap, &ka, &ke);
      if (ka >= ke) continue;
      g.m_lo = g.m_hi > g.m_lo ? std::min(g.m_lo, ka) : ka;
      g.m_hi = std::max(g.m_hi, ke);
    }
    if (g.keys() <= 0) continue;
    group_begin(g);
    for (int64_t n0 = 0; n0 < rows; n0 += kWalkQ) {
      const int64_t n1 = std::min(rows, n0 + kWalkQ);
      w.residue(r, n0, n1, cap, &ka, &ke);
      for (int64_t m0 = ka; m0 < ke; m0 += kWalkK)
        visit(StridedTile{i + sw * n0, sw, n1 - n0, r + sw * m0, sw, std::min(kWalkK, ke - m0), false});
    }
    group_end(g);
  }
  const int64_t band_end = std::min(Nq, row_end);
  for (int64_t i0 = row_begin; i0 < band_end; i0 += band_rows) {
    const int64_t i1 = std::min(band_end, i0 + band_rows);
    w.band(i0, i1, cap, &ka, &ke);
    for (int64_t j0 = ka; j0 < ke; j0 += kWalkK)
      visit(StridedTile{i0, 1, i1 - i0, j0, 1, std::min(kWalkK, ke - j0), true});
    band_done(i0, i1);
  }
}

// The rows of an output a walk accumulates into (O of the strided walk; dQ, dK, dV of both walks),
// zeroed as a tile first reaches them — in cache, just before its product adds into them —
// instead of in a pass over all N rows first: the sparse patterns compute ~100-300 logits per row,
// so such a pass costs them what it does not cost full attention. `reached` holds one flag per
// row (the caller's scratch); finish() zeroes the rows no tile reached.
template <class T>
struct ZeroOnFirstTouch {
  T* rows;
  int64_t ld, cols;
  uint8_t* reached;
  int64_t count;

  ZeroOnFirstTouch(T* rows_, int64_t ld_, int64_t cols_, uint8_t* reached_, int64_t count_)
      : rows(rows_), ld(ld_), cols(cols_), reached(reached_), count(count_) {
    std::fill_n(reached, count, uint8_t(0));
  }
  // Rows first + step·r, r < n.
  void touch(int64_t first, int64_t step, int64_t n) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = first + step * r;
      if (!reached[i]) {
        std::fill_n(rows + i * ld, cols, T(0));
        reached[i] = 1;
      }
    }
  }
  void finish() { touch(0, 1, count); }
  // Rows first + step·r, r < n, copied to dst (rows ldd apart): their values so far, zeros where
  // no tile has reached them; store() writes such a copy back and marks its rows reached.
  void load(int64_t first, int64_t step, int64_t n, T* dst, int64_t ldd) const {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = first + step * r;
      if (reached[i]) std::copy_n(rows + i * ld, cols, dst + r * ldd);
      else std::fill_n(dst + r * ldd, cols, T(0));
    }
  }
  void store(int64_t first, int64_t step, int64_t n, const T* src, int64_t lds) {
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = first + step * r;
      std::copy_n(src + r * lds, cols, rows + i * ld);
      reached[i] = 1;
    }
  }
};

// Why a residue group's key rows are copied: they are s rows apart in K and V (and dK, dV), and
// at D = 64 floats and s = 64 that is 16 KiB, a multiple of the L1's and the L2's set strides, so
// all of a group's ~64 rows fall in the same few cache sets and evict each other between the
// group's tiles (at s = 65 the same walk took 0.945× the time, alternated in one process). So each group's key rows are
// copied once into contiguous scratch, which its tiles read (and, backward, accumulate into),
// when they number at most strided_pack_limit() (the scratch is that many rows per operand and
// thread; larger groups, from a small s at a long N, are read in place). The copies change where
// the products read, not what they compute: the results are the same bits either way. Tests set
// the limit to 0 to compare.
constexpr int64_t kMaxPackedKeys = 1024;  // the default limit
void set_strided_pack_limit(int64_t keys);
int64_t strided_pack_limit();
inline int64_t packed_key_rows(const StridedWalk& w) { return std::min(strided_pack_limit(), w.keys(0)); }

// Rows src + lds·r, r < n, of `cols` elements each, to dst + ldd·r.
template <class T>
void copy_rows(int64_t n, int64_t cols, const T* src, int64_t lds, T* dst, int64_t ldd) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(src + r * lds, cols, dst + r * ldd);
}

// Where a walk tile reads its keys and values (and, backward, adds their gradients): the tile's
// first key row and the step to the next, in place or in a group's packed copy.
template <class T>
struct TileKeys {
  const T *k, *v;
  int64_t ldk, ldv;
};

// The current residue group's K and V rows, copied into `k` and `v` (capacity rows of D and Dv)
// by begin() when the group has at most `capacity` keys (`packed`).
template <class T>
struct PackedGroupKeys {
  T *k, *v;
  int64_t capacity, D, Dv;
  int64_t s = 1;
  ResidueGroup group{};
  bool packed = false;

  // kh, vh: the head's K and V rows (key 0's row; rows k_sn, v_sn apart).
  void begin(const StridedWalk& w, const ResidueGroup& g, const T* kh, int64_t k_sn, const T* vh, int64_t v_sn) {
    s = w.s;
    group = g;
    packed = g.keys() <= capacity;
    if (!packed) return;
    copy_rows(g.keys(), D, kh + first_key() * k_sn, s * k_sn, k, D);
    copy_rows(g.keys(), Dv, vh + first_key() * v_sn, s * v_sn, v, Dv);
  }
  int64_t first_key() const { return group.r + s * group.m_lo; }
  // Row of the copies that holds the first key of `t`, a tile of the current group.
  int64_t row(const StridedTile& t) const { return (t.j0 - group.r) / s - group.m_lo; }
  TileKeys<T> keys(const StridedTile& t) const { return TileKeys<T>{k + row(t) * D, v + row(t) * Dv, D, Dv}; }
};
template <class T>
struct TileKeyGrads {
  T *dk, *dv;
  int64_t lddk, lddv;
};

// Each row's kept columns of a walk tile, [ca[r], ce[r]) (the band's (p − l, hi) or the group's
// [lo, min(hi, p − l + 1))), computed once per tile for the mask and the products; and the rows in
// groups of kWalkSpanRows, each with the columns [a, e) some row of the group keeps. The tile's dot
// products (S = Q·Kᵀ, dP = dO·Vᵀ) are computed on those columns only: a tile's rows are staggered
// (each band row sees the keys of the row above shifted by one, each residue-group row one more
// key), so each group of 4 skips the columns only the other group keeps, ~8 % of the products'
// logits, all of them masked.
constexpr int64_t kWalkSpanRows = 4;
struct WalkRows {
  int64_t ca[kWalkMaxQ], ce[kWalkMaxQ];
  int64_t a[kWalkMaxQ / kWalkSpanRows], e[kWalkMaxQ / kWalkSpanRows];

  WalkRows(const MaskPlan& plan, const StridedWalk& w, int64_t b, const StridedTile& t) {
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t p = plan.pos(t.i0 + t.qstep * r);
      const int64_t lo = t.band ? w.band_lo(p) : plan.lo(p);
      const int64_t hi = t.band ? plan.hi(b, p) : std::min(plan.hi(b, p), p - w.l + 1);
      ca[r] = std::clamp<int64_t>(StridedWalk::ceil_div(lo - t.j0, t.kstep), 0, t.nc);
      ce[r] = std::clamp<int64_t>(StridedWalk::ceil_div(hi - t.j0, t.kstep), ca[r], t.nc);
    }
    for (int64_t g = 0; g * kWalkSpanRows < t.nr; ++g) {
      a[g] = t.nc;
      e[g] = 0;
      for (int64_t r = g * kWalkSpanRows; r < std::min(t.nr, (g + 1) * kWalkSpanRows); ++r)
        if (ce[r] > ca[r]) {
          a[g] = std::min(a[g], ca[r]);
          e[g] = std::max(e[g], ce[r]);
        }
      if (e[g] <= a[g]) a[g] = e[g] = 0;
    }
  }
  // f(r0, rows, c0, cols) for each group of the tile's nr rows that keeps a key: its rows
  // [r0, r0 + rows) and its columns [c0, c0 + cols).
  template <class F>
  void for_each_span(int64_t nr, F&& f) const {
    for (int64_t g = 0; g * kWalkSpanRows < nr; ++g)
      if (e[g] > a[g]) f(g * kWalkSpanRows, std::min(kWalkSpanRows, nr - g * kWalkSpanRows), a[g], e[g] - a[g]);
  }
  // C = alpha·A·Bᵀ on each group's columns (A: the tile's nr rows, lda apart; B: its nc rows, ldb
  // apart; C: rows ldc apart); the other columns of C are left as they were.
  template <class T>
  void nt(int64_t nr, int64_t k, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) const {
    for_each_span(nr, [&](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
      tile::dots(rows, cols, k, alpha, A + r0 * lda, lda, B + c0 * ldb, ldb, C + r0 * ldc + c0, ldc);
    });
  }
  // C += A·B on each group's columns (A: the tile's nr rows, lda apart; B: its nc rows, ldb apart;
  // C: nr rows of n, ldc apart): what A·B adds where A is 0 outside each group's columns, without
  // the multiply-adds by those zeros (dQ += dS·K on a band tile: a tenth of its terms).
  template <class T>
  void add_nn(int64_t nr, int64_t n, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) const {
    for_each_span(nr, [&](int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
      tile::add_nn(rows, n, cols, A + r0 * lda + c0, lda, B + c0 * ldb, ldb, C + r0 * ldc, ldc);
    });
  }
  // The tile's rows that keep a key of columns kRangeRows·b … kRangeRows·b + 3, as [lo[b], hi[b])
  // (empty: hi[b] ≤ lo[b]), b < ⌈nc / kRangeRows⌉: the steps tile::add_tn_ranges takes for those
  // keys in dK += dSᵀ·Q and dV += Pᵀ·dO, where every other row's dS and P are zero.
  void key_ranges(int64_t nr, int64_t nc, int64_t* lo, int64_t* hi) const {
    const int64_t blocks = (nc + tile::kRangeRows - 1) / tile::kRangeRows;
    std::fill_n(lo, blocks, int64_t(0));
    std::fill_n(hi, blocks, int64_t(0));
    for (int64_t r = 0; r < nr; ++r) {
      if (ce[r] <= ca[r]) continue;
      for (int64_t b = ca[r] / tile::kRangeRows; b <= (ce[r] - 1) / tile::kRangeRows; ++b) {
        if (hi[b] == 0) lo[b] = r;  // rows ascend: the first to reach b
        hi[b] = r + 1;
      }
    }
  }
  // The columns of row r that nt formed.
  int64_t span_begin(int64_t r) const { return a[r / kWalkSpanRows]; }
  int64_t span_end(int64_t r) const { return e[r / kWalkSpanRows]; }
};

// Bias, ALiBi and the mask on the tile's logits s[r·lds + c]: each row keeps the keys of its
// interval (the band's (p − l, hi) or the group's [lo, min(hi, p − l + 1))), then the
// elementwise masks; everything else, and the padding columns up to walk_row_width(nc), becomes −inf.
// The intervals are the strided pattern itself (patterns.h, StridedWalk), so the elementwise masks
// are asked without it (visible_masks).
template <class T>
void strided_tile_mask(const MaskPlan& plan, const WalkRows& rows, int64_t b, int64_t h, const StridedTile& t, T* s,
                       int64_t lds) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const bool bias = plan.has_bias(), alibi = plan.has_alibi(), elementwise = plan.elementwise();
  const int64_t bcs = plan.bias_col_stride(), ncp = walk_row_width(t.nc);
  for (int64_t r = 0; r < t.nr; ++r) {
    T* row = s + r * lds;
    const int64_t i = t.i0 + t.qstep * r, p = plan.pos(i);
    if (bias) {
      const T* br = plan.bias_row<T>(b, h, i) + t.j0 * bcs;
      const int64_t st = t.kstep * bcs;
      for (int64_t c = 0; c < t.nc; ++c) row[c] += br[c * st];
    }
    if (alibi) {
      const T slope = static_cast<T>(plan.alibi_slope(h));
      for (int64_t c = 0; c < t.nc; ++c) row[c] -= slope * static_cast<T>(p - (t.j0 + t.kstep * c));
    }
    const int64_t ca = rows.ca[r], ce = rows.ce[r];
    for (int64_t c = 0; c < ca; ++c) row[c] = ninf;
    for (int64_t c = ce; c < ncp; ++c) row[c] = ninf;
    if (elementwise)
      for (int64_t c = ca; c < ce; ++c)
        if (!plan.visible_masks(b, h, i, t.j0 + t.kstep * c)) row[c] = ninf;
  }
}

// The dropout multipliers of row (b, h, i) at keys j = j0 + kstep·c, c < n (the draw of
// DropoutDraw::row, one Philox block per key when the keys are not adjacent).
template <class T>
void strided_dropout_row(const DropoutDraw& drop, int64_t Hq, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t kstep, int64_t n, T* z) {
  if (kstep == 1) return drop.row(b, h, i, j0, n, z);
  const DropoutDraw::Key key = drop.key();
  const T ks = static_cast<T>(drop.keep_scale());
  const uint32_t c1 = static_cast<uint32_t>(i), c2 = static_cast<uint32_t>(b * Hq + h);
  for (int64_t c = 0; c < n; ++c) {
    const int64_t j = j0 + kstep * c;
    const Philox4 x = philox4x32_10(static_cast<uint32_t>(j >> 2), c1, c2, key.c3, key.k0, key.k1);
    z[c] = (x.v[j & 3] >> 8) >= key.thr ? ks : T(0);
  }
}

// `t` itself when its rows are contiguous and BLAS can step between them, else a contiguous copy.
inline Tensor rows_contiguous(const Tensor& t) {
  const bool ok = t.stride(3) == 1 && (t.size(2) <= 1 || t.stride(2) >= t.size(3));
  return ok ? t : t.contiguous();
}

}  // namespace qkv::attn
