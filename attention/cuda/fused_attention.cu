// CUDA fused attention, forward and backward (design and limits in fused_cuda.h). Per query row
// i (absolute position p = q_offset + i) the visible keys are the interval
//   lo = max(0, p − w + 1) (window w > 0, else 0)  ≤ j <  hi = min(Nk, p + 1 (causal), key_len[b])
// minus keys failing key_padding or segment equality. One warp handles one row; lane l holds the
// head-dim elements l, l + 32, ... of its vectors (up to kMaxPerLane each).
//   forward (online softmax):  s = scale·q·k_j − slope·(p − j);  m' = max(m, s);
//                              l = l·e^(m−m') + e^(s−m');  o = o·e^(m−m') + e^(s−m')·z_j·v_j
//                              out = o / l, lse = m + log l (a row with no visible key: 0, −inf)
//   backward:                  P_ij = e^(s_ij − lse_i), dP_ij = z_ij·dO_i·v_j, Di = dO_i·O_i,
//                              dS = P∘(dP − Di), dQ_i = scale·Σ_j dS_ij k_j,
//                              dK_j = scale·Σ_(h,i) dS_ij q_i, dV_j = Σ_(h,i) P_ij z_ij dO_i
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <mutex>
#include <vector>

#include "attention/cuda/fused_cuda.h"
#include "attention/cuda/fused_rows.cuh"
#include "attention/pattern/pattern.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/ops.h"

namespace qkv::attn::cuda_fused {
namespace {

using namespace rows;

// ---- The tiled kernels: a block of kTileWarps warps takes kTileWarps consecutive rows of one
// (b, head); the K/V rows (forward, dQ) or Q/dO rows (dK/dV) they share are staged through shared
// memory one tile at a time, so each is read from global memory once per block instead of once per
// row. Per row the arithmetic and its order are exactly those of the untiled kernels in
// dev/simple_attention.cu (fused_rows.cuh), which the tests run beside these as a cross-check.

constexpr int kTileWarps = 8;

// Copies rows [r0, r0 + nr) of a [rows, width] operand with row stride `rs` into dst [nr, width].
template <class T>
__device__ void stage_rows(T* dst, const T* src, int64_t rs, int64_t r0, int64_t nr, int64_t width) {
  for (int64_t e = threadIdx.x; e < nr * width; e += blockDim.x) dst[e] = src[(r0 + e / width) * rs + e % width];
}

// A block's walk over the inner tiles (of `tile` rows) that its outer tile o meets: with a sparse
// pattern the layout's non-empty tiles (aligned at multiples of `tile`), else every tile from
// `begin` up to `end`. Step `step` returns the tile's first row and whether it is full (no
// structural or pattern mask per element).
__device__ __forceinline__ int64_t walk_steps(const DeviceMask& m, const DeviceLayout& w, int64_t o, int64_t begin,
                                              int64_t end, int tile) {
  if (m.pat.kind != 0) return w.ptr[o + 1] - w.ptr[o];
  return end > begin ? (end - begin + tile - 1) / tile : 0;
}
__device__ __forceinline__ int64_t walk_tile(const DeviceMask& m, const DeviceLayout& w, int64_t o, int64_t step,
                                             int64_t begin, int tile, bool* full) {
  if (m.pat.kind == 0) {
    *full = false;
    return begin + step * tile;
  }
  const int64_t t = w.tiles[w.ptr[o] + step];
  *full = (t & 1) != 0;
  return (t >> 1) * tile;
}

template <class T>
__global__ void forward_tiled_kernel(Args<T> a, DeviceMask m, int tile) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // [tile, D]
  T* vs = ks + tile * a.D;             // [tile, Dv]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t per_head = (m.Nq + kTileWarps - 1) / kTileWarps;
  const int64_t bh = blockIdx.x / per_head, i0 = (blockIdx.x % per_head) * kTileWarps;
  const int64_t b = bh / m.Hq, h = bh % m.Hq, hk = h / m.G;
  const int64_t i = i0 + warp, i_last = imin(i0 + kTileWarps, m.Nq) - 1;
  const bool active = i < m.Nq;
  const int64_t p = m.q_offset + (active ? i : i_last);
  const int64_t lo = key_lo(m, p), hi = key_hi(m, b, p);
  // The keys any row of the block sees: lo and hi only grow with the position.
  const int64_t j_begin = key_lo(m, m.q_offset + i0), j_end = key_hi(m, b, m.q_offset + i_last);
  T q[kMaxPerLane], o[kMaxPerLane];
  load_row(a.q + b * a.vq.sb + h * a.vq.sh + (active ? i : i_last) * a.vq.sn, a.D, lane, q);
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) o[t] = T(0);
  const T ninf = -INFINITY;
  T mx = ninf, l = 0;
  const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
  const T* kh = a.k + b * a.vk.sb + hk * a.vk.sh;
  const T* vh = a.v + b * a.vv.sb + hk * a.vv.sh;
  const int64_t qt = i0 / kTileWarps, steps = walk_steps(m, m.by_q, qt, j_begin, j_end, tile);
  for (int64_t step = 0; step < steps; ++step) {
    bool full;
    const int64_t j0 = walk_tile(m, m.by_q, qt, step, j_begin, tile, &full);
    if (j0 >= j_end) break;  // (a pattern's tiles past the key lengths)
    const int64_t nt = imin(tile, j_end - j0);
    __syncthreads();  // the previous tile is consumed
    stage_rows(ks, kh, a.vk.sn, j0, nt, a.D);
    stage_rows(vs, vh, a.vv.sn, j0, nt, a.Dv);
    __syncthreads();
    if (!active) continue;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t j = j0 + t;
      if (full ? j >= hi || !visible_extra(m, b, p, j)
               : j < lo || j >= hi || !visible_extra(m, b, p, j) || !pattern_allows(m.pat, p, j))
        continue;
      forward_key(a, m, q, ks + t * a.D, vs + t * a.Dv, b, h, i, p, j, slope, lane, mx, l, o);
    }
  }
  if (active) forward_finish(a, (b * m.Hq + h) * m.Nq + i, lane, mx, l, o);
}

template <class T>
__global__ void dq_tiled_kernel(Args<T> a, DeviceMask m, int tile) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + tile * a.D;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t per_head = (m.Nq + kTileWarps - 1) / kTileWarps;
  const int64_t bh = blockIdx.x / per_head, i0 = (blockIdx.x % per_head) * kTileWarps;
  const int64_t b = bh / m.Hq, h = bh % m.Hq, hk = h / m.G;
  const int64_t i = i0 + warp, i_last = imin(i0 + kTileWarps, m.Nq) - 1;
  const bool active = i < m.Nq;
  const int64_t ir = active ? i : i_last, p = m.q_offset + ir, row = (b * m.Hq + h) * m.Nq + ir;
  const T lse = a.lse[row], di = a.di[row];
  const int64_t lo = key_lo(m, p), hi = lse == -INFINITY ? lo : key_hi(m, b, p);  // fully masked: no gradient
  const int64_t j_begin = key_lo(m, m.q_offset + i0), j_end = key_hi(m, b, m.q_offset + i_last);
  T q[kMaxPerLane], d[kMaxPerLane], dq[kMaxPerLane];
  load_row(a.q + b * a.vq.sb + h * a.vq.sh + ir * a.vq.sn, a.D, lane, q);
  load_row(a.dout + b * a.vdo.sb + h * a.vdo.sh + ir * a.vdo.sn, a.Dv, lane, d);
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) dq[u] = T(0);
  const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
  const T* kh = a.k + b * a.vk.sb + hk * a.vk.sh;
  const T* vh = a.v + b * a.vv.sb + hk * a.vv.sh;
  const int64_t qt = i0 / kTileWarps, steps = walk_steps(m, m.by_q, qt, j_begin, j_end, tile);
  for (int64_t step = 0; step < steps; ++step) {
    bool full;
    const int64_t j0 = walk_tile(m, m.by_q, qt, step, j_begin, tile, &full);
    if (j0 >= j_end) break;
    const int64_t nt = imin(tile, j_end - j0);
    __syncthreads();
    stage_rows(ks, kh, a.vk.sn, j0, nt, a.D);
    stage_rows(vs, vh, a.vv.sn, j0, nt, a.Dv);
    __syncthreads();
    if (!active) continue;
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t j = j0 + t;
      if (full ? j >= hi || !visible_extra(m, b, p, j)
               : j < lo || j >= hi || !visible_extra(m, b, p, j) || !pattern_allows(m.pat, p, j))
        continue;
      dq_key(a, m, q, d, ks + t * a.D, vs + t * a.Dv, b, h, i, p, j, slope, lse, di, lane, dq);
    }
  }
  if (active) store_row(a.dq + row * a.D, a.D, lane, a.scale, dq);
}

// Keys j0 .. j0 + kTileWarps − 1 of kv head hk, one per warp; query rows staged with their lse and
// Di, per query head of the group in order.
template <class T>
__global__ void dkv_tiled_kernel(Args<T> a, DeviceMask m, int tile) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // [tile, D]
  T* ds_ = qs + tile * a.D;            // [tile, Dv] (dO rows)
  T* ls = ds_ + tile * a.Dv;           // [tile] lse
  T* dis = ls + tile;                  // [tile] Di
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t per_head = (m.Nk + kTileWarps - 1) / kTileWarps;
  const int64_t bk = blockIdx.x / per_head, j0 = (blockIdx.x % per_head) * kTileWarps;
  const int64_t b = bk / m.Hkv, hk = bk % m.Hkv;
  const int64_t j = j0 + warp, j_last = imin(j0 + kTileWarps, m.Nk) - 1;
  const bool active = j < m.Nk && !(m.key_len && j >= m.key_len[b]);
  const int64_t jr = j < m.Nk ? j : j_last;
  T kr[kMaxPerLane], vr[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(a.k + b * a.vk.sb + hk * a.vk.sh + jr * a.vk.sn, a.D, lane, kr);
  load_row(a.v + b * a.vv.sb + hk * a.vv.sh + jr * a.vv.sn, a.Dv, lane, vr);
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) dk[u] = dv[u] = T(0);
  // Query rows any key of the block may be seen by: p >= j (causal), p < j + w (window).
  int64_t i_begin = 0, i_end = m.Nq;
  if (m.causal_like) i_begin = imax(0, j0 - m.q_offset);
  if (m.window > 0) i_end = imin(m.Nq, imax(0, j_last + m.window - m.q_offset));
  const int64_t kt = j0 / kTileWarps, steps = walk_steps(m, m.by_k, kt, i_begin, i_end, tile);
  for (int64_t g = 0; g < m.G; ++g) {
    const int64_t h = hk * m.G + g;
    const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
    const T* qh = a.q + b * a.vq.sb + h * a.vq.sh;
    const T* doh = a.dout + b * a.vdo.sb + h * a.vdo.sh;
    const int64_t row0 = (b * m.Hq + h) * m.Nq;
    for (int64_t step = 0; step < steps; ++step) {
      bool full;
      const int64_t r0 = walk_tile(m, m.by_k, kt, step, i_begin, tile, &full);
      if (r0 >= i_end) break;
      const int64_t nt = imin(tile, i_end - r0);
      __syncthreads();
      stage_rows(qs, qh, a.vq.sn, r0, nt, a.D);
      stage_rows(ds_, doh, a.vdo.sn, r0, nt, a.Dv);
      for (int64_t e = threadIdx.x; e < nt; e += blockDim.x) {
        ls[e] = a.lse[row0 + r0 + e];
        dis[e] = a.di[row0 + r0 + e];
      }
      __syncthreads();
      if (!active) continue;
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t i = r0 + t, p = m.q_offset + i;
        if (!full) {
          if (m.causal_like && p < j) continue;
          if (m.window > 0 && p >= j + m.window) continue;
          if (!pattern_allows(m.pat, p, j)) continue;
        }
        if (!visible_extra(m, b, p, j)) continue;
        if (ls[t] == -INFINITY) continue;
        dkv_query(a, m, kr, vr, qs + t * a.D, ds_ + t * a.Dv, b, h, i, p, j, slope, ls[t], dis[t], lane, dk, dv);
      }
    }
  }
  if (j >= m.Nk) return;
  const int64_t row = (b * m.Hkv + hk) * m.Nk + j;  // a key past key_len: zero gradients
  store_row(a.dk + row * a.D, a.D, lane, a.scale, dk);
  store_row(a.dv + row * a.Dv, a.Dv, lane, T(1), dv);
}

unsigned tiled_blocks(int64_t heads, int64_t rows) {
  return static_cast<unsigned>(heads * ((rows + kTileWarps - 1) / kTileWarps));
}

// ---- A sparse pattern on the device: its predicate's tables and the two kernels' walks of its
// block layout, uploaded once per (pattern, shape) and kept in a small LRU beside the CPU's layout
// cache (whose entries it holds, so their addresses identify them).

struct DevicePatternData {
  std::shared_ptr<const BlockLayout> lq, lk;  // forward/dQ grid, dK/dV grid
  DevicePattern pat;
  DeviceLayout by_q, by_k;
  std::vector<Tensor> keep;  // the device arrays the pointers above point into
};

// entries[ptr[o] ..) = (inner << 1) | full for the non-empty tiles of outer tile o (by_key: outer =
// key tile, the layout's CSC; else outer = query tile, its CSR).
DeviceLayout upload_walk(const BlockLayout& L, bool by_key, std::vector<Tensor>& keep) {
  const std::vector<int64_t>& ptr_h = by_key ? L.col_ptr : L.row_ptr;
  const std::vector<int64_t>& inner = by_key ? L.col_tiles : L.row_tiles;
  std::vector<int64_t> tiles(inner.size());
  const int64_t n_outer = static_cast<int64_t>(ptr_h.size()) - 1;
  for (int64_t o = 0; o < n_outer; ++o)
    for (int64_t e = ptr_h[o]; e < ptr_h[o + 1]; ++e) {
      const int64_t t = inner[e];
      const bool full = (by_key ? L.at(t, o) : L.at(o, t)) == BlockLayout::full;
      tiles[e] = (t << 1) | (full ? 1 : 0);
    }
  DeviceLayout w;
  w.tq = L.tq;
  w.tk = L.tk;
  keep.push_back(from_vector_i64(ptr_h, {static_cast<int64_t>(ptr_h.size())}).to(Device::cuda));
  w.ptr = ptr<int64_t>(keep.back());
  keep.push_back(from_vector_i64(tiles.empty() ? std::vector<int64_t>{0} : tiles,
                                 {std::max<int64_t>(1, static_cast<int64_t>(tiles.size()))})
                     .to(Device::cuda));
  w.tiles = ptr<int64_t>(keep.back());
  return w;
}

std::shared_ptr<const DevicePatternData> upload_pattern(const SparsePattern& sp, const MaskRules& rules,
                                                        std::shared_ptr<const BlockLayout> lq,
                                                        std::shared_ptr<const BlockLayout> lk) {
  auto d = std::make_shared<DevicePatternData>();
  const int64_t nk = lq->nk;
  const PatternPredicate pred(sp, nk, rules.has_hi);  // the CPU's (MaskPlan's) resolution
  DevicePattern& t = d->pat;
  t.kind = static_cast<int>(sp.kind);
  t.s = pred.stride();
  t.l = pred.local();
  t.bs = sp.block_size;
  auto upload = [&](const std::vector<int64_t>& v) {
    d->keep.push_back(from_vector_i64(v, {static_cast<int64_t>(v.size())}).to(Device::cuda));
    return ptr<int64_t>(d->keep.back());
  };
  if (sp.kind == Pattern::global || sp.kind == Pattern::bigbird) {
    if (sp.global_tokens.empty()) {
      t.g = sp.global;
    } else {
      std::vector<int64_t> g = sp.global_tokens;
      std::sort(g.begin(), g.end());
      g.erase(std::unique(g.begin(), g.end()), g.end());
      t.n_globals = static_cast<int64_t>(g.size());
      t.globals = upload(g);
    }
  }
  if (sp.kind == Pattern::bigbird && sp.random_blocks > 0) {
    // Positions are < Nk, so query blocks are < ⌈Nk / bs⌉.
    const int64_t nqb = std::max<int64_t>(1, (nk + sp.block_size - 1) / sp.block_size);
    t.r = sp.random_blocks;
    std::vector<int64_t> rand(static_cast<size_t>(nqb * t.r));
    for (int64_t qb = 0; qb < nqb; ++qb)
      for (int64_t k = 0; k < t.r; ++k) rand[qb * t.r + k] = pred.random_block(qb, k);
    t.rand = upload(rand);
  }
  if (sp.kind == Pattern::block_sparse) {
    if (sp.layout == "local_global") {
      t.layout = 0;
    } else if (sp.layout == "fixed") {
      t.layout = 1;
    } else {
      t.layout = 2;
      t.rows = sp.layout_rows;
      t.cols = sp.layout_cols;
      t.table = upload(std::vector<int64_t>(sp.layout_table.begin(), sp.layout_table.end()));
    }
  }
  d->by_q = upload_walk(*lq, /*by_key=*/false, d->keep);
  d->by_k = upload_walk(*lk, /*by_key=*/true, d->keep);
  d->lq = std::move(lq);
  d->lk = std::move(lk);
  return d;
}

// The device copy for these two layouts (one per pattern, shape and tile grids), uploaded on a miss.
std::shared_ptr<const DevicePatternData> device_pattern(const SparsePattern& sp, const MaskRules& rules,
                                                        const std::shared_ptr<const BlockLayout>& lq,
                                                        const std::shared_ptr<const BlockLayout>& lk) {
  static std::mutex mu;
  // Never destroyed: device memory must not be freed after the runtime shuts down at exit.
  static auto* lru = new std::list<std::shared_ptr<const DevicePatternData>>;
  constexpr size_t kCapacity = 16;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = lru->begin(); it != lru->end(); ++it)
    if ((*it)->lq == lq && (*it)->lk == lk) {
      lru->splice(lru->begin(), *lru, it);
      return lru->front();
    }
  lru->push_front(upload_pattern(sp, rules, lq, lk));
  if (lru->size() > kCapacity) lru->pop_back();
  return lru->front();
}

}  // namespace

bool supported(const AttentionOptions& o, const Problem& p) {
  return !o.bias.defined() && !o.allow_mask.defined() && !o.rules && (p.dtype == DType::f32 || p.dtype == DType::f64) &&
         p.D <= kMaxPerLane * kWarp && p.Dv <= kMaxPerLane * kWarp;
}

std::shared_ptr<const Plan> make_plan(const AttentionOptions& o, const Problem& p, KernelSet kernels) {
  const MaskPlan host(p.shape(), o, p.dtype);  // validates every option, names what is wrong
  auto plan = std::make_shared<Plan>();
  plan->p = p;
  DeviceMask& m = plan->m;
  m.B = p.B;
  m.Hq = p.Hq;
  m.Hkv = p.Hkv;
  m.G = p.G;
  m.Nq = p.Nq;
  m.Nk = p.Nk;
  m.q_offset = p.Nk - p.Nq;
  m.window = o.window;
  m.causal_like = o.causal || o.window > 0;
  auto keep = [&](Tensor t) {
    plan->keep.push_back(t);
    return t;
  };
  if (!o.key_lengths.empty()) m.key_len = ptr<int64_t>(keep(from_vector_i64(o.key_lengths, {p.B}).to(Device::cuda)));
  if (o.key_padding.defined()) {
    const Tensor kp = keep(o.key_padding.to(Device::cuda));
    m.key_pad = ptr<bool>(kp);
    m.kp_sb = kp.stride(0);
    m.kp_sj = kp.stride(1);
  }
  if (o.segment_ids.defined()) m.seg = ptr<int64_t>(keep(o.segment_ids.to(Device::cuda).to(DType::i64).contiguous()));
  if (!o.alibi_slopes.empty()) {
    const std::vector<double> slopes(o.alibi_slopes.begin(), o.alibi_slopes.end());
    m.alibi = ptr<float>(keep(from_vector(slopes, {p.Hq}, DType::f32).to(Device::cuda)));
  }
  const DropoutDraw draw(o, p.Hq);
  m.drop = draw.on();
  const DropoutDraw::Key key = draw.key();
  m.k0 = key.k0;
  m.k1 = key.k1;
  m.c3 = key.c3;
  m.thr = key.thr;
  m.keep_scale = draw.keep_scale();
  if (o.pattern && o.pattern->sparse()) {
    // The layouts on the kernels' tile grids. Tiled: forward/dQ blocks of kTileWarps query rows ×
    // key tiles, dK/dV blocks of kTileWarps keys × query tiles (the tile sizes the launches use).
    // Tensor-core: one 64 × 64 grid for all three (their 32-wide tiles at D = 128 split it).
    const int64_t elem = static_cast<int64_t>(dtype_size(p.dtype));
    const MaskRules rules = mask_rules(p.shape(), o);
    const bool tc = kernels == KernelSet::tensor_core;
    const auto lq = block_layout(*o.pattern, rules, p.Nq, p.Nk, tc ? kTensorCoreTile : kTileWarps,
                                 tc ? kTensorCoreTile : tile_rows(p.D + p.Dv, elem));
    const auto lk = tc ? lq : block_layout(*o.pattern, rules, p.Nq, p.Nk, tile_rows(p.D + p.Dv + 2, elem), kTileWarps);
    const auto dev = device_pattern(*o.pattern, rules, lq, lk);
    m.pat = dev->pat;
    m.by_q = dev->by_q;
    m.by_k = dev->by_k;
    plan->keep.insert(plan->keep.end(), dev->keep.begin(), dev->keep.end());
  }
  return plan;
}

TileWalk tile_walk(const Plan& plan, bool by_key) {
  TileWalk w;
  const DeviceMask& m = plan.m;
  if (m.pat.kind == 0) return w;
  const DeviceLayout& L = by_key ? m.by_k : m.by_q;
  w.tq = L.tq;
  w.tk = L.tk;
  const int64_t nqt = (m.Nq + L.tq - 1) / L.tq, nkt = (m.Nk + L.tk - 1) / L.tk, n_outer = by_key ? nkt : nqt;
  w.total = nqt * nkt;
  std::vector<int64_t> ptr_h(static_cast<size_t>(n_outer + 1));
  QKV_CUDA_CHECK(cudaMemcpy(ptr_h.data(), L.ptr, ptr_h.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  w.visited = ptr_h.back();
  std::vector<int64_t> tiles(static_cast<size_t>(w.visited));
  if (!tiles.empty())
    QKV_CUDA_CHECK(cudaMemcpy(tiles.data(), L.tiles, tiles.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
  for (int64_t t : tiles) w.full += t & 1;
  return w;
}

FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const Plan& plan) {
  const Problem& p = plan.p;
  return run_forward(q, k, v, p, [&](const auto& a) {
    using T = typename std::decay_t<decltype(a)>::Scalar;
    const int tile = tile_rows(p.D + p.Dv, sizeof(T));
    forward_tiled_kernel<T>
        <<<tiled_blocks(p.B * p.Hq, p.Nq), kTileWarps * kWarp, tile*(p.D + p.Dv) * sizeof(T)>>>(a, plan.m, tile);
    QKV_CUDA_LAUNCHED("forward_kernel");
  });
}

FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Plan& plan) {
  const Problem& p = plan.p;
  return run_backward(dout, q, k, v, out, lse, p, [&](const auto& a, int64_t qrows, int64_t krows) {
    using T = typename std::decay_t<decltype(a)>::Scalar;
    if (qrows > 0) {
      di_kernel<T><<<blocks_for_rows(qrows), kWarpsPerBlock * kWarp>>>(a, plan.m);
      QKV_CUDA_LAUNCHED("di_kernel");
      const int tile = tile_rows(p.D + p.Dv, sizeof(T));
      dq_tiled_kernel<T>
          <<<tiled_blocks(p.B * p.Hq, p.Nq), kTileWarps * kWarp, tile*(p.D + p.Dv) * sizeof(T)>>>(a, plan.m, tile);
      QKV_CUDA_LAUNCHED("dq_tiled_kernel");
    }
    if (krows > 0) {
      const int tile = tile_rows(p.D + p.Dv + 2, sizeof(T));  // + lse and Di per staged row
      dkv_tiled_kernel<T>
          <<<tiled_blocks(p.B * p.Hkv, p.Nk), kTileWarps * kWarp, tile*(p.D + p.Dv + 2) * sizeof(T)>>>(a, plan.m, tile);
      QKV_CUDA_LAUNCHED("dkv_tiled_kernel");
    }
  });
}

}  // namespace qkv::attn::cuda_fused
