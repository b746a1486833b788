// CUDA linear attention, forward and backward (design in linear_cuda.h, math in
// attention/linear/linear_attention.h). Per (b, h) with Φ = φ(√s·Q), Ψ = valid·φ(√s·K):
//   chunk C = [c0, c1):  A_ij = Φ_i·Ψ_j (j ≤ i, same segment run)
//                        O_i = (Σ_j A_ij v_j + [i reads the prefix] Φ_iᵀS) / (Σ_j A_ij + [..] Φ_i·z + ε)
//                        then S, z advance by the chunk's keys (restarting where a run begins).
// Backward: dnum = dO/den, dden = −dO·O/den; a forward sweep gives dΦ, a reverse sweep with the
// suffix state R⁺ gives dΨ and dV; then dq, dk through φ. Workspaces are per block, in global memory.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "attention/linear/linear_cuda.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/geometry.cuh"
#include "tensor/ops.h"

namespace qkv::attn::cuda_linear {
namespace {

using cuda::detail::ptr;

constexpr int kThreads = 256;
enum { kElu1 = 0, kRelu = 1, kFavor = 2 };

// F[row, r] = φ(rs·x[row])_r; rows whose key is invalid get 0. Row `row` of x is (bh, j) with
// j = row % n and b = row / (heads·n) (valid is [B, n]).
template <class T>
__global__ void features_kernel(const T* x, int64_t rows, int64_t n, int64_t heads, int64_t D, int64_t m, int feature,
                                T rs, const T* W, const uint8_t* valid, T* F) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * m) return;
  const int64_t row = idx / m, r = idx % m;
  const T* xr = x + row * D;
  T f;
  if (feature == kFavor) {
    T u = 0, sq = 0;
    for (int64_t d = 0; d < D; ++d) {
      const T t = rs * xr[d];
      u += W[r * D + d] * t;
      sq += t * t;
    }
    f = ::exp(u - sq / 2) / ::sqrt(static_cast<T>(m));
  } else {
    const T t = rs * xr[r];
    f = feature == kRelu ? (t > 0 ? t : T(0)) : (t > 0 ? t + 1 : ::exp(t));
  }
  if (valid && !valid[(row / (heads * n)) * n + row % n]) f = 0;
  F[idx] = f;
}

// dx[row] = rs·vjp_φ(rs·x[row], dF[row]) (0 for invalid keys); one thread per row.
template <class T>
__global__ void features_backward_kernel(const T* x, const T* F, const T* dF, int64_t rows, int64_t n, int64_t heads,
                                         int64_t D, int64_t m, int feature, T rs, const T* W, const uint8_t* valid,
                                         T* dx) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const T *xr = x + row * D, *fr = F + row * m, *gr = dF + row * m;
  T* out = dx + row * D;
  const bool ok = !valid || valid[(row / (heads * n)) * n + row % n];
  if (feature == kFavor) {
    T sum = 0;
    for (int64_t r = 0; r < m; ++r) sum += gr[r] * fr[r];
    for (int64_t d = 0; d < D; ++d) {
      T acc = 0;
      for (int64_t r = 0; r < m; ++r) acc += gr[r] * fr[r] * W[r * D + d];
      out[d] = ok ? rs * (acc - sum * rs * xr[d]) : T(0);
    }
  } else {
    for (int64_t d = 0; d < D; ++d) {
      const T t = rs * xr[d];
      const T dphi = t > 0 ? T(1) : (feature == kRelu ? T(0) : ::exp(t));
      out[d] = ok ? rs * gr[d] * dphi : T(0);
    }
  }
}

struct Dims {
  int64_t Hq, Hkv, G, Nq, Nk, Dv, m, c;
  bool causal;
  int64_t hi;  // in-chunk rule: j - i < hi (LinearAttentionOptions::chunk_key_hi)
};

__device__ __forceinline__ bool visible(const int64_t* st, int64_t c0, int64_t i, int64_t j, int64_t hi) {
  return j - i < hi && st[c0 + i] == st[c0 + j];
}

// S, z after the chunk [c0, c0 + cl): += its keys, or restarted at a run begun inside it.
template <class T>
__device__ void advance(T* S, T* z, const T* psi, const T* v, const int64_t* st, int64_t c0, int64_t cl, int64_t m,
                        int64_t Dv) {
  const int64_t last = st[c0 + cl - 1];
  const bool reset = last >= c0;
  const int64_t from = reset ? last : c0;
  for (int64_t idx = threadIdx.x; idx < m * Dv; idx += blockDim.x) {
    const int64_t r = idx / Dv, e = idx % Dv;
    T acc = reset ? T(0) : S[idx];
    for (int64_t j = from; j < c0 + cl; ++j) acc += psi[j * m + r] * v[j * Dv + e];
    S[idx] = acc;
  }
  for (int64_t r = threadIdx.x; r < m; r += blockDim.x) {
    T acc = reset ? T(0) : z[r];
    for (int64_t j = from; j < c0 + cl; ++j) acc += psi[j * m + r];
    z[r] = acc;
  }
  __syncthreads();
}

// One block per (b, h). ws: per block S [m·Dv], z [m], A [c·c].
template <class T>
__global__ void forward_kernel(const T* Phi, const T* Psi, const T* V, const int64_t* start, T* out, T* den, T* ws,
                               Dims d, T eps) {
  const int64_t bh = blockIdx.x, b = bh / d.Hq, h = bh % d.Hq, hk = h / d.G, m = d.m, Dv = d.Dv, c = d.c;
  const T* phi = Phi + bh * d.Nq * m;
  const T* psi = Psi + (b * d.Hkv + hk) * d.Nk * m;
  const T* v = V + (b * d.Hkv + hk) * d.Nk * Dv;
  const int64_t* st = start + b * d.Nk;
  T* o = out + bh * d.Nq * Dv;
  T* dn = den + bh * d.Nq;
  T* S = ws + bh * (m * Dv + m + c * c);
  T* z = S + m * Dv;
  T* A = z + m;
  if (!d.causal) {
    advance(S, z, psi, v, st, 0, d.Nk, m, Dv);  // st is all 0 here: S = Ψᵀ·V, z = Ψᵀ·1
    for (int64_t idx = threadIdx.x; idx < d.Nq * Dv; idx += blockDim.x) {
      const int64_t i = idx / Dv, e = idx % Dv;
      T num = 0, dd = eps;
      for (int64_t r = 0; r < m; ++r) {
        num += phi[i * m + r] * S[r * Dv + e];
        dd += phi[i * m + r] * z[r];
      }
      o[idx] = num / dd;
      if (e == 0) dn[i] = dd;
    }
    return;
  }
  for (int64_t idx = threadIdx.x; idx < m * Dv + m; idx += blockDim.x) S[idx] = 0;  // S and z
  __syncthreads();
  for (int64_t c0 = 0; c0 < d.Nk; c0 += c) {
    const int64_t cl = c < d.Nk - c0 ? c : d.Nk - c0;
    for (int64_t idx = threadIdx.x; idx < cl * cl; idx += blockDim.x) {
      const int64_t i = idx / cl, j = idx % cl;
      T a = 0;
      if (visible(st, c0, i, j, d.hi))
        for (int64_t r = 0; r < m; ++r) a += phi[(c0 + i) * m + r] * psi[(c0 + j) * m + r];
      A[i * c + j] = a;
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < cl * Dv; idx += blockDim.x) {
      const int64_t i = idx / Dv, e = idx % Dv;
      const bool prefix = st[c0 + i] < c0;
      T num = 0, dd = eps;
      for (int64_t j = 0; j < cl; ++j) {
        num += A[i * c + j] * v[(c0 + j) * Dv + e];
        dd += A[i * c + j];
      }
      if (prefix)
        for (int64_t r = 0; r < m; ++r) {
          num += phi[(c0 + i) * m + r] * S[r * Dv + e];
          dd += phi[(c0 + i) * m + r] * z[r];
        }
      o[(c0 + i) * Dv + e] = num / dd;
      if (e == 0) dn[c0 + i] = dd;
    }
    __syncthreads();
    advance(S, z, psi, v, st, c0, cl, m, Dv);
  }
}

// dnum = dO / den, dden = −(dO·O) / den; one thread per row.
template <class T>
__global__ void dnum_kernel(const T* dout, const T* out, const T* den, int64_t rows, int64_t Dv, T* dnum, T* dden) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const T inv = T(1) / den[row];
  T dot = 0;
  for (int64_t e = 0; e < Dv; ++e) {
    dnum[row * Dv + e] = dout[row * Dv + e] * inv;
    dot += dout[row * Dv + e] * out[row * Dv + e];
  }
  dden[row] = -dot * inv;
}

// A and dA = dnum·vᵀ + dden of chunk C, masked.
template <class T>
__device__ void chunk_mats(const T* phi, const T* psi, const T* v, const T* dnum, const T* dden, const int64_t* st,
                           int64_t c0, int64_t cl, const Dims& d, T* A, T* dA) {
  const int64_t m = d.m, Dv = d.Dv, c = d.c;
  for (int64_t idx = threadIdx.x; idx < cl * cl; idx += blockDim.x) {
    const int64_t i = idx / cl, j = idx % cl;
    T a = 0, da = 0;
    if (visible(st, c0, i, j, d.hi)) {
      for (int64_t r = 0; r < m; ++r) a += phi[(c0 + i) * m + r] * psi[(c0 + j) * m + r];
      for (int64_t e = 0; e < Dv; ++e) da += dnum[(c0 + i) * Dv + e] * v[(c0 + j) * Dv + e];
      da += dden[c0 + i];
    }
    A[i * c + j] = a;
    dA[i * c + j] = da;
  }
  __syncthreads();
}

// One block per (b, kv head), the G query heads in order. ws: per block S [m·Dv], z [m], A, dA [c·c].
template <class T>
__global__ void backward_kernel(const T* Phi, const T* Psi, const T* V, const T* Dnum, const T* Dden,
                                const int64_t* start, T* dPhi, T* dPsi, T* dV, T* ws, Dims d) {
  const int64_t bk = blockIdx.x, b = bk / d.Hkv, hk = bk % d.Hkv, m = d.m, Dv = d.Dv, c = d.c;
  const T* psi = Psi + bk * d.Nk * m;
  const T* v = V + bk * d.Nk * Dv;
  const int64_t* st = start + b * d.Nk;
  T* dpsi = dPsi + bk * d.Nk * m;
  T* dv = dV + bk * d.Nk * Dv;
  T* S = ws + bk * (m * Dv + m + 2 * c * c);
  T* z = S + m * Dv;
  T* A = z + m;
  T* dA = A + c * c;
  for (int64_t idx = threadIdx.x; idx < d.Nk * m; idx += blockDim.x) dpsi[idx] = 0;
  for (int64_t idx = threadIdx.x; idx < d.Nk * Dv; idx += blockDim.x) dv[idx] = 0;
  __syncthreads();
  for (int64_t g = 0; g < d.G; ++g) {
    const int64_t bh = b * d.Hq + hk * d.G + g;
    const T* phi = Phi + bh * d.Nq * m;
    const T* dnum = Dnum + bh * d.Nq * Dv;
    const T* dden = Dden + bh * d.Nq;
    T* dphi = dPhi + bh * d.Nq * m;
    if (!d.causal) {
      advance(S, z, psi, v, st, 0, d.Nk, m, Dv);  // S = Ψᵀ·V, z = Ψᵀ·1
      for (int64_t idx = threadIdx.x; idx < d.Nq * m; idx += blockDim.x) {
        const int64_t i = idx / m, r = idx % m;
        T acc = dden[i] * z[r];
        for (int64_t e = 0; e < Dv; ++e) acc += dnum[i * Dv + e] * S[r * Dv + e];
        dphi[idx] = acc;
      }
      __syncthreads();
      // R = Φᵀ·dnum, r = Φᵀ·dden
      for (int64_t idx = threadIdx.x; idx < m * Dv; idx += blockDim.x) {
        const int64_t r = idx / Dv, e = idx % Dv;
        T acc = 0;
        for (int64_t i = 0; i < d.Nq; ++i) acc += phi[i * m + r] * dnum[i * Dv + e];
        S[idx] = acc;
      }
      for (int64_t r = threadIdx.x; r < m; r += blockDim.x) {
        T acc = 0;
        for (int64_t i = 0; i < d.Nq; ++i) acc += phi[i * m + r] * dden[i];
        z[r] = acc;
      }
      __syncthreads();
      for (int64_t idx = threadIdx.x; idx < d.Nk * m; idx += blockDim.x) {
        const int64_t j = idx / m, r = idx % m;
        T acc = z[r];
        for (int64_t e = 0; e < Dv; ++e) acc += v[j * Dv + e] * S[r * Dv + e];
        dpsi[idx] += acc;
      }
      for (int64_t idx = threadIdx.x; idx < d.Nk * Dv; idx += blockDim.x) {
        const int64_t j = idx / Dv, e = idx % Dv;
        T acc = 0;
        for (int64_t r = 0; r < m; ++r) acc += psi[j * m + r] * S[r * Dv + e];
        dv[idx] += acc;
      }
      __syncthreads();
      continue;
    }
    // Forward sweep: dΦ_C = [prefix rows] (dnum·S⁻ + dden·z⁻) + dA·Ψ_C
    for (int64_t idx = threadIdx.x; idx < m * Dv + m; idx += blockDim.x) S[idx] = 0;
    __syncthreads();
    for (int64_t c0 = 0; c0 < d.Nk; c0 += c) {
      const int64_t cl = c < d.Nk - c0 ? c : d.Nk - c0;
      chunk_mats(phi, psi, v, dnum, dden, st, c0, cl, d, A, dA);
      for (int64_t idx = threadIdx.x; idx < cl * m; idx += blockDim.x) {
        const int64_t i = idx / m, r = idx % m;
        T acc = 0;
        if (st[c0 + i] < c0) {
          acc = dden[c0 + i] * z[r];
          for (int64_t e = 0; e < Dv; ++e) acc += dnum[(c0 + i) * Dv + e] * S[r * Dv + e];
        }
        for (int64_t j = 0; j < cl; ++j) acc += dA[i * c + j] * psi[(c0 + j) * m + r];
        dphi[(c0 + i) * m + r] = acc;
      }
      __syncthreads();
      advance(S, z, psi, v, st, c0, cl, m, Dv);
    }
    // Reverse sweep with R⁺ (in S), r⁺ (in z).
    for (int64_t idx = threadIdx.x; idx < m * Dv + m; idx += blockDim.x) S[idx] = 0;
    __syncthreads();
    for (int64_t c0 = ((d.Nk - 1) / c) * c; c0 >= 0; c0 -= c) {
      const int64_t cl = c < d.Nk - c0 ? c : d.Nk - c0;
      const int64_t open_run = st[c0 + cl - 1];
      chunk_mats(phi, psi, v, dnum, dden, st, c0, cl, d, A, dA);
      for (int64_t idx = threadIdx.x; idx < cl * m; idx += blockDim.x) {
        const int64_t j = idx / m, r = idx % m;
        T acc = 0;
        if (st[c0 + j] == open_run) {
          acc = z[r];
          for (int64_t e = 0; e < Dv; ++e) acc += v[(c0 + j) * Dv + e] * S[r * Dv + e];
        }
        for (int64_t i = 0; i < cl; ++i) acc += dA[i * c + j] * phi[(c0 + i) * m + r];
        dpsi[(c0 + j) * m + r] += acc;
      }
      for (int64_t idx = threadIdx.x; idx < cl * Dv; idx += blockDim.x) {
        const int64_t j = idx / Dv, e = idx % Dv;
        T acc = 0;
        if (st[c0 + j] == open_run)
          for (int64_t r = 0; r < m; ++r) acc += psi[(c0 + j) * m + r] * S[r * Dv + e];
        for (int64_t i = 0; i < cl; ++i) acc += A[i * c + j] * dnum[(c0 + i) * Dv + e];
        dv[(c0 + j) * Dv + e] += acc;
      }
      __syncthreads();
      const bool reset = open_run >= c0;
      for (int64_t idx = threadIdx.x; idx < m * Dv; idx += blockDim.x) {
        const int64_t r = idx / Dv, e = idx % Dv;
        T acc = reset ? T(0) : S[idx];
        for (int64_t i = 0; i < cl; ++i)
          if (st[c0 + i] < c0) acc += phi[(c0 + i) * m + r] * dnum[(c0 + i) * Dv + e];
        S[idx] = acc;
      }
      for (int64_t r = threadIdx.x; r < m; r += blockDim.x) {
        T acc = reset ? T(0) : z[r];
        for (int64_t i = 0; i < cl; ++i)
          if (st[c0 + i] < c0) acc += phi[(c0 + i) * m + r] * dden[c0 + i];
        z[r] = acc;
      }
      __syncthreads();
    }
  }
}

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

Dims dims_of(const Geometry& g) {
  return {g.Hq,     g.Hkv,         g.G, g.Nq,
          g.Nk,     g.Dv,          g.m, std::max<int64_t>(1, std::min(g.chunk, std::max<int64_t>(g.Nk, 1))),
          g.causal, g.chunk_key_hi};
}

struct Inputs {
  Tensor q, k, v, start, valid, phi, psi;
};

// Contiguous inputs, the host arrays on the device and the features of q and k.
Inputs prepare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const std::vector<int64_t>& start,
               const std::vector<uint8_t>& valid, const Geometry& g) {
  Inputs in{q.contiguous(), k.contiguous(), v.contiguous(), Tensor(), Tensor(), Tensor(), Tensor()};
  in.start = from_vector_i64(start, {static_cast<int64_t>(start.size())}).to(Device::cuda);
  if (!valid.empty()) {
    Tensor vb = Tensor::empty({static_cast<int64_t>(valid.size())}, DType::boolean);
    for (size_t e = 0; e < valid.size(); ++e) vb.data<bool>()[e] = valid[e] != 0;
    in.valid = vb.to(Device::cuda);
  }
  in.phi = Tensor::empty({g.B, g.Hq, g.Nq, g.m}, g.dtype, Device::cuda);
  in.psi = Tensor::empty({g.B, g.Hkv, g.Nk, g.m}, g.dtype, Device::cuda);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const int64_t qrows = g.B * g.Hq * g.Nq, krows = g.B * g.Hkv * g.Nk;
    const uint8_t* vp = in.valid.defined() ? static_cast<const uint8_t*>(in.valid.raw_data()) : nullptr;
    if (qrows > 0)
      features_kernel<T><<<blocks_for(qrows * g.m), kThreads>>>(ptr<T>(in.q), qrows, g.Nq, g.Hq, g.D, g.m, g.feature,
                                                                static_cast<T>(g.rs), ptr<T>(W), nullptr,
                                                                ptr<T>(in.phi));
    if (krows > 0)
      features_kernel<T><<<blocks_for(krows * g.m), kThreads>>>(ptr<T>(in.k), krows, g.Nk, g.Hkv, g.D, g.m, g.feature,
                                                                static_cast<T>(g.rs), ptr<T>(W), vp, ptr<T>(in.psi));
  };
  if (g.dtype == DType::f32) run(float{});
  else run(double{});
  QKV_CUDA_LAUNCHED("features_kernel");
  return in;
}

}  // namespace

Forward forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const std::vector<int64_t>& start,
                const std::vector<uint8_t>& valid, const Geometry& g) {
  Forward f{Tensor::empty({g.B, g.Hq, g.Nq, g.Dv}, g.dtype, Device::cuda),
            Tensor::empty({g.B, g.Hq, g.Nq}, g.dtype, Device::cuda)};
  if (g.B * g.Hq * g.Nq == 0) return f;
  const Inputs in = prepare(q, k, v, W, start, valid, g);
  const Dims d = dims_of(g);
  Tensor ws = Tensor::empty({g.B * g.Hq, g.m * g.Dv + g.m + d.c * d.c}, g.dtype, Device::cuda);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    forward_kernel<T><<<static_cast<int>(g.B * g.Hq), kThreads>>>(ptr<T>(in.phi), ptr<T>(in.psi), ptr<T>(in.v),
                                                                  ptr<int64_t>(in.start), ptr<T>(f.out), ptr<T>(f.den),
                                                                  ptr<T>(ws), d, static_cast<T>(g.eps));
  };
  if (g.dtype == DType::f32) run(float{});
  else run(double{});
  QKV_CUDA_LAUNCHED("forward_kernel");
  return f;
}

std::vector<Tensor> backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& den, const Tensor& W, const std::vector<int64_t>& start,
                             const std::vector<uint8_t>& valid, const Geometry& g) {
  Tensor dq = zeros({g.B, g.Hq, g.Nq, g.D}, g.dtype, Device::cuda),
         dk = zeros({g.B, g.Hkv, g.Nk, g.D}, g.dtype, Device::cuda),
         dv = zeros({g.B, g.Hkv, g.Nk, g.Dv}, g.dtype, Device::cuda);
  if (g.B * g.Hq * g.Nq == 0 || g.Nk == 0) return {dq, dk, dv};
  const Inputs in = prepare(q, k, v, W, start, valid, g);
  const Dims d = dims_of(g);
  const Tensor dO = dout.contiguous(), o = out.contiguous();
  const int64_t qrows = g.B * g.Hq * g.Nq, krows = g.B * g.Hkv * g.Nk;
  Tensor dnum = Tensor::empty({qrows, g.Dv}, g.dtype, Device::cuda),
         dden = Tensor::empty({qrows}, g.dtype, Device::cuda);
  Tensor dphi = Tensor::empty({qrows, g.m}, g.dtype, Device::cuda),
         dpsi = Tensor::empty({krows, g.m}, g.dtype, Device::cuda);
  Tensor ws = Tensor::empty({g.B * g.Hkv, g.m * g.Dv + g.m + 2 * d.c * d.c}, g.dtype, Device::cuda);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T rs = static_cast<T>(g.rs);
    const uint8_t* vp = in.valid.defined() ? static_cast<const uint8_t*>(in.valid.raw_data()) : nullptr;
    dnum_kernel<T>
        <<<blocks_for(qrows), kThreads>>>(ptr<T>(dO), ptr<T>(o), ptr<T>(den), qrows, g.Dv, ptr<T>(dnum), ptr<T>(dden));
    backward_kernel<T><<<static_cast<int>(g.B * g.Hkv), kThreads>>>(
        ptr<T>(in.phi), ptr<T>(in.psi), ptr<T>(in.v), ptr<T>(dnum), ptr<T>(dden), ptr<int64_t>(in.start), ptr<T>(dphi),
        ptr<T>(dpsi), ptr<T>(dv), ptr<T>(ws), d);
    features_backward_kernel<T><<<blocks_for(qrows), kThreads>>>(ptr<T>(in.q), ptr<T>(in.phi), ptr<T>(dphi), qrows,
                                                                 g.Nq, g.Hq, g.D, g.m, g.feature, rs, ptr<T>(W),
                                                                 nullptr, ptr<T>(dq));
    features_backward_kernel<T><<<blocks_for(krows), kThreads>>>(ptr<T>(in.k), ptr<T>(in.psi), ptr<T>(dpsi), krows,
                                                                 g.Nk, g.Hkv, g.D, g.m, g.feature, rs, ptr<T>(W), vp,
                                                                 ptr<T>(dk));
  };
  if (g.dtype == DType::f32) run(float{});
  else run(double{});
  QKV_CUDA_LAUNCHED("backward_kernel");
  return {dq, dk, dv};
}

}  // namespace qkv::attn::cuda_linear
