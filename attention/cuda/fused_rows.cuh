// Internal to attention/cuda/: the device code that the production (tiled) CUDA attention kernels
// of fused_attention.cu and the untiled "simple" kernels of dev/simple_attention.cu (compiled only
// into the tests, the cross-check of the tiling) share: the per-row arithmetic, the mask and the
// dropout draw, and the host helpers that set up a launch. One warp handles one row; lane l holds
// the head-dim elements l, l + 32, ... of its vectors (up to kMaxPerLane each). Formulas: the
// header of fused_attention.cu.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/cuda/fused_cuda.h"
#include "attention/cuda/pattern_predicate.cuh"
#include "tensor/cuda/geometry.cuh"
#include "tensor/philox.h"

namespace qkv::attn::cuda_fused::rows {

using cuda::detail::ptr;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 8;  // head dims up to 256

__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Strides of one [B, H, N, D] operand (rows contiguous along D).
struct View {
  int64_t sb, sh, sn;
};
inline View view_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

__device__ __forceinline__ int64_t key_lo(const DeviceMask& m, int64_t p) {
  return m.window > 0 ? imax(0, p - m.window + 1) : 0;
}
__device__ __forceinline__ int64_t key_hi(const DeviceMask& m, int64_t b, int64_t p) {
  int64_t h = m.Nk;
  if (m.causal_like) h = imin(h, p + 1);
  if (m.key_len) h = imin(h, m.key_len[b]);
  return imax(h, 0);
}
__device__ __forceinline__ bool visible_extra(const DeviceMask& m, int64_t b, int64_t p, int64_t j) {
  if (m.key_pad && !m.key_pad[b * m.kp_sb + j * m.kp_sj]) return false;
  if (m.seg && m.seg[b * m.Nk + p] != m.seg[b * m.Nk + j]) return false;
  return true;
}
// z_ij: 0 or 1/(1−p) under dropout (the draw documented in attention.h), else 1.
template <class T>
__device__ __forceinline__ T dropout_z(const DeviceMask& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!m.drop) return T(1);
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(j >> 2), static_cast<uint32_t>(i),
                                  static_cast<uint32_t>(b * m.Hq + h), m.c3, m.k0, m.k1);
  return (r.v[j & 3] >> 8) >= m.thr ? static_cast<T>(m.keep_scale) : T(0);
}

template <class T>
__device__ __forceinline__ void load_row(const T* src, int64_t D, int lane, T* dst) {
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t c = lane + t * kWarp;
    dst[t] = c < D ? src[c] : T(0);
  }
}
template <class T>
__device__ __forceinline__ T dot_row(const T* reg, const T* row, int64_t D, int lane) {
  T s = 0;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    const int64_t c = lane + t * kWarp;
    if (c < D) s += reg[t] * row[c];
  }
  return warp_sum(s);
}

template <class T>
struct Args {
  using Scalar = T;
  const T *q, *k, *v, *out, *dout, *lse, *di;
  View vq, vk, vv, vo, vdo;
  T *o_w, *lse_w, *di_w, *dq, *dk, *dv;  // outputs (contiguous)
  int64_t D, Dv;
  T scale;
};

// ---- The per-row arithmetic, shared by the simple and the tiled kernels (which differ only in
// where the other operand's rows come from: global memory or a shared-memory tile, and in which
// keys they visit).

// Forward, one visible key j (rows kr, vr) for query row i at position p: the online-softmax
// update of the running max mx, sum l and unnormalised output o.
template <class T>
__device__ __forceinline__ void forward_key(const Args<T>& a, const DeviceMask& m, const T* q, const T* kr, const T* vr,
                                            int64_t b, int64_t h, int64_t i, int64_t p, int64_t j, T slope, int lane,
                                            T& mx, T& l, T* o) {
  T s = a.scale * dot_row(q, kr, a.D, lane);
  if (m.alibi) s -= slope * static_cast<T>(p - j);
  const T m_new = s > mx ? s : mx;
  const T alpha = mx == -INFINITY ? T(0) : ::exp(mx - m_new);
  const T e = ::exp(s - m_new);
  l = l * alpha + e;
  const T w = e * dropout_z<T>(m, b, h, i, j);
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t c = lane + u * kWarp;
    o[u] = o[u] * alpha + (c < a.Dv ? w * vr[c] : T(0));
  }
  mx = m_new;
}

// out_row = o / l and lse = m + log l (a row that saw no key: zeros and −inf).
template <class T>
__device__ __forceinline__ void forward_finish(const Args<T>& a, int64_t row, int lane, T mx, T l, const T* o) {
  T* orow = a.o_w + row * a.Dv;
  const T inv = l > T(0) ? T(1) / l : T(0);
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.Dv) orow[c] = o[u] * inv;
  }
  if (lane == 0) a.lse_w[row] = mx == -INFINITY ? T(-INFINITY) : mx + ::log(l);
}

// dQ, one visible key j: dq += dS_ij · k_j with dS_ij = P_ij (z_ij dO_i·v_j − Di).
template <class T>
__device__ __forceinline__ void dq_key(const Args<T>& a, const DeviceMask& m, const T* q, const T* d, const T* kr,
                                       const T* vr, int64_t b, int64_t h, int64_t i, int64_t p, int64_t j, T slope,
                                       T lse, T di, int lane, T* dq) {
  T s = a.scale * dot_row(q, kr, a.D, lane);
  if (m.alibi) s -= slope * static_cast<T>(p - j);
  const T pij = ::exp(s - lse);
  const T dp = dropout_z<T>(m, b, h, i, j) * dot_row(d, vr, a.Dv, lane);
  const T ds = pij * (dp - di);
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.D) dq[u] += ds * kr[c];
  }
}

// dK/dV of key j (k, v in registers), one query row i that sees it (rows qi, doi):
// dv += P_ij z_ij dO_i, dk += dS_ij q_i.
template <class T>
__device__ __forceinline__ void dkv_query(const Args<T>& a, const DeviceMask& m, const T* kr, const T* vr, const T* qi,
                                          const T* doi, int64_t b, int64_t h, int64_t i, int64_t p, int64_t j, T slope,
                                          T lse, T di, int lane, T* dk, T* dv) {
  T s = a.scale * dot_row(kr, qi, a.D, lane);
  if (m.alibi) s -= slope * static_cast<T>(p - j);
  const T pij = ::exp(s - lse);
  const T z = dropout_z<T>(m, b, h, i, j);
  const T dp = z * dot_row(vr, doi, a.Dv, lane);
  const T ds = pij * (dp - di);
  const T pz = pij * z;
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.Dv) dv[u] += pz * doi[c];
    if (c < a.D) dk[u] += ds * qi[c];
  }
}

// Writes scale·acc to a [rows, width] output row.
template <class T>
__device__ __forceinline__ void store_row(T* dst, int64_t width, int lane, T scale, const T* acc) {
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < width) dst[c] = scale * acc[u];
  }
}

// Di = dO_i · O_i per query row (one warp per row, kWarpsPerBlock rows per block).
template <class T>
__global__ void di_kernel(Args<T> a, DeviceMask m) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= m.B * m.Hq * m.Nq) return;
  const int64_t i = row % m.Nq, h = (row / m.Nq) % m.Hq, b = row / (m.Nq * m.Hq);
  T d[kMaxPerLane];
  load_row(a.dout + b * a.vdo.sb + h * a.vdo.sh + i * a.vdo.sn, a.Dv, lane, d);
  const T s = dot_row(d, a.out + b * a.vo.sb + h * a.vo.sh + i * a.vo.sn, a.Dv, lane);
  if (lane == 0) a.di_w[row] = s;
}

// ---- Host side of a launch.

// Rows per shared-memory tile for staged rows of `width` elements of `elem` bytes: 32, or fewer for
// wide heads so the tile stays within the default 48 KB of shared memory. (The tile grid of the
// block layouts, so make_plan and the launches must agree.)
inline int tile_rows(int64_t width, int64_t elem) {
  int t = 32;
  while (t > 1 && static_cast<int64_t>(t) * width * elem > 48 * 1024) t /= 2;
  return t;
}

inline unsigned blocks_for_rows(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <class T>
Args<T> args_of(const Tensor& q, const Tensor& k, const Tensor& v, const Problem& p) {
  Args<T> a{};
  a.q = ptr<T>(q);
  a.k = ptr<T>(k);
  a.v = ptr<T>(v);
  a.vq = view_of(q);
  a.vk = view_of(k);
  a.vv = view_of(v);
  a.D = p.D;
  a.Dv = p.Dv;
  a.scale = static_cast<T>(p.scale);
  return a;
}

// The backward operands besides q, k, v; di is scratch of B·Hq·Nq rows.
template <class T>
void set_backward(Args<T>& a, const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& di,
                  const FusedGrads& g) {
  a.out = ptr<T>(out);
  a.vo = view_of(out);
  a.dout = ptr<T>(dout);
  a.vdo = view_of(dout);
  a.lse = ptr<T>(lse);
  a.di = ptr<T>(di);
  a.di_w = ptr<T>(di);
  a.dq = ptr<T>(g.dq);
  a.dk = ptr<T>(g.dk);
  a.dv = ptr<T>(g.dv);
}

// q, k, v with unit stride along D (the kernels index rows directly).
inline Tensor rows_ok(const Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }

// One forward call's set-up, the same for every kernel set: operands with unit stride along D, O
// and lse allocated; launch(a) gets the Args of the problem's dtype (a.o_w, a.lse_w set; the
// kernel's element type is Args::Scalar). Returns O and lse.
template <class Launch>
FusedForward run_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Problem& p,
                         Launch&& launch) {
  const Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in);
  FusedForward r;
  r.out = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.dtype, Device::cuda);
  r.lse = Tensor::empty({p.B, p.Hq, p.Nq}, p.dtype, Device::cuda);
  if (p.B * p.Hq * p.Nq == 0) return r;
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    Args<T> a = args_of<T>(q, k, v, p);
    a.o_w = ptr<T>(r.out);
    a.lse_w = ptr<T>(r.lse);
    launch(a);
  };
  if (p.dtype == DType::f32) typed(float{});
  else typed(double{});
  return r;
}

// One backward call's set-up: operands with unit stride along D, dq, dk, dv and the Di scratch
// allocated; launch(a, qrows, krows) gets the Args of the problem's dtype with every backward
// operand set (qrows = B·Hq·Nq, krows = B·Hkv·Nk). Returns dq, dk, dv.
template <class Launch>
FusedGrads run_backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                        const Tensor& out_in, const Tensor& lse, const Problem& p, Launch&& launch) {
  const Tensor q = rows_ok(q_in), k = rows_ok(k_in), v = rows_ok(v_in), out = rows_ok(out_in), dout = rows_ok(dout_in);
  FusedGrads g;
  g.dq = Tensor::empty({p.B, p.Hq, p.Nq, p.D}, p.dtype, Device::cuda);
  g.dk = Tensor::empty({p.B, p.Hkv, p.Nk, p.D}, p.dtype, Device::cuda);
  g.dv = Tensor::empty({p.B, p.Hkv, p.Nk, p.Dv}, p.dtype, Device::cuda);
  const int64_t qrows = p.B * p.Hq * p.Nq, krows = p.B * p.Hkv * p.Nk;
  Tensor di = Tensor::empty({std::max<int64_t>(qrows, 1)}, p.dtype, Device::cuda);
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    Args<T> a = args_of<T>(q, k, v, p);
    set_backward(a, out, dout, lse, di, g);
    launch(a, qrows, krows);
  };
  if (p.dtype == DType::f32) typed(float{});
  else typed(double{});
  return g;
}

}  // namespace qkv::attn::cuda_fused::rows
