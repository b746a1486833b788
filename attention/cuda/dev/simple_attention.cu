// The untiled CUDA attention kernels (see simple_attention.h): one warp per query row (forward,
// dQ) or key row (dK/dV), visiting every key (query) of the row's interval in increasing order and
// testing a sparse pattern's predicate on each (no block layout: the tiled kernels' skipping is
// what they check).
#include "attention/cuda/dev/simple_attention.h"

#include <cuda_runtime.h>

#include "attention/cuda/fused_rows.cuh"
#include "tensor/cuda/cuda_check.h"

namespace qkv::attn::cuda_simple {
namespace {

using namespace cuda_fused;
using namespace cuda_fused::rows;

template <class T>
__global__ void forward_kernel(Args<T> a, DeviceMask m) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= m.B * m.Hq * m.Nq) return;
  const int64_t i = row % m.Nq, h = (row / m.Nq) % m.Hq, b = row / (m.Nq * m.Hq), hk = h / m.G;
  const int64_t p = m.q_offset + i;
  T q[kMaxPerLane], o[kMaxPerLane];
  load_row(a.q + b * a.vq.sb + h * a.vq.sh + i * a.vq.sn, a.D, lane, q);
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) o[t] = T(0);
  const T ninf = -INFINITY;
  T mx = ninf, l = 0;
  const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
  const T* kh = a.k + b * a.vk.sb + hk * a.vk.sh;
  const T* vh = a.v + b * a.vv.sb + hk * a.vv.sh;
  const int64_t hi = key_hi(m, b, p);
  for (int64_t j = key_lo(m, p); j < hi; ++j)
    if (visible_extra(m, b, p, j) && pattern_allows(m.pat, p, j))
      forward_key(a, m, q, kh + j * a.vk.sn, vh + j * a.vv.sn, b, h, i, p, j, slope, lane, mx, l, o);
  forward_finish(a, row, lane, mx, l, o);
}

template <class T>
__global__ void dq_kernel(Args<T> a, DeviceMask m) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= m.B * m.Hq * m.Nq) return;
  const int64_t i = row % m.Nq, h = (row / m.Nq) % m.Hq, b = row / (m.Nq * m.Hq), hk = h / m.G;
  const int64_t p = m.q_offset + i;
  T q[kMaxPerLane], d[kMaxPerLane], dq[kMaxPerLane];
  load_row(a.q + b * a.vq.sb + h * a.vq.sh + i * a.vq.sn, a.D, lane, q);
  load_row(a.dout + b * a.vdo.sb + h * a.vdo.sh + i * a.vdo.sn, a.Dv, lane, d);
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) dq[t] = T(0);
  const T lse = a.lse[row], di = a.di[row];
  const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
  const T* kh = a.k + b * a.vk.sb + hk * a.vk.sh;
  const T* vh = a.v + b * a.vv.sb + hk * a.vv.sh;
  const int64_t hi = lse == -INFINITY ? 0 : key_hi(m, b, p);  // a fully masked row has no gradient
  for (int64_t j = key_lo(m, p); j < hi; ++j)
    if (visible_extra(m, b, p, j) && pattern_allows(m.pat, p, j))
      dq_key(a, m, q, d, kh + j * a.vk.sn, vh + j * a.vv.sn, b, h, i, p, j, slope, lse, di, lane, dq);
  store_row(a.dq + row * a.D, a.D, lane, a.scale, dq);
}

// One warp per key row j of kv head hk: sums over the G query heads of the group, in order, and
// over the query rows that can see j.
template <class T>
__global__ void dkv_kernel(Args<T> a, DeviceMask m) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= m.B * m.Hkv * m.Nk) return;
  const int64_t j = row % m.Nk, hk = (row / m.Nk) % m.Hkv, b = row / (m.Nk * m.Hkv);
  T kr[kMaxPerLane], vr[kMaxPerLane], dk[kMaxPerLane], dv[kMaxPerLane];
  load_row(a.k + b * a.vk.sb + hk * a.vk.sh + j * a.vk.sn, a.D, lane, kr);
  load_row(a.v + b * a.vv.sb + hk * a.vv.sh + j * a.vv.sn, a.Dv, lane, vr);
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) dk[t] = dv[t] = T(0);
  // Query rows whose interval can hold j: p >= j (causal), p < j + w (window).
  int64_t i_lo = 0, i_hi = m.Nq;
  if (m.causal_like) i_lo = imax(0, j - m.q_offset);
  if (m.window > 0) i_hi = imin(m.Nq, imax(0, j + m.window - m.q_offset));
  if (m.key_len && j >= m.key_len[b]) i_hi = 0;
  for (int64_t g = 0; g < m.G; ++g) {
    const int64_t h = hk * m.G + g;
    const T slope = m.alibi ? static_cast<T>(m.alibi[h]) : T(0);
    for (int64_t i = i_lo; i < i_hi; ++i) {
      const int64_t p = m.q_offset + i, qrow = (b * m.Hq + h) * m.Nq + i;
      if (!visible_extra(m, b, p, j) || !pattern_allows(m.pat, p, j)) continue;
      const T lse = a.lse[qrow];
      if (lse == -INFINITY) continue;
      dkv_query(a, m, kr, vr, a.q + b * a.vq.sb + h * a.vq.sh + i * a.vq.sn,
                a.dout + b * a.vdo.sb + h * a.vdo.sh + i * a.vdo.sn, b, h, i, p, j, slope, lse, a.di[qrow], lane, dk,
                dv);
    }
  }
  store_row(a.dk + row * a.D, a.D, lane, a.scale, dk);
  store_row(a.dv + row * a.Dv, a.Dv, lane, T(1), dv);
}

}  // namespace

FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const cuda_fused::Plan& plan) {
  return run_forward(q, k, v, plan.p, [&](const auto& a) {
    using T = typename std::decay_t<decltype(a)>::Scalar;
    forward_kernel<T><<<blocks_for_rows(plan.p.B * plan.p.Hq * plan.p.Nq), kWarpsPerBlock * kWarp>>>(a, plan.m);
    QKV_CUDA_LAUNCHED("simple forward_kernel");
  });
}

FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const cuda_fused::Plan& plan) {
  return run_backward(dout, q, k, v, out, lse, plan.p, [&](const auto& a, int64_t qrows, int64_t krows) {
    using T = typename std::decay_t<decltype(a)>::Scalar;
    if (qrows > 0) {
      di_kernel<T><<<blocks_for_rows(qrows), kWarpsPerBlock * kWarp>>>(a, plan.m);
      QKV_CUDA_LAUNCHED("di_kernel");
      dq_kernel<T><<<blocks_for_rows(qrows), kWarpsPerBlock * kWarp>>>(a, plan.m);
      QKV_CUDA_LAUNCHED("simple dq_kernel");
    }
    if (krows > 0) {
      dkv_kernel<T><<<blocks_for_rows(krows), kWarpsPerBlock * kWarp>>>(a, plan.m);
      QKV_CUDA_LAUNCHED("simple dkv_kernel");
    }
  });
}

}  // namespace qkv::attn::cuda_simple
