// Sparse attention patterns: a visibility predicate over (query position p, key j) plus the block
// layout the fused kernels walk. The definitions are stated once, in attention/attention.h (the
// list next to visible(b, h, i, j)); this header holds the types and the layout.
//
// A pattern is ANDed with every other mask (causal, window, key padding, lengths, segments,
// allow_mask) and works on absolute positions p = q_offset + i, so a KV-cache decode step
// (Nq = 1 < Nk) sees row p of the same pattern as the full forward. The only parameter that
// depends on the call is a stride / local width left at 0 ("auto"), resolved as ⌈√Nk⌉: a model
// resolves it once from its block_size (nn::ModelConfig::sparse_pattern) so that every decode
// step keeps it.
//
// Block layout: for kernel tiles of tq query rows × tk keys (aligned at multiples of tq, tk from
// row 0 and key 0), each tile pair is empty (no visible pair: never visited), full (every pair
// visible under the pattern and the structural mask: no per-element mask) or partial. It is
// computed in O(kept pairs + Nq) by enumerating each row's visible keys, and cached (LRU) per
// (pattern, Nq, Nk, structural rules, tile sizes).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::attn {

struct MaskRules;

enum class Pattern { full, window, strided, global, bigbird, block_sparse };
const char* pattern_name(Pattern p);
// The pattern spelt `name` ("full", "window", "strided", "global", "bigbird", "block_sparse"), or
// false.
bool parse_pattern(std::string_view name, Pattern* out);

struct SparsePattern {
  Pattern kind = Pattern::full;
  int64_t stride = 0;                  // strided: s; 0 = ⌈√Nk⌉
  int64_t local = 0;                   // l; 0 = the pattern's default (attention.h)
  int64_t global = 1;                  // global, bigbird: the first g positions are global (unless a list is given)
  std::vector<int64_t> global_tokens;  // global, bigbird: explicit global positions (replaces `global`)
  int64_t random_blocks = 2;           // bigbird: r random key blocks per query block
  int64_t block_size = 64;             // bigbird, block_sparse: bs positions per pattern block
  uint64_t seed = 0;                   // bigbird's random blocks
  // block_sparse: "local_global" (default) or "fixed" names a generator; "rows:" followed by the
  // rows separated by '/' ("rows:10/11") is the table itself (what a checkpoint stores); anything
  // else is a file. load_layout reads the last two into layout_rows × layout_cols below.
  std::string layout = "local_global";
  int64_t layout_rows = 0, layout_cols = 0;
  std::vector<uint8_t> layout_table;  // [layout_rows, layout_cols], 1 = visible block pair

  // A table is the same pattern wherever it was read from (a file, its inline rows).
  bool operator==(const SparsePattern& o) const {
    const bool tables = !layout_table.empty() && !o.layout_table.empty();
    return kind == o.kind && stride == o.stride && local == o.local && global == o.global &&
           global_tokens == o.global_tokens && random_blocks == o.random_blocks && block_size == o.block_size &&
           seed == o.seed && (tables || layout == o.layout) && layout_rows == o.layout_rows &&
           layout_cols == o.layout_cols && layout_table == o.layout_table;
  }
  bool operator!=(const SparsePattern& o) const { return !(*this == o); }
  bool sparse() const { return kind != Pattern::full; }
  // Whether a key's visibility depends on the distance i − j alone (full, window, strided with a
  // resolved stride): a document then sees the same keys wherever it starts in a row. global,
  // bigbird and block_sparse place their global tokens and blocks at positions of the row.
  bool relative() const {
    return kind == Pattern::full || kind == Pattern::window || (kind == Pattern::strided && stride > 0);
  }
  // Checks the parameters' signs and the layout's presence; throws qkv::Error.
  void validate() const;
  // validate(), then checks that each parameter the pattern uses means something in a context of
  // n positions (a model's block_size, a bench's N): stride, local width and global count at most
  // n (past it the pattern is full attention under another name); for bigbird and block_sparse a
  // block size that divides n and at most n / block_size random blocks; a layout in which every
  // query block sees some key block at or before its own (else its rows see nothing). Messages
  // name the parameter as `key_prefix` + its name ("model.pattern_" + "stride"; a "--pattern-"
  // prefix spells it "--pattern-block-size") and the context as `context`.
  void validate_for(int64_t n, std::string_view key_prefix = "model.pattern_",
                    std::string_view context = "model.block_size") const;
  // A one-line description, e.g. "strided s=8 l=8" (bench rows, leakcheck reports).
  std::string describe() const;
};

// block_sparse: reads a layout file, or the inline "rows:..." form, into p.layout_table when
// p.layout is not a generator name. The file holds one row per query block, a '0' / '1' per key
// block (spaces ignored, '#' starts a comment); rows must have equal length. Throws naming the
// file and line at fault.
void load_layout(SparsePattern& p);
// The loaded table as its inline form, "rows:" + the rows joined by '/' (p.layout when it names a
// generator): a checkpoint stores this, so the model it holds does not depend on a file.
std::string inline_layout(const SparsePattern& p);

// The predicate of one call: the pattern with its "auto" parameters resolved for Nk keys.
// `causal` says the structural mask keeps j <= p (bigbird then draws random blocks from the past).
class PatternPredicate {
 public:
  PatternPredicate(const SparsePattern& p, int64_t nk, bool causal);
  bool allows(int64_t p, int64_t j) const;
  // Calls f(x0, x1) for intervals [x0, x1) inside [a, e) whose union is exactly the keys of
  // position p in [a, e) that allows(p, ·) keeps (intervals may overlap; a strided residue or a
  // listed global token is an interval of one key). keys() and mask_row() are built on it.
  template <class F>
  void for_each_allowed(int64_t p, int64_t a, int64_t e, F&& f) const;
  // Appends the keys of position p in [a, e) that the pattern allows (duplicates possible).
  void keys(int64_t p, int64_t a, int64_t e, std::vector<int64_t>& out) const;
  // row[c] = −inf for each key a + c (c < e − a) that the pattern does not allow at position p; the
  // rest of the row is left as it was. The kernels' masks on partial tiles: per key, allows()
  // costs a call and, for bigbird, r Philox draws; this costs r draws per row.
  template <class T>
  void mask_row(int64_t p, int64_t a, int64_t e, T* row) const;
  int64_t stride() const { return s_; }
  int64_t local() const { return l_; }
  // bigbird: the k-th random key block of query block qb (k < r).
  int64_t random_block(int64_t qb, int64_t k) const;

 private:
  bool is_global(int64_t x) const;
  bool block_allowed(int64_t qb, int64_t kb) const;
  static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
  Pattern kind_;
  int64_t s_ = 1, l_ = 1, g_ = 0, r_ = 0, bs_ = 64, nk_ = 0, nkb_ = 1;
  bool causal_ = false;
  uint64_t seed_ = 0;
  std::vector<int64_t> globals_;  // sorted
  std::string layout_;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> table_;
};

template <class F>
void PatternPredicate::for_each_allowed(int64_t p, int64_t a, int64_t e, F&& f) const {
  if (a >= e) return;
  auto clipped = [&](int64_t x0, int64_t x1) {
    x0 = std::max(a, x0);
    x1 = std::min(e, x1);
    if (x0 < x1) f(x0, x1);
  };
  switch (kind_) {
    case Pattern::full:
      f(a, e);
      return;
    case Pattern::window:
      clipped(p - l_ + 1, p + l_);
      return;
    case Pattern::strided: {
      clipped(p - l_ + 1, p + l_);
      const int64_t first = a + (((p - a) % s_) + s_) % s_;  // smallest j >= a with (p - j) % s == 0
      for (int64_t j = first; j < e; j += s_) f(j, j + 1);
      return;
    }
    case Pattern::global:
    case Pattern::bigbird: {
      if (is_global(p)) {
        f(a, e);
        return;
      }
      clipped(p - l_ + 1, p + l_);
      if (globals_.empty()) {
        clipped(0, g_);
      } else {
        for (auto it = std::lower_bound(globals_.begin(), globals_.end(), a); it != globals_.end() && *it < e; ++it)
          f(*it, *it + 1);
      }
      if (kind_ == Pattern::bigbird) {
        const int64_t qb = floor_div(p, bs_);
        for (int64_t k = 0; k < r_; ++k) {
          const int64_t kb = random_block(qb, k);
          clipped(kb * bs_, (kb + 1) * bs_);
        }
      }
      return;
    }
    case Pattern::block_sparse: {
      const int64_t qb = floor_div(p, bs_);
      for (int64_t kb = floor_div(a, bs_); kb * bs_ < e; ++kb)
        if (block_allowed(qb, kb)) clipped(kb * bs_, (kb + 1) * bs_);
      return;
    }
  }
}

template <class T>
void PatternPredicate::mask_row(int64_t p, int64_t a, int64_t e, T* row) const {
  if (kind_ == Pattern::full) return;
  constexpr int64_t kChunk = 256;  // keys marked per pass, in a byte array on the stack
  uint8_t keep[kChunk];
  for (int64_t c0 = a; c0 < e; c0 += kChunk) {
    const int64_t c1 = std::min(e, c0 + kChunk);
    std::fill_n(keep, c1 - c0, uint8_t(0));
    for_each_allowed(p, c0, c1,
                     [&](int64_t x0, int64_t x1) { std::fill(keep + (x0 - c0), keep + (x1 - c0), uint8_t(1)); });
    T* r = row + (c0 - a);
    for (int64_t c = 0; c < c1 - c0; ++c) r[c] = keep[c] ? r[c] : -std::numeric_limits<T>::infinity();
  }
}

// The regrouped walk of a causal strided pattern (fused CPU kernels). Under a causal rule the
// pattern is the union of two disjoint key sets per position p:
//   band    p − l < j            (∩ the structural interval [lo(p), hi(p)), hi(p) <= p + 1)
//   stride  j <= p − l, j ≡ p (mod s)
// The band is walked in natural order (query blocks × the keys just before them, like a window);
// the stride part per residue r ∈ [0, s): rows i with (q_offset + i) mod s == r, the n-th of them
// at i = first_row(r) + s·n, and keys j = r + s·m. Inside one residue group "j <= p − l" is a
// causal triangle in (n, m), so the group is a dense attention problem over rows and keys that
// lie s apart in memory: the tile products step s rows at a time (a group's K and V rows through
// a packed copy, fused.h). Every set of keys below is an interval [a, e) (in j for the band, in m
// for a group), so the kernels mask a tile by clamping each row to its interval.
// The band walk is the band alone (residues = false), taken by a causal window of either kind:
// the window pattern (Pattern::window, width l) or the sliding window (AttentionOptions::window).
// Its 8-row tiles clamped per row compute ~l + 7 logits a row, where the grid's 32 × 32 tiles
// compute ~l + 32 and mask them.
struct StridedWalk {
  int64_t s = 1, l = 1, q_offset = 0, nq = 0, nk = 0;
  // false: the band walk, no residue groups (the window pattern, l its width; or the sliding
  // window under no pattern, l unbounded and lo its bound).
  bool residues = true;
  bool has_lo = false;
  int64_t lo = 0, hi = 1;  // the structural interval [p + lo, p + hi) (hi <= 1)

  int64_t pos(int64_t i) const { return q_offset + i; }
  int64_t lo_at(int64_t p) const { return has_lo ? std::max<int64_t>(0, p + lo) : 0; }
  // `cap`: the batch row's key count (key_lengths) or nk.
  int64_t hi_at(int64_t p, int64_t cap) const { return std::max<int64_t>(0, std::min(cap, p + hi)); }
  // Band keys of position p: [band_lo(p), hi_at(p, cap)).
  int64_t band_lo(int64_t p) const { return std::max(lo_at(p), p - l + 1); }
  // Band keys some row of [i0, i1) may see.
  void band(int64_t i0, int64_t i1, int64_t cap, int64_t* a, int64_t* e) const {
    *a = std::max<int64_t>(0, band_lo(pos(i0)));
    *e = std::max(*a, hi_at(pos(i1 - 1), cap));
  }
  // Stride keys of position p: j in [lo_at(p), min(hi_at(p, cap), p − l + 1)).
  int64_t stride_hi(int64_t p, int64_t cap) const { return std::min(hi_at(p, cap), p - l + 1); }
  int64_t first_row(int64_t r) const { return (((r - q_offset) % s) + s) % s; }
  // Residue groups walked: s, or none for the band alone.
  int64_t groups() const { return residues ? std::min(s, nq) : 0; }
  int64_t rows(int64_t r) const { return first_row(r) < nq ? (nq - 1 - first_row(r)) / s + 1 : 0; }
  int64_t keys(int64_t r) const { return residues && r < nk ? (nk - 1 - r) / s + 1 : 0; }
  // Keys m of group r that its rows n ∈ [n0, n1) may see: [*a, *e).
  void residue(int64_t r, int64_t n0, int64_t n1, int64_t cap, int64_t* a, int64_t* e) const {
    const int64_t p0 = pos(first_row(r) + s * n0), p1 = pos(first_row(r) + s * (n1 - 1));
    *a = std::max<int64_t>(0, ceil_div(lo_at(p0) - r, s));
    *e = std::max(*a, std::min(keys(r), ceil_div(stride_hi(p1, cap) - r, s)));
  }
  // Tiles of tq rows × tk keys of the walk (every batch row at its longest).
  int64_t tiles(int64_t tq, int64_t tk) const;
  static int64_t ceil_div(int64_t x, int64_t d) { return x >= 0 ? (x + d - 1) / d : -((-x) / d); }
};

struct BlockLayout {
  int64_t nq = 0, nk = 0, tq = 0, tk = 0, nqt = 0, nkt = 0;
  // Strided under a causal rule, when the regrouped walk computes fewer logits than the grid
  // below: the kernels take `walk` instead (tiles of kWalkQ rows, fused.h), visited_tiles is the
  // logits it computes in tq × tk tiles' worth, and full_tiles 0 (each row is clamped to its
  // interval). The grid (state, CSR) stays for the general path and the kept-pair counts.
  bool regrouped = false;
  StridedWalk walk;
  enum State : uint8_t { empty = 0, partial = 1, full = 2 };
  std::vector<uint8_t> state;               // [nqt, nkt]
  std::vector<int64_t> row_ptr, row_tiles;  // non-empty key tiles of each query tile (CSR)
  std::vector<int64_t> col_ptr, col_tiles;  // non-empty query tiles of each key tile (CSC)
  // The rows [r0, r1) and keys [c0, c1) of a non-empty tile, relative to its corner, that hold its
  // visible pairs (their bounding box, keys rounded out to multiples of 8 so the kernels' row
  // loops take whole vectors): the CPU kernels compute only that part. 16 global tokens fill 16
  // of a 32-key tile's columns and of a 32-row tile's rows, so the grid alone computed two logits
  // for each of their pairs. Aligned with row_tiles and with col_tiles.
  struct Box {
    uint8_t r0, r1, c0, c1;
  };
  std::vector<Box> row_boxes, col_boxes;
  int64_t kept_pairs = 0;  // visible (i, j) pairs of one (b, h) slice
  int64_t visited_tiles = 0, full_tiles = 0;
  State at(int64_t qt, int64_t kt) const { return static_cast<State>(state[qt * nkt + kt]); }
};

// The layout of `pattern` under the structural rules (q_offset, key interval; key_lengths and the
// elementwise masks are not part of it) for Nq × Nk and tiles tq × tk. Cached.
std::shared_ptr<const BlockLayout> block_layout(const SparsePattern& pattern, const MaskRules& rules, int64_t nq,
                                                int64_t nk, int64_t tq, int64_t tk);

}  // namespace qkv::attn
