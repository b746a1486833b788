// Fused attention backward, CPU: the hand-derived vjp stated in attention.h, recomputing P per
// tile from the saved row log-sum-exp instead of storing it.
//
//   Di  = rowsum(dO ∘ O)                                   [B,Hq,Nq], by each head's task
//   per (b, h), per key tile j, per query block i that can see it:
//     S   = s·Q_i·K_jᵀ + bias + alibi, masked −inf         P  = exp(S − lse_i)  (0 on masked rows)
//     dV_j += (P∘Z)ᵀ·dO_i                                  dP = (dO_i·V_jᵀ) ∘ Z
//     dS  = s·P ∘ (dP − Di)                                 (the logits' gradient times the scale s)
//     dK_j += dSᵀ·Q_i                                      dQ_i += dS·K_j
// (s folded into dS, one multiply per logit, instead of a pass over dQ and dK at the end: the
// sparse walks compute ~100 logits per row, so a pass over N rows costs them what it does not
// cost full attention.)
// Shapes: dO, O [B,Hq,Nq,Dv]; dq [B,Hq,Nq,D]; dk [B,Hkv,Nk,D]; dv [B,Hkv,Nk,Dv]; 5 GEMMs per tile.
// Every operand may be a view with contiguous rows (any batch/head/row strides): attention_packed
// reads a token-major dO and writes dq/dk/dv straight into the slices of one packed gradient.
//
// Why this loop order: a task owns one query head (b, h) and walks key tiles outermost, so the
// dK/dV rows it accumulates and the dQ rows it updates belong to it alone — no atomics, no
// order-dependent races, bitwise reproducible for a given thread count. Under GQA the G query heads
// of a group each write their own dK/dV partial ([B,Hq,Nk,D], the size of q: still O(N·D)), summed
// afterwards in head order. Fully masked rows have lse = −inf and contribute exactly zero.
#include <omp.h>

#include <vector>

#include "attention/cpu/fused.h"
#include "attention/cpu/tile_math.h"
#include "attention/cpu/tile_products.h"

namespace qkv::attn {

namespace {

template <class T>
struct BwdArgs {
  const T *q, *k, *v, *dout, *lse;
  T* di;  // [B,Hq,Nq], each head's rows written by that head's task
  int64_t q_sb, q_sh, q_sn, k_sb, k_sh, k_sn, v_sb, v_sh, v_sn, do_sb, do_sh, do_sn;
  T *dq, *dk, *dv;  // dk/dv: [B,Hkv,...] when G == 1, else the per-query-head partials [B,Hq,...]
  int64_t dq_sb, dq_sh, dq_sn, dk_sb, dk_sh, dk_sn, dv_sb, dv_sh, dv_sn;  // rows contiguous
  const T* out;
  int64_t o_sb, o_sh, o_sn;
  bool partial;
  int64_t Hq, Hkv, Nq, Nk, D, Dv;
  T scale;
};

// One tile of the regrouped strided walk (fused.h): the five products of the loop in
// backward_head on rows and keys t.qstep / t.kstep apart, so dQ, dK and dV land in their own
// rows (the leading dimensions step over the other residues). dqh: the head's dQ rows; kv, kg:
// where the tile's K, V rows and dK, dV rows are (in place, or a residue group's copies).
template <class T>
void strided_tile_backward(const BwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, const StridedWalk& w,
                           int64_t b, int64_t h, const StridedTile& t, T* dqh, const TileKeys<T>& kv,
                           const TileKeyGrads<T>& kg, T* s, T* dp, T* pz, T* z) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t row0 = (b * a.Hq + h) * a.Nq;
  const T* qt = a.q + b * a.q_sb + h * a.q_sh + t.i0 * a.q_sn;
  const T* dot = a.dout + b * a.do_sb + h * a.do_sh + t.i0 * a.do_sn;
  T* dqt = dqh + t.i0 * a.dq_sn;
  const int64_t ldq = t.qstep * a.q_sn, ldo = t.qstep * a.do_sn, lddq = t.qstep * a.dq_sn;
  const int64_t nr = t.nr, nc = t.nc;
  const WalkRows rows(plan, w, b, t);
  rows.nt(nr, a.D, a.scale, qt, ldq, kv.k, kv.ldk, s, kWalkK);
  strided_tile_mask<T>(plan, rows, b, h, t, s, kWalkK);
  const int64_t ncp = walk_row_width(nc);
  for (int64_t r = 0; r < nr; ++r) {
    const T lse = a.lse[row0 + t.i0 + t.qstep * r];
    T* sr = s + r * kWalkK;
    if (lse == ninf) std::fill_n(sr, nc, T(0));
    else tile::exp_shift(sr, ncp, lse);
  }
  const T* pd = s;
  if (drop.on()) {
    for (int64_t r = 0; r < nr; ++r) {
      T* zr = z + r * kWalkK;
      strided_dropout_row(drop, a.Hq, b, h, t.i0 + t.qstep * r, t.j0, t.kstep, nc, zr);
      for (int64_t c = 0; c < nc; ++c) pz[r * kWalkK + c] = s[r * kWalkK + c] * zr[c];
    }
    pd = pz;
  }
  int64_t key_lo[kWalkK / tile::kRangeRows] = {}, key_hi[kWalkK / tile::kRangeRows] = {};  // {}: for g++'s flow check
  rows.key_ranges(nr, nc, key_lo, key_hi);
  tile::add_tn_ranges(nc, a.Dv, key_lo, key_hi, pd, kWalkK, dot, ldo, kg.dv, kg.lddv);
  rows.nt(nr, a.Dv, T(1), dot, ldo, kv.v, kv.ldv, dp, kWalkK);
  for (int64_t r = 0; r < nr; ++r) {  // dS; 0 outside the row group's span, where P is 0 and dP was not formed
    const T di = a.di[row0 + t.i0 + t.qstep * r];
    const T* sr = s + r * kWalkK;
    T* dr = dp + r * kWalkK;
    const int64_t ca = rows.span_begin(r), ce = rows.span_end(r);
    std::fill(dr, dr + ca, T(0));
    if (drop.on()) {
      const T* zr = z + r * kWalkK;
      for (int64_t c = ca; c < ce; ++c) dr[c] = a.scale * sr[c] * (dr[c] * zr[c] - di);
    } else {
      for (int64_t c = ca; c < ce; ++c) dr[c] = a.scale * sr[c] * (dr[c] - di);
    }
    std::fill(dr + ce, dr + nc, T(0));
  }
  tile::add_tn_ranges(nc, a.D, key_lo, key_hi, dp, kWalkK, qt, ldq, kg.dk, kg.lddk);
  rows.add_nn(nr, a.D, dp, kWalkK, kv.k, kv.ldk, dqt, lddq);
}

// The regrouped walk of one (b, h), in the forward's order (residue groups, then the band),
// zeroing dQ, dK and dV rows as a tile first reaches them. A residue group's K, V rows are read
// from packed copies and its dK, dV rows accumulated in packed copies written back at the group's
// end (fused.h, strided_pack_limit); `pack`: packed_key_rows(walk) rows each of K, V, dK, dV.
template <class T>
void strided_head_backward(const BwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, int64_t b, int64_t h,
                           T* dqh, T* dkh, T* dvh, T* s, T* dp, T* pz, T* z, T* pack, ZeroOnFirstTouch<T>& dq_rows,
                           ZeroOnFirstTouch<T>& dk_rows, ZeroOnFirstTouch<T>& dv_rows) {
  const StridedWalk& w = plan.layout().walk;
  const int64_t cap = plan.hi(b, std::numeric_limits<int64_t>::max() / 2);
  const int64_t hk = plan.kv_head(h), D = a.D, Dv = a.Dv, pack_rows = packed_key_rows(w);
  const T* kh = a.k + b * a.k_sb + hk * a.k_sh;
  const T* vh = a.v + b * a.v_sb + hk * a.v_sh;
  PackedGroupKeys<T> group{pack, pack + pack_rows * D, pack_rows, D, Dv};
  T* dkpack = group.v + pack_rows * Dv;
  T* dvpack = dkpack + pack_rows * D;
  for_each_walk_tile(
      w, cap,
      [&](const ResidueGroup& g) {
        group.begin(w, g, kh, a.k_sn, vh, a.v_sn);
        if (!group.packed) return;
        dk_rows.load(group.first_key(), w.s, g.keys(), dkpack, D);
        dv_rows.load(group.first_key(), w.s, g.keys(), dvpack, Dv);
      },
      [&](const StridedTile& t) {
        dq_rows.touch(t.i0, t.qstep, t.nr);
        TileKeys<T> kv{kh + t.j0 * a.k_sn, vh + t.j0 * a.v_sn, t.kstep * a.k_sn, t.kstep * a.v_sn};
        TileKeyGrads<T> kg{dkh + t.j0 * a.dk_sn, dvh + t.j0 * a.dv_sn, t.kstep * a.dk_sn, t.kstep * a.dv_sn};
        if (!t.band && group.packed) {
          const int64_t c = group.row(t);
          kv = group.keys(t);
          kg = TileKeyGrads<T>{dkpack + c * D, dvpack + c * Dv, D, Dv};
        } else {
          dk_rows.touch(t.j0, t.kstep, t.nc);
          dv_rows.touch(t.j0, t.kstep, t.nc);
        }
        strided_tile_backward<T>(a, plan, drop, w, b, h, t, dqh, kv, kg, s, dp, pz, z);
      },
      [&](const ResidueGroup& g) {
        if (!group.packed) return;
        dk_rows.store(group.first_key(), w.s, g.keys(), dkpack, D);
        dv_rows.store(group.first_key(), w.s, g.keys(), dvpack, Dv);
      },
      [](int64_t, int64_t) {}, kWalkBandQBackward);
}

// s, dp, pz, z: tile scratch (the larger of Bq×Bk and kWalkMaxQ×kWalkK); kvt: (D + Dv)·Bk, the grid
// walk's key tile transposed (Kᵀ, then Vᵀ: S and dP run as nn on them); pack: the strided walk's
// packed key rows (strided_head_backward); reached: Nq + 2·Nk flags (dQ, dK, dV rows are zeroed as
// a tile first reaches them, fused.h ZeroOnFirstTouch); walk: use_strided_walk(plan), read by the
// caller (it depends on the calling thread's numerics mode, which an OpenMP worker does not see).
template <class T>
void backward_head(const BwdArgs<T>& a, const MaskPlan& plan, const DropoutDraw& drop, int64_t b, int64_t h, T* s,
                   T* dp, T* pz, T* z, T* kvt, T* pack, uint8_t* reached, bool walk) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t hk = plan.kv_head(h), D = a.D, Dv = a.Dv;
  const T* qh = a.q + b * a.q_sb + h * a.q_sh;
  const T* kh = a.k + b * a.k_sb + hk * a.k_sh;
  const T* vh = a.v + b * a.v_sb + hk * a.v_sh;
  const int64_t row0 = (b * a.Hq + h) * a.Nq;
  const int64_t dos = a.do_sn, dqs = a.dq_sn, dks = a.dk_sn, dvs = a.dv_sn;
  const T* doh = a.dout + b * a.do_sb + h * a.do_sh;
  const T* lseh = a.lse + row0;
  T* dih = a.di + row0;
  {  // Di = rowsum(dO ∘ O) for this head's rows
    const T* oh = a.out + b * a.o_sb + h * a.o_sh;
    for (int64_t i = 0; i < a.Nq; ++i) dih[i] = tile::row_dot(doh + i * dos, oh + i * a.o_sn, Dv);
  }
  T* dqh = a.dq + b * a.dq_sb + h * a.dq_sh;
  const int64_t kv_slot = a.partial ? h : hk;
  T* dkh = a.dk + b * a.dk_sb + kv_slot * a.dk_sh;
  T* dvh = a.dv + b * a.dv_sb + kv_slot * a.dv_sh;
  ZeroOnFirstTouch<T> dq_rows(dqh, dqs, D, reached, a.Nq), dk_rows(dkh, dks, D, reached + a.Nq, a.Nk),
      dv_rows(dvh, dvs, Dv, reached + a.Nq + a.Nk, a.Nk);
  if (walk) strided_head_backward<T>(a, plan, drop, b, h, dqh, dkh, dvh, s, dp, pz, z, pack, dq_rows, dk_rows, dv_rows);
  const bool additive = plan.has_bias() || plan.has_alibi();
  for (int64_t j0 = 0; j0 < (walk ? 0 : a.Nk); j0 += kBlockK) {  // the grid walk
    const int64_t bk = std::min(kBlockK, a.Nk - j0);
    int64_t i_lo, i_hi;
    plan.query_range(b, j0, j0 + bk, &i_lo, &i_hi);
    const T* kj = kh + j0 * a.k_sn;
    const T* vj = vh + j0 * a.v_sn;
    T* dkj = dkh + j0 * dks;
    T* dvj = dvh + j0 * dvs;
    // Query blocks: the structural range in steps of Bq, or with a sparse pattern the non-empty
    // tiles of the block layout's column kt = j0 / Bk (j0 is a multiple of Bk), clipped to it.
    const BlockLayout* layout = plan.has_pattern() ? &plan.layout() : nullptr;
    const int64_t kt = j0 / kBlockK;
    const int64_t n_blocks =
        layout ? layout->col_ptr[kt + 1] - layout->col_ptr[kt] : (i_hi - i_lo + kBlockQ - 1) / kBlockQ;
    T* kjt = kvt;  // Kⱼᵀ and Vⱼᵀ, rows kBlockK apart
    T* vjt = kvt + D * kBlockK;
    if (n_blocks > 0) {
      tile::transpose(bk, D, kj, a.k_sn, kjt, kBlockK);
      tile::transpose(bk, Dv, vj, a.v_sn, vjt, kBlockK);
    }
    for (int64_t t = 0; t < n_blocks; ++t) {
      int64_t i0, i1, c0 = 0, c1 = bk;  // rows [i0, i1), keys j0 + [c0, c1)
      if (layout) {                     // clipped to the tile's box too
        const int64_t e = layout->col_ptr[kt] + t, qt = layout->col_tiles[e];
        const BlockLayout::Box& box = layout->col_boxes[e];
        i0 = std::max(qt * kBlockQ + box.r0, i_lo);
        i1 = std::min(qt * kBlockQ + box.r1, i_hi);
        c0 = box.c0;
        c1 = std::min<int64_t>(box.c1, bk);
        if (i1 <= i0 || c1 <= c0) continue;
      } else {
        i0 = i_lo + t * kBlockQ;
        i1 = std::min(i_hi, i0 + kBlockQ);
      }
      const int64_t bq = i1 - i0, tj0 = j0 + c0, tbk = c1 - c0;
      int64_t j_lo, j_hi;  // the block's own key range may exclude this tile entirely
      plan.key_range(b, i0, i1, &j_lo, &j_hi);
      if (j_hi <= tj0 || j_lo >= tj0 + tbk) continue;
      const T* tk = kj + c0 * a.k_sn;
      T* tdk = dkj + c0 * dks;
      T* tdv = dvj + c0 * dvs;
      tile::nn(bq, tbk, D, a.scale, qh + i0 * a.q_sn, a.q_sn, kjt + c0, kBlockK, s, kBlockK);
      const bool full = layout ? plan.tile_full(b, i0 / kBlockQ, kt, tj0 + tbk) && tj0 >= j_lo && tj0 + tbk <= j_hi
                               : plan.block_all_visible(b, i0, i1, tj0, tj0 + tbk);
      if (additive || !full) plan.apply<T>(b, h, i0, bq, tj0, tbk, s, kBlockK, full);
      for (int64_t r = 0; r < bq; ++r) {
        const T lse = lseh[i0 + r];
        T* sr = s + r * kBlockK;
        if (lse == ninf) std::fill_n(sr, tbk, T(0));
        else tile::exp_shift(sr, tbk, lse);
      }
      const T* pd = s;  // P∘Z, the weights the forward multiplied V by
      if (drop.on()) {
        for (int64_t r = 0; r < bq; ++r) {
          T* zr = z + r * kBlockK;
          drop.row(b, h, i0 + r, tj0, tbk, zr);
          for (int64_t c = 0; c < tbk; ++c) pz[r * kBlockK + c] = s[r * kBlockK + c] * zr[c];
        }
        pd = pz;
      }
      dq_rows.touch(i0, 1, bq);
      dk_rows.touch(tj0, 1, tbk);
      dv_rows.touch(tj0, 1, tbk);
      tile::add_tn(tbk, Dv, bq, pd, kBlockK, doh + i0 * dos, dos, tdv, dvs);
      tile::nn(bq, tbk, Dv, T(1), doh + i0 * dos, dos, vjt + c0, kBlockK, dp, kBlockK);
      for (int64_t r = 0; r < bq; ++r) {
        const T di = dih[i0 + r];
        const T* sr = s + r * kBlockK;
        T* dr = dp + r * kBlockK;
        if (drop.on()) {
          const T* zr = z + r * kBlockK;
          for (int64_t c = 0; c < tbk; ++c) dr[c] = a.scale * sr[c] * (dr[c] * zr[c] - di);
        } else {
          for (int64_t c = 0; c < tbk; ++c) dr[c] = a.scale * sr[c] * (dr[c] - di);
        }
      }
      tile::add_tn(tbk, D, bq, dp, kBlockK, qh + i0 * a.q_sn, a.q_sn, tdk, dks);
      tile::add_nn(bq, D, tbk, dp, kBlockK, tk, a.k_sn, dqh + i0 * dqs, dqs);
    }
  }
  dq_rows.finish();
  dk_rows.finish();
  dv_rows.finish();
}

template <class T>
void run_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                  const Tensor& lse, const Problem& p, const MaskPlan& plan, const DropoutDraw& drop, FusedGrads& g) {
  Tensor di = Tensor::empty({p.B, p.Hq, p.Nq}, p.dtype);  // filled per head by the head's own task
  const bool partial = p.G > 1;
  Tensor dk_part, dv_part;
  if (partial) {
    dk_part = Tensor::empty({p.B, p.Hq, p.Nk, p.D}, p.dtype);
    dv_part = Tensor::empty({p.B, p.Hq, p.Nk, p.Dv}, p.dtype);
  }
  const Tensor& dk_dst = partial ? dk_part : g.dk;
  const Tensor& dv_dst = partial ? dv_part : g.dv;
  const BwdArgs<T> a{q.data<T>(),
                     k.data<T>(),
                     v.data<T>(),
                     dout.data<T>(),
                     lse.data<T>(),
                     di.data<T>(),
                     q.stride(0),
                     q.stride(1),
                     q.stride(2),
                     k.stride(0),
                     k.stride(1),
                     k.stride(2),
                     v.stride(0),
                     v.stride(1),
                     v.stride(2),
                     dout.stride(0),
                     dout.stride(1),
                     dout.stride(2),
                     g.dq.data<T>(),
                     dk_dst.data<T>(),
                     dv_dst.data<T>(),
                     g.dq.stride(0),
                     g.dq.stride(1),
                     g.dq.stride(2),
                     dk_dst.stride(0),
                     dk_dst.stride(1),
                     dk_dst.stride(2),
                     dv_dst.stride(0),
                     dv_dst.stride(1),
                     dv_dst.stride(2),
                     out.data<T>(),
                     out.stride(0),
                     out.stride(1),
                     out.stride(2),
                     partial,
                     p.Hq,
                     p.Hkv,
                     p.Nq,
                     p.Nk,
                     p.D,
                     p.Dv,
                     static_cast<T>(p.scale)};
  const int64_t tasks = p.B * p.Hq;
  const double flops = 2.0 * p.B * p.Hq * p.Nq * p.Nk * (3 * p.D + 2 * p.Dv) / 2;
  const int nthreads = omp_in_parallel() ? 1 : worth_threads(flops, tasks, omp_get_max_threads());
  const int64_t tile = std::max(kBlockQ * kBlockK, kWalkMaxQ * kWalkK);
  const bool walk = use_strided_walk(plan);
  const int64_t pack_rows = walk ? packed_key_rows(plan.layout().walk) : 0;
  const int64_t per_thread = 4 * tile + kBlockK * (p.D + p.Dv) + 2 * pack_rows * (p.D + p.Dv);
  Tensor scratch = Tensor::empty({nthreads, per_thread}, p.dtype);
  const int64_t flags = p.Nq + 2 * p.Nk;
  std::vector<uint8_t> reached(static_cast<size_t>(nthreads * flags));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t t = 0; t < tasks; ++t) {
    T* s = scratch.data<T>() + omp_get_thread_num() * per_thread;
    T* kvt = s + 4 * tile;
    backward_head<T>(a, plan, drop, t / p.Hq, t % p.Hq, s, s + tile, s + 2 * tile, s + 3 * tile, kvt,
                     kvt + kBlockK * (p.D + p.Dv), reached.data() + omp_get_thread_num() * flags, walk);
  }
  if (!partial) return;
  // dK, dV of kv head hk = Σ over the query heads that read it, in head order.
  const T* dkp = dk_part.data<T>();
  const T* dvp = dv_part.data<T>();
  const int64_t nk_d = p.Nk * p.D, nk_dv = p.Nk * p.Dv;
  const int64_t groups = p.B * p.Hkv;
#pragma omp parallel for schedule(static) if (groups > 1 && !omp_in_parallel())
  for (int64_t bk = 0; bk < groups; ++bk) {
    const int64_t b = bk / p.Hkv, hk = bk % p.Hkv;
    T* dkd = g.dk.data<T>() + b * g.dk.stride(0) + hk * g.dk.stride(1);
    T* dvd = g.dv.data<T>() + b * g.dv.stride(0) + hk * g.dv.stride(1);
    const int64_t dks = g.dk.stride(2), dvs = g.dv.stride(2);
    for (int64_t j = 0; j < p.Nk; ++j) std::fill_n(dkd + j * dks, p.D, T(0));
    for (int64_t j = 0; j < p.Nk; ++j) std::fill_n(dvd + j * dvs, p.Dv, T(0));
    for (int64_t h = 0; h < p.Hq; ++h) {
      if (plan.kv_head(h) != hk) continue;
      const T* sk = dkp + (b * p.Hq + h) * nk_d;
      const T* sv = dvp + (b * p.Hq + h) * nk_dv;
      for (int64_t j = 0; j < p.Nk; ++j)
        for (int64_t e = 0; e < p.D; ++e) dkd[j * dks + e] += sk[j * p.D + e];
      for (int64_t j = 0; j < p.Nk; ++j)
        for (int64_t e = 0; e < p.Dv; ++e) dvd[j * dvs + e] += sv[j * p.Dv + e];
    }
  }
}

}  // namespace

FusedGrads fused_attention_backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const Tensor& out, const Tensor& lse, const Problem& p, const MaskPlan& plan,
                                    const DropoutDraw& drop, const FusedGrads* into) {
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const Tensor dout = rows_contiguous(dout_in.dtype() == p.dtype ? dout_in : dout_in.to(p.dtype));
  QKV_CHECK(dout.shape() == out.shape(), "[attention] backward got dout ", shape_str(dout.shape()), " for out ",
            shape_str(out.shape()));
  FusedGrads g;
  if (into) {
    g = *into;
  } else {
    g.dq = Tensor::empty({p.B, p.Hq, p.Nq, p.D}, p.dtype);
    g.dk = Tensor::empty({p.B, p.Hkv, p.Nk, p.D}, p.dtype);
    g.dv = Tensor::empty({p.B, p.Hkv, p.Nk, p.Dv}, p.dtype);
  }
  if (p.dtype == DType::f32) run_backward<float>(dout, q, k, v, out, lse, p, plan, drop, g);
  else run_backward<double>(dout, q, k, v, out, lse, p, plan, drop, g);
  return g;
}

}  // namespace qkv::attn
