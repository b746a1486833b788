// Fused attention forward (FlashAttention-style online softmax), CPU.
//
// For each (b, h, block of Bq query rows), over steps of kForwardKeys keys (a sparse layout's
// tiles of Bk keys):
//   S      = s·Q_blk·K_stepᵀ + bias + alibi, masked entries -inf          (tile products)
//   m'     = max(m, rowmax S)       α = exp(m − m')      P = exp(S − m')
//   l      = α·l + rowsum P         O = α·O + (P∘Z)·V_step
// then O /= l and lse = m + log l. A row that saw no visible key keeps m = −inf: its output is
// zero and lse = −inf (or an error under FullyMasked::error).
// Shapes: q [B,Hq,Nq,D], k [B,Hkv,Nk,D], v [B,Hkv,Nk,Dv] (rows contiguous, any batch/head/row
// strides), out [B,Hq,Nq,Dv], lse [B,Hq,Nq]. Query head h reads kv head plan.kv_head(h) in place.
//
// Why this shape: only O and lse are written, so memory is O(N·D) (Kᵀ, out, lse) plus a
// Bq × kForwardKeys tile per thread;
// key tiles outside a block's structural key range (causal upper triangle, outside the window,
// past key_lengths) are never visited, so causal attention does about half the work; tiles wholly
// inside the range skip the mask. Parallel over (b, h, query block), largest blocks first.
#include <omp.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "attention/cpu/fused.h"
#include "attention/cpu/tile_math.h"
#include "attention/cpu/tile_products.h"

namespace qkv::attn {

namespace {

template <class T>
struct FwdArgs {
  const T *q, *k, *v;
  int64_t q_sb, q_sh, q_sn, k_sb, k_sh, k_sn, v_sb, v_sh, v_sn;
  T *out, *lse;
  int64_t o_sb, o_sh, o_sn;  // out's strides (rows contiguous): head-major, or token-major for attention_packed
  int64_t Hq, Nq, D, Dv;
  T scale;
  // Kᵀ by key tile (transpose_key_tiles), or nullptr: the tiles' products then transpose K themselves.
  const T* kt = nullptr;
  int64_t Hkv = 0, key_tiles = 0;
};

// K [B, Hkv, Nk, D] as Kᵀ one key tile at a time: tile t of head (b, hk) is D rows of kBlockK keys
// (kt + ((b·Hkv + hk)·tiles + t)·D·kBlockK, rows kBlockK apart). Made once per call where several
// query blocks read each tile, so S = s·Q·Kᵀ runs as nn on it; nt on K gives the same bits (tile_products.h).
template <class T>
Tensor transpose_key_tiles(const FwdArgs<T>& a, int64_t B, int64_t Hkv, int64_t Nk, int64_t tiles) {
  Tensor kt = Tensor::empty({B * Hkv * tiles, a.D, kBlockK}, dtype_of<T>());
  T* dst = kt.data<T>();
#pragma omp parallel for schedule(static) if (B * Hkv * tiles > 1 && !omp_in_parallel())
  for (int64_t e = 0; e < B * Hkv * tiles; ++e) {
    const int64_t bh = e / tiles, t = e % tiles, b = bh / Hkv, hk = bh % Hkv;
    const int64_t j0 = t * kBlockK;
    tile::transpose(std::min(kBlockK, Nk - j0), a.D, a.k + b * a.k_sb + hk * a.k_sh + j0 * a.k_sn, a.k_sn,
                    dst + e * a.D * kBlockK, kBlockK);
  }
  return kt;
}

// Keys per step of the forward's online softmax without a sparse layout: four key tiles, so each
// row's max, rescale and sum and each P·V product (its depth) cover 128 keys instead of 32. A
// layout's tiles stay one key tile wide (its grid). The steps are fixed by the keys' positions,
// not by the block, so a decode step cuts a row's keys where the parallel forward does.
constexpr int64_t kForwardKeys = 4 * kBlockK;

// S = s·Q·Kᵀ for `nr` rows and the keys [j0, j0 + bk) of one step, into s (row stride lds): on
// the transposed key tiles where the call made them (one nn per tile the step spans), else nt on K.
template <class T>
void forward_logits(const FwdArgs<T>& a, int64_t b, int64_t hk, int64_t nr, const T* q, int64_t j0, int64_t bk, T* s,
                    int64_t lds) {
  if (!a.kt) {
    tile::nt(nr, bk, a.D, a.scale, q, a.q_sn, a.k + b * a.k_sb + hk * a.k_sh + j0 * a.k_sn, a.k_sn, s, lds);
    return;
  }
  for (int64_t j = j0; j < j0 + bk;) {
    const int64_t t = j / kBlockK, end = std::min(j0 + bk, (t + 1) * kBlockK);
    const T* ktile = a.kt + ((b * a.Hkv + hk) * a.key_tiles + t) * a.D * kBlockK + j % kBlockK;
    tile::nn(nr, end - j, a.D, a.scale, q, a.q_sn, ktile, kBlockK, s + (j - j0), lds);
    j = end;
  }
}

// One query block; `s` and `z` are this thread's scratch (Bq × kForwardKeys and kForwardKeys).
// Returns the first fully masked row in the block or -1.
template <class T>
int64_t forward_block(const FwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, int64_t b, int64_t h,
                      int64_t i0, int64_t i1, T* s, T* z, T* m, T* l) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t hk = plan.kv_head(h), bq = i1 - i0, Dv = a.Dv;
  const T* qb = a.q + b * a.q_sb + h * a.q_sh + i0 * a.q_sn;
  const T* vh = a.v + b * a.v_sb + hk * a.v_sh;
  T* ob = a.out + b * a.o_sb + h * a.o_sh + i0 * a.o_sn;
  const int64_t os = a.o_sn;
  T* lb = a.lse + (b * a.Hq + h) * a.Nq + i0;
  for (int64_t r = 0; r < bq; ++r) std::fill_n(ob + r * os, Dv, T(0));
  std::fill_n(m, bq, ninf);
  std::fill_n(l, bq, T(0));
  const bool additive = plan.has_bias() || plan.has_alibi();

  int64_t j_lo, j_hi;
  plan.key_range(b, i0, i1, &j_lo, &j_hi);
  // Key steps [j0, j0 + bk): the structural range in steps of kForwardKeys, or with a sparse
  // pattern the non-empty tiles of the block layout (aligned at multiples of Bk, i0 at a multiple
  // of Bq), clipped to the structural range.
  const BlockLayout* layout = plan.has_pattern() ? &plan.layout() : nullptr;
  const int64_t qt = i0 / kBlockQ;
  // Without a layout the steps start at multiples of kForwardKeys (the first one clipped to
  // j_lo): a row's keys are then cut into the same steps, and its softmax rescaled at the same
  // keys, whichever block or call it is computed in (a window's j_lo moves with the block's first row).
  constexpr int64_t lds = kForwardKeys;  // s's row stride
  const int64_t j_base = j_lo - j_lo % kForwardKeys;
  const int64_t n_tiles =
      layout ? layout->row_ptr[qt + 1] - layout->row_ptr[qt] : (j_hi - j_base + kForwardKeys - 1) / kForwardKeys;
  for (int64_t t = 0; t < n_tiles; ++t) {
    int64_t j0, bk, r0 = 0, nr = bq;  // the tile's keys [j0, j0 + bk) and block rows [r0, r0 + nr)
    bool full;
    if (layout) {  // clipped to the tile's box too
      const int64_t e = layout->row_ptr[qt] + t, kt = layout->row_tiles[e];
      const BlockLayout::Box& box = layout->row_boxes[e];
      j0 = std::max(kt * kBlockK + box.c0, j_lo);
      bk = std::min(kt * kBlockK + box.c1, j_hi) - j0;
      if (bk <= 0) continue;
      r0 = box.r0;
      nr = std::min<int64_t>(box.r1, bq) - r0;
      if (nr <= 0) continue;
      full = plan.tile_full(b, qt, kt, j0 + bk);
    } else {
      j0 = std::max(j_base + t * kForwardKeys, j_lo);
      bk = std::min(j_base + (t + 1) * kForwardKeys, j_hi) - j0;
      full = plan.block_all_visible(b, i0, i1, j0, j0 + bk);
    }
    T* ot = ob + r0 * os;
    T *mt = m + r0, *lt = l + r0;
    forward_logits(a, b, hk, nr, qb + r0 * a.q_sn, j0, bk, s, lds);
    if (additive || !full) plan.apply<T>(b, h, i0 + r0, nr, j0, bk, s, lds, full);
    for (int64_t r = 0; r < nr; ++r) {
      T* sr = s + r * lds;
      const T mx = tile::row_max(sr, bk);
      const T m_new = mx > mt[r] ? mx : mt[r];
      if (m_new == ninf) {  // nothing visible in this row so far
        std::fill_n(sr, bk, T(0));
        continue;
      }
      const T sum = tile::exp_shift_sum(sr, bk, m_new, j0);
      if (mt[r] != m_new) {
        const T alpha = mt[r] == ninf ? T(0) : tile::exp_fast(mt[r] - m_new);
        lt[r] *= alpha;
        if (mt[r] != ninf) tile::scale_row(ot + r * os, Dv, alpha);
        mt[r] = m_new;
      }
      lt[r] += sum;
      if (drop.on()) {
        drop.row(b, h, i0 + r0 + r, j0, bk, z);
        for (int64_t c = 0; c < bk; ++c) sr[c] *= z[c];
      }
    }
    tile::add_nn(nr, Dv, bk, s, lds, vh + j0 * a.v_sn, a.v_sn, ot, os);
  }
  int64_t first_masked = -1;
  for (int64_t r = 0; r < bq; ++r) {
    if (m[r] == ninf) {
      std::fill_n(ob + r * os, Dv, T(0));
      lb[r] = ninf;
      if (first_masked < 0) first_masked = i0 + r;
    } else {
      tile::scale_row(ob + r * os, Dv, T(1) / l[r]);
      lb[r] = m[r] + std::log(l[r]);
    }
  }
  return first_masked;
}

// One tile of the regrouped strided walk (fused.h): the same online-softmax step as forward_block,
// on rows and keys t.qstep / t.kstep apart. kv: the tile's keys, in place or in a residue group's
// copies. m, l are the head's running max and sum, indexed by i.
template <class T>
void strided_tile_forward(const FwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, const StridedWalk& w,
                          int64_t b, int64_t h, const StridedTile& t, const TileKeys<T>& kv, T* s, T* z, T* m, T* l) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const T* qt = a.q + b * a.q_sb + h * a.q_sh + t.i0 * a.q_sn;
  T* ot = a.out + b * a.o_sb + h * a.o_sh + t.i0 * a.o_sn;
  const int64_t ldq = t.qstep * a.q_sn, ldo = t.qstep * a.o_sn;
  const WalkRows rows(plan, w, b, t);
  rows.nt(t.nr, a.D, a.scale, qt, ldq, kv.k, kv.ldk, s, kWalkK);
  strided_tile_mask<T>(plan, rows, b, h, t, s, kWalkK);
  const int64_t ncp = walk_row_width(t.nc);
  for (int64_t r = 0; r < t.nr; ++r) {
    T* sr = s + r * kWalkK;
    const int64_t i = t.i0 + t.qstep * r;
    const T mx = tile::row_max(sr, ncp);
    const T m_new = mx > m[i] ? mx : m[i];
    if (m_new == ninf) {
      std::fill_n(sr, t.nc, T(0));
      continue;
    }
    const T sum = tile::exp_shift_sum(sr, ncp, m_new);
    if (m[i] != m_new) {
      const T alpha = m[i] == ninf ? T(0) : tile::exp_fast(m[i] - m_new);
      l[i] *= alpha;
      if (m[i] != ninf) tile::scale_row(ot + r * ldo, a.Dv, alpha);
      m[i] = m_new;
    }
    l[i] += sum;
    if (drop.on()) {
      strided_dropout_row(drop, a.Hq, b, h, i, t.j0, t.kstep, t.nc, z);
      for (int64_t c = 0; c < t.nc; ++c) sr[c] *= z[c];
    }
  }
  tile::add_nn(t.nr, a.Dv, t.nc, s, kWalkK, kv.v, kv.ldv, ot, ldo);
}

// One (b, h) over the regrouped walk, or the rows [i_begin, i_end) of a band-only walk (a causal
// window; a strided walk takes the whole head): the residue groups first, then the band, with ONE
// running max / sum / output per row across both (the order of tiles does not change the
// softmax); each band block's rows are normalised as the block finishes. m, l: Nq scratch each,
// indexed by row; pack: a residue group's copies of its K and V rows (fused.h),
// packed_key_rows(walk) rows each; reached: Nq flags. Returns the first fully masked row or -1.
template <class T>
int64_t strided_head_forward(const FwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, int64_t b, int64_t h,
                             int64_t i_begin, int64_t i_end, T* s, T* z, T* m, T* l, T* pack, uint8_t* reached) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const StridedWalk& w = plan.layout().walk;
  const int64_t Nq = a.Nq, D = a.D, Dv = a.Dv, hk = plan.kv_head(h), pack_rows = packed_key_rows(w);
  const T* kh = a.k + b * a.k_sb + hk * a.k_sh;
  const T* vh = a.v + b * a.v_sb + hk * a.v_sh;
  T* oh = a.out + b * a.o_sb + h * a.o_sh;
  T* lh = a.lse + (b * a.Hq + h) * Nq;
  std::fill(m + i_begin, m + i_end, ninf);
  std::fill(l + i_begin, l + i_end, T(0));
  // O's rows are zeroed as the walk reaches them; the band blocks then write every row.
  ZeroOnFirstTouch<T> o_rows(oh + i_begin * a.o_sn, a.o_sn, Dv, reached, i_end - i_begin);
  const int64_t cap = plan.hi(b, std::numeric_limits<int64_t>::max() / 2);  // this row's key count
  int64_t first_masked = -1;
  PackedGroupKeys<T> group{pack, pack + pack_rows * D, pack_rows, D, Dv};
  for_each_walk_tile(
      w, cap, [&](const ResidueGroup& g) { group.begin(w, g, kh, a.k_sn, vh, a.v_sn); },
      [&](const StridedTile& t) {
        o_rows.touch(t.i0 - i_begin, t.qstep, t.nr);
        const TileKeys<T> kv = !t.band && group.packed ? group.keys(t)
                                                       : TileKeys<T>{kh + t.j0 * a.k_sn, vh + t.j0 * a.v_sn,
                                                                     t.kstep * a.k_sn, t.kstep * a.v_sn};
        strided_tile_forward<T>(a, plan, drop, w, b, h, t, kv, s, z, m, l);
      },
      [](const ResidueGroup&) {},
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          T* orow = oh + i * a.o_sn;
          if (m[i] == ninf) {
            std::fill_n(orow, Dv, T(0));
            lh[i] = ninf;
            if (first_masked < 0) first_masked = i;
          } else {
            tile::scale_row(orow, Dv, T(1) / l[i]);
            lh[i] = m[i] + std::log(l[i]);
          }
        }
      },
      kWalkQ, i_begin, i_end);
  return first_masked;
}

template <class T>
int64_t run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Problem& p, const MaskPlan& plan, const DropoutDraw& drop) {
  FwdArgs<T> a{q.data<T>(),   k.data<T>(),
               v.data<T>(),   q.stride(0),
               q.stride(1),   q.stride(2),
               k.stride(0),   k.stride(1),
               k.stride(2),   v.stride(0),
               v.stride(1),   v.stride(2),
               out.data<T>(), lse.data<T>(),
               out.stride(0), out.stride(1),
               out.stride(2), p.Hq,
               p.Nq,          p.D,
               p.Dv,          static_cast<T>(p.scale)};
  if (use_strided_walk(plan)) {
    // A strided walk is one task per (b, h): its rows' softmax state spans the residue groups and
    // the band. The band alone (a causal window) goes in chunks of kWalkChunkRows rows, so that a
    // call with fewer heads than threads still keeps them all busy (as the grid walk's query
    // blocks do).
    const int64_t chunk = plan.layout().walk.residues ? p.Nq : kWalkChunkRows;
    const int64_t chunks = (p.Nq + chunk - 1) / chunk;
    const int64_t tasks = p.B * p.Hq * chunks;
    const double flops = 2.0 * p.B * p.Hq * plan.layout().visited_tiles * kBlockQ * kBlockK * (p.D + p.Dv);
    const int nthreads = omp_in_parallel() ? 1 : worth_threads(flops, tasks, omp_get_max_threads());
    const int64_t pack_rows = packed_key_rows(plan.layout().walk);
    const int64_t per_thread = kWalkQ * kWalkK + kWalkK + 2 * p.Nq + pack_rows * (p.D + p.Dv);
    Tensor scratch = Tensor::empty({nthreads, per_thread}, p.dtype);
    std::vector<uint8_t> reached(static_cast<size_t>(nthreads * p.Nq));
    std::atomic<int64_t> first_masked{INT64_MAX};
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t t = 0; t < tasks; ++t) {
      T* s = scratch.data<T>() + omp_get_thread_num() * per_thread;
      T* z = s + kWalkQ * kWalkK;
      T* m = z + kWalkK;
      T* l = m + p.Nq;
      const int64_t bh = t / chunks, i_begin = t % chunks * chunk, i_end = std::min(p.Nq, i_begin + chunk);
      const int64_t fm = strided_head_forward<T>(a, plan, drop, bh / p.Hq, bh % p.Hq, i_begin, i_end, s, z, m, l,
                                                 l + p.Nq, reached.data() + omp_get_thread_num() * p.Nq);
      if (fm >= 0) {
        const int64_t idx = bh * p.Nq + fm;
        int64_t cur = first_masked.load();
        while (idx < cur && !first_masked.compare_exchange_weak(cur, idx)) {}
      }
    }
    return first_masked.load();
  }
  const int64_t nblk = (p.Nq + kBlockQ - 1) / kBlockQ;
  Tensor kt;  // each key tile is read by up to nblk·Hq/Hkv query blocks: transposed once for them all
  if (nblk > 1) {
    a.Hkv = p.Hkv;
    a.key_tiles = (p.Nk + kBlockK - 1) / kBlockK;
    kt = transpose_key_tiles(a, p.B, p.Hkv, p.Nk, a.key_tiles);
    a.kt = kt.data<T>();
  }
  const int64_t tasks = p.B * p.Hq * nblk;
  const double flops = 4.0 * p.B * p.Hq * p.Nq * p.Nk * (p.D + p.Dv) / 2;
  const int nthreads = omp_in_parallel() ? 1 : worth_threads(flops, tasks, omp_get_max_threads());
  const int64_t per_thread = kBlockQ * kForwardKeys + kForwardKeys + 2 * kBlockQ;
  Tensor scratch = Tensor::empty({nthreads, per_thread}, p.dtype);
  std::atomic<int64_t> first_masked{INT64_MAX};  // smallest (b·Hq + h)·Nq + i
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t t = 0; t < tasks; ++t) {
    // Last query blocks first: under a causal mask they see the most keys.
    const int64_t blk = nblk - 1 - t % nblk, bh = t / nblk;
    const int64_t b = bh / p.Hq, h = bh % p.Hq;
    T* s = scratch.data<T>() + omp_get_thread_num() * per_thread;
    const int64_t i0 = blk * kBlockQ, i1 = std::min(p.Nq, i0 + kBlockQ);
    T* z = s + kBlockQ * kForwardKeys;
    const int64_t fm =
        forward_block<T>(a, plan, drop, b, h, i0, i1, s, z, z + kForwardKeys, z + kForwardKeys + kBlockQ);
    if (fm >= 0) {
      const int64_t idx = bh * p.Nq + fm;
      int64_t cur = first_masked.load();
      while (idx < cur && !first_masked.compare_exchange_weak(cur, idx)) {}
    }
  }
  return first_masked.load();
}

std::atomic<bool> g_strided_regroup{true};
std::atomic<int64_t> g_strided_pack_limit{kMaxPackedKeys};

}  // namespace

void set_strided_regroup(bool on) { g_strided_regroup = on; }
bool strided_regroup() { return g_strided_regroup; }
void set_strided_pack_limit(int64_t keys) { g_strided_pack_limit = std::max<int64_t>(0, keys); }
int64_t strided_pack_limit() { return g_strided_pack_limit; }

FusedForward fused_attention_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Problem& p,
                                     const MaskPlan& plan, const DropoutDraw& drop, FullyMasked policy,
                                     bool token_major) {
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  FusedForward r;
  r.out = token_major ? Tensor::empty({p.B, p.Nq, p.Hq, p.Dv}, p.dtype).transpose(1, 2)
                      : Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.dtype);
  r.lse = Tensor::empty({p.B, p.Hq, p.Nq}, p.dtype);
  if (p.B * p.Hq * p.Nq == 0) return r;
  const int64_t first = p.dtype == DType::f32 ? run_forward<float>(q, k, v, r.out, r.lse, p, plan, drop)
                                              : run_forward<double>(q, k, v, r.out, r.lse, p, plan, drop);
  if (first != INT64_MAX) {
    if (policy == FullyMasked::error) fail_fully_masked(p, first);
    // Counted from lse so that rows emptied by a -inf bias count too.
    const std::vector<double> lse = r.lse.to_vector();
    for (double x : lse) r.fully_masked_rows += std::isinf(x) ? 1 : 0;
  }
  return r;
}

}  // namespace qkv::attn
