// Linear attention, CPU: the fused forward, the hand-written backward (one autograd node), the
// recurrent decode state and the feature maps. Formulas: attention/linear/linear_attention.h.
//
// Work split: one task per (b, kv head); inside it each of the G query heads of the group sweeps
// the chunks with its own running state (S [m, Dv], z [m]). Per task the buffers are O(N·(D + m))
// (the scaled inputs and their features), so memory is linear in N; nothing N × N exists.
#include "attention/linear/linear_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "attention/cpu/fused.h"
#include "attention/cpu/tile_math.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#ifdef QKV_WITH_CUDA
#include "attention/linear/linear_cuda.h"
#endif

namespace qkv::attn {

const char* linear_feature_name(LinearFeature f) {
  switch (f) {
    case LinearFeature::elu1:
      return "elu1";
    case LinearFeature::relu:
      return "relu";
    case LinearFeature::favor:
      return "favor";
  }
  return "?";
}

LinearFeature parse_linear_feature(const std::string& name, const std::string& key) {
  if (name == "elu1") return LinearFeature::elu1;
  if (name == "relu") return LinearFeature::relu;
  if (name == "favor") return LinearFeature::favor;
  throw Error(cat(key, " must be one of elu1, relu, favor, got '", name, "'"));
}

int64_t linear_feature_dim(const LinearAttentionOptions& o, int64_t D) {
  if (o.feature != LinearFeature::favor) return D;
  QKV_CHECK(o.projection.defined() && o.projection.dim() == 2 && o.projection.size(1) == D,
            "[linear_attention] favor needs projection W [m, D] with D = ", D, ", got ",
            o.projection.defined() ? shape_str(o.projection.shape()) : std::string("undefined"));
  return o.projection.size(0);
}

Tensor favor_projection(int64_t m, int64_t D, uint64_t seed, uint64_t offset) {
  QKV_CHECK(m > 0 && D > 0, "[linear_attention] favor projection needs m > 0 and D > 0, got m=", m, ", D=", D);
  return randn({m, D}, seed, offset, 0.0, 1.0, DType::f32);
}

Tensor favor_projection_for_layer(int64_t m, int64_t D, int64_t layer) {
  return favor_projection(m, D, kFavorSeed, static_cast<uint64_t>(layer) << 40);
}

namespace {

struct LinearProblem {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 1, Nq = 0, Nk = 0, D = 0, Dv = 0, m = 0;
  double rs = 1;  // √scale
  DType dtype = DType::f32;
};

LinearProblem check_linear(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& o) {
  auto shp = [](const Tensor& t) { return t.defined() ? shape_str(t.shape()) : std::string("undefined"); };
  QKV_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
            "[linear_attention] q, k, v must be [B,H,N,D], got q ", shp(q), ", k ", shp(k), ", v ", shp(v));
  LinearProblem p;
  p.B = q.size(0), p.Hq = q.size(1), p.Nq = q.size(2), p.D = q.size(3);
  p.Hkv = k.size(1), p.Nk = k.size(2), p.Dv = v.size(3);
  QKV_CHECK(k.size(0) == p.B && v.size(0) == p.B && k.size(3) == p.D && v.size(1) == p.Hkv && v.size(2) == p.Nk,
            "[linear_attention] shapes disagree: q ", shp(q), ", k ", shp(k), ", v ", shp(v));
  QKV_CHECK(p.Hkv > 0 && p.Hq % p.Hkv == 0, "[linear_attention] query heads ", p.Hq, " must be a multiple of kv heads ",
            p.Hkv);
  p.G = p.Hq / p.Hkv;
  QKV_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::f32 || q.dtype() == DType::f64),
            "[linear_attention] q, k, v must share dtype float32 or float64");
  QKV_CHECK(q.device() == k.device() && q.device() == v.device(), "[linear_attention] q, k, v must share a device");
  QKV_CHECK(!o.causal || p.Nq == p.Nk, "[linear_attention] causal linear attention needs Nq == Nk (got Nq=", p.Nq,
            ", Nk=", p.Nk, "); continue a sequence with LinearState");
  QKV_CHECK(o.chunk >= 1, "[linear_attention] chunk must be >= 1, got ", o.chunk);
  QKV_CHECK(o.eps > 0 && std::isfinite(o.eps), "[linear_attention] eps must be a finite number > 0, got ", o.eps);
  QKV_CHECK(o.scale >= 0 && std::isfinite(o.scale), "[linear_attention] scale must be >= 0 (0 = 1/sqrt(D)), got ",
            o.scale);
  if (o.segment_ids.defined()) {
    QKV_CHECK(o.causal, "[linear_attention] segment_ids need causal linear attention");
    QKV_CHECK(is_integral(o.segment_ids.dtype()) && o.segment_ids.shape() == (Shape{p.B, p.Nk}),
              "[linear_attention] segment_ids must be int [B, Nk] = [", p.B, ", ", p.Nk, "], got ", shp(o.segment_ids));
  }
  if (o.key_padding.defined())
    QKV_CHECK(o.key_padding.dtype() == DType::boolean && o.key_padding.shape() == (Shape{p.B, p.Nk}),
              "[linear_attention] key_padding must be bool [B, Nk] = [", p.B, ", ", p.Nk, "], got ",
              shp(o.key_padding));
  p.m = linear_feature_dim(o, p.D);
  p.rs = std::sqrt(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.D)));
  p.dtype = q.dtype();
  return p;
}

// ---- Feature maps on n rows ----

// xt[i] = rs·x[i] (x rows at stride xs), F[i] = φ(xt[i]) [n, m]; rows with valid[i] == 0 get F = 0.
template <class T>
void features(const T* x, int64_t xs, int64_t n, const LinearProblem& p, LinearFeature f, const T* W,
              const uint8_t* valid, T* xt, T* F) {
  const int64_t D = p.D, m = p.m;
  const T rs = static_cast<T>(p.rs);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d) xt[i * D + d] = rs * x[i * xs + d];
  if (f == LinearFeature::favor) {
    tile::gemm(false, true, n, m, D, T(1), xt, D, W, D, T(0), F, m);  // U = X~·Wᵀ
    const T inv = T(1) / std::sqrt(static_cast<T>(m));
    for (int64_t i = 0; i < n; ++i) {
      T sq = 0;
      for (int64_t d = 0; d < D; ++d) sq += xt[i * D + d] * xt[i * D + d];
      for (int64_t r = 0; r < m; ++r) F[i * m + r] = std::exp(F[i * m + r] - sq / 2) * inv;
    }
  } else {
    for (int64_t e = 0; e < n * D; ++e) {
      const T t = xt[e];
      F[e] = f == LinearFeature::relu ? (t > 0 ? t : T(0)) : (t > 0 ? t + 1 : std::exp(t));
    }
  }
  if (valid)
    for (int64_t i = 0; i < n; ++i)
      if (!valid[i]) std::fill_n(F + i * m, m, T(0));
}

// dx[i] (at stride dxs) = rs·vjp_φ(xt[i], dF[i]) (0 where valid[i] == 0). F are φ's outputs; dF is
// overwritten (scratch).
template <class T>
void features_backward(const T* xt, const T* F, T* dF, int64_t n, const LinearProblem& p, LinearFeature f, const T* W,
                       const uint8_t* valid, T* dx, int64_t dxs) {
  const int64_t D = p.D, m = p.m;
  const T rs = static_cast<T>(p.rs);
  if (f == LinearFeature::favor) {
    // dx~ = Wᵀ(dF∘F) − x~·Σ_r dF_r F_r
    for (int64_t e = 0; e < n * m; ++e) dF[e] *= F[e];
    for (int64_t i = 0; i < n; ++i) {
      T sum = 0;
      for (int64_t r = 0; r < m; ++r) sum += dF[i * m + r];
      for (int64_t d = 0; d < D; ++d) dx[i * dxs + d] = -rs * sum * xt[i * D + d];
    }
    tile::gemm(false, false, n, D, m, rs, dF, m, W, D, T(1), dx, dxs);
  } else {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const T t = xt[i * D + d], g = dF[i * D + d];
        const T dphi = t > 0 ? T(1) : (f == LinearFeature::relu ? T(0) : std::exp(t));
        dx[i * dxs + d] = rs * g * dphi;
      }
  }
  if (valid)
    for (int64_t i = 0; i < n; ++i)
      if (!valid[i]) std::fill_n(dx + i * dxs, D, T(0));
}

// A [cl, cl] (ld c) for chunk [c0, c0 + cl) masked to the in-chunk rule j - i < hi (hi = 1: the
// causal lower triangle) within one segment run (st[i] == st[j]).
template <class T>
void causal_mask(T* A, int64_t cl, int64_t ld, int64_t c0, const int64_t* st, int64_t hi) {
  for (int64_t i = 0; i < cl; ++i)
    for (int64_t j = 0; j < cl; ++j)
      if (j - i >= hi || st[c0 + i] != st[c0 + j]) A[i * ld + j] = T(0);
}

// dst[i] = src[i] for the rows i of [0, cl) where keep(i), else 0 (rows of width w).
template <class T, class F>
void masked_rows(const T* src, T* dst, int64_t cl, int64_t w, const F& keep) {
  for (int64_t i = 0; i < cl; ++i) {
    if (keep(i)) std::copy_n(src + i * w, w, dst + i * w);
    else std::fill_n(dst + i * w, w, T(0));
  }
}

template <class T>
struct Io {
  const T *q, *k, *v;
  int64_t q_sb, q_sh, q_sn, k_sb, k_sh, k_sn, v_sb, v_sh, v_sn;
  const T* W;            // favor: [m, D] in T
  const uint8_t* valid;  // [B, Nk] or nullptr
  const int64_t* start;  // [B, Nk]: first position of the segment run holding each position (0s without segments)
};

template <class T>
Io<T> make_io(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const std::vector<uint8_t>& valid,
              const std::vector<int64_t>& start) {
  return {q.data<T>(),
          k.data<T>(),
          v.data<T>(),
          q.stride(0),
          q.stride(1),
          q.stride(2),
          k.stride(0),
          k.stride(1),
          k.stride(2),
          v.stride(0),
          v.stride(1),
          v.stride(2),
          W.defined() ? W.data<T>() : nullptr,
          valid.empty() ? nullptr : valid.data(),
          start.data()};
}

std::vector<uint8_t> valid_bytes(const LinearAttentionOptions& o) {
  if (!o.key_padding.defined()) return {};
  const Tensor kp = o.key_padding.to(Device::cpu).contiguous();
  std::vector<uint8_t> out(static_cast<size_t>(kp.numel()));
  for (int64_t e = 0; e < kp.numel(); ++e) out[e] = kp.data<bool>()[e] ? 1 : 0;
  return out;
}

// Run starts from segment_ids (checked: [B, Nk] integers, causal only, each segment one run).
std::vector<int64_t> run_starts(const LinearAttentionOptions& o, const LinearProblem& p) {
  std::vector<int64_t> st(static_cast<size_t>(p.B * p.Nk), 0);
  if (!o.segment_ids.defined()) return st;
  const std::vector<double> seg = o.segment_ids.to_vector();
  for (int64_t b = 0; b < p.B; ++b) {
    std::vector<double> seen;
    for (int64_t j = 0; j < p.Nk; ++j) {
      const double s = seg[b * p.Nk + j];
      if (j > 0 && s == seg[b * p.Nk + j - 1]) {
        st[b * p.Nk + j] = st[b * p.Nk + j - 1];
        continue;
      }
      QKV_CHECK(std::find(seen.begin(), seen.end(), s) == seen.end(), "[linear_attention] segment_ids row ", b,
                " returns to segment ", s, " at position ", j,
                ": linear attention needs each segment to be one contiguous run (packed documents)");
      seen.push_back(s);
      st[b * p.Nk + j] = j;
    }
  }
  return st;
}

int threads_for(const LinearProblem& p, int64_t tasks) {
  const double flops = 4.0 * p.B * p.Hq * p.Nq * p.m * (p.Dv + p.D + 64);
  return omp_in_parallel() ? 1 : worth_threads(flops, tasks, omp_get_max_threads());
}

// The chunk size a call uses (c ≥ 1, at most Nk).
int64_t chunk_of(const LinearAttentionOptions& o, int64_t Nk) {
  return std::max<int64_t>(1, std::min(o.chunk, std::max<int64_t>(Nk, 1)));
}

// The prefix state after chunk [c0, c0 + cl): S += Ψ_Cᵀ·V_C (z likewise) when no segment run starts
// inside the chunk, else S = the sum over the keys from the last run start on.
template <class T>
void advance_state(T* S, T* z, const T* psi, const T* vh, int64_t v_sn, int64_t c0, int64_t cl, int64_t m, int64_t Dv,
                   const int64_t* st) {
  int64_t from = c0;
  const int64_t last_start = st[c0 + cl - 1];  // the run open at the chunk's end began at last_start
  if (last_start >= c0) {
    from = last_start;  // ... inside the chunk: the state restarts there
    std::fill_n(S, m * Dv, T(0));
    std::fill_n(z, m, T(0));
  }
  const int64_t n = c0 + cl - from;
  tile::gemm(true, false, m, Dv, n, T(1), psi + from * m, m, vh + from * v_sn, v_sn, T(1), S, Dv);
  for (int64_t j = from; j < c0 + cl; ++j)
    for (int64_t r = 0; r < m; ++r) z[r] += psi[j * m + r];
}

// Per-thread scratch, carved from one allocator tensor (so the allocator's peak counts it).
template <class T>
struct Buf {
  T* p;
  int64_t n;
  T* data() const { return p; }
  T* begin() const { return p; }
  T* end() const { return p + n; }
  T& operator[](int64_t i) const { return p[i]; }
};
template <class T>
struct Carver {
  T* p;
  Buf<T> take(int64_t n) {
    Buf<T> b{p, n};
    p += n;
    return b;
  }
};

// ---- Forward ----

template <class T>
void run_forward(const Io<T>& io, const LinearProblem& p, const LinearAttentionOptions& o, T* out, T* den) {
  const int64_t tasks = p.B * p.Hkv, D = p.D, Dv = p.Dv, m = p.m, Nq = p.Nq, Nk = p.Nk;
  const int64_t c = chunk_of(o, Nk);
  const T eps = static_cast<T>(o.eps);
  const int nthreads = threads_for(p, tasks);
  const int64_t per = Nk * (D + m) + Nq * (D + m) + m * Dv + m + c * c + c * Dv;
  Tensor scratch = Tensor::empty({nthreads, per}, p.dtype);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t b = t / p.Hkv, hk = t % p.Hkv;
    Carver<T> cv{scratch.data<T>() + omp_get_thread_num() * per};
    const Buf<T> kt = cv.take(Nk * D), psi = cv.take(Nk * m), qt = cv.take(Nq * D), phi = cv.take(Nq * m),
                 S = cv.take(m * Dv), z = cv.take(m), A = cv.take(c * c), pre = cv.take(c * Dv);
    const T* vh = io.v + b * io.v_sb + hk * io.v_sh;
    const int64_t* st = io.start + b * Nk;
    features<T>(io.k + b * io.k_sb + hk * io.k_sh, io.k_sn, Nk, p, o.feature, io.W,
                io.valid ? io.valid + b * Nk : nullptr, kt.data(), psi.data());
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t h = hk * p.G + g;
      features<T>(io.q + b * io.q_sb + h * io.q_sh, io.q_sn, Nq, p, o.feature, io.W, nullptr, qt.data(), phi.data());
      T* ob = out + (b * p.Hq + h) * Nq * Dv;
      T* db = den + (b * p.Hq + h) * Nq;
      if (!o.causal) {
        // S = Ψᵀ·V, z = Ψᵀ·1; O = Φ·S / (Φ·z + ε)
        tile::gemm(true, false, m, Dv, Nk, T(1), psi.data(), m, vh, io.v_sn, T(0), S.data(), Dv);
        std::fill(z.begin(), z.end(), T(0));
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t r = 0; r < m; ++r) z[r] += psi[j * m + r];
        tile::gemm(false, false, Nq, Dv, m, T(1), phi.data(), m, S.data(), Dv, T(0), ob, Dv);
        for (int64_t i = 0; i < Nq; ++i) {
          T d = eps;
          for (int64_t r = 0; r < m; ++r) d += phi[i * m + r] * z[r];
          db[i] = d;
          tile::scale_row(ob + i * Dv, Dv, T(1) / d);
        }
        continue;
      }
      std::fill(S.begin(), S.end(), T(0));
      std::fill(z.begin(), z.end(), T(0));
      for (int64_t c0 = 0; c0 < Nk; c0 += c) {
        const int64_t cl = std::min(c, Nk - c0);
        const T *ph = phi.data() + c0 * m, *ps = psi.data() + c0 * m, *vc = vh + c0 * io.v_sn;
        T* oc = ob + c0 * Dv;
        // A = Φ_C·Ψ_Cᵀ (masked); num = A·V_C + Φ_C·S⁻; den = rowsum A + Φ_C·z⁻ + ε, the prefix
        // terms only for rows whose segment run began before the chunk
        tile::gemm(false, true, cl, cl, m, T(1), ph, m, ps, m, T(0), A.data(), c);
        causal_mask(A.data(), cl, c, c0, st, o.chunk_key_hi);
        tile::gemm(false, false, cl, Dv, cl, T(1), A.data(), c, vc, io.v_sn, T(0), oc, Dv);
        tile::gemm(false, false, cl, Dv, m, T(1), ph, m, S.data(), Dv, T(0), pre.data(), Dv);
        for (int64_t i = 0; i < cl; ++i) {
          const bool prefix = st[c0 + i] < c0;
          T d = eps;
          for (int64_t j = 0; j < cl; ++j) d += A[i * c + j];
          if (prefix) {
            for (int64_t r = 0; r < m; ++r) d += ph[i * m + r] * z[r];
            for (int64_t e = 0; e < Dv; ++e) oc[i * Dv + e] += pre[i * Dv + e];
          }
          db[c0 + i] = d;
          tile::scale_row(oc + i * Dv, Dv, T(1) / d);
        }
        advance_state(S.data(), z.data(), psi.data(), vh, io.v_sn, c0, cl, m, Dv, st);
      }
    }
  }
}

// ---- Backward ----

template <class T>
void run_backward(const Io<T>& io, const LinearProblem& p, const LinearAttentionOptions& o, const T* dout, const T* out,
                  const T* den, T* dq, T* dk, T* dv) {
  const int64_t tasks = p.B * p.Hkv, D = p.D, Dv = p.Dv, m = p.m, Nq = p.Nq, Nk = p.Nk;
  const int64_t c = chunk_of(o, Nk);
  const int nthreads = threads_for(p, tasks);
  const int64_t per =
      Nk * (D + 2 * m) + Nq * (D + 2 * m + Dv + 1) + m * Dv + m + 2 * c * c + c * std::max(m, Dv) + c * Dv;
  Tensor scratch = Tensor::empty({nthreads, per}, p.dtype);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t b = t / p.Hkv, hk = t % p.Hkv;
    Carver<T> cv{scratch.data<T>() + omp_get_thread_num() * per};
    const Buf<T> kt = cv.take(Nk * D), psi = cv.take(Nk * m), dpsi = cv.take(Nk * m), qt = cv.take(Nq * D),
                 phi = cv.take(Nq * m), dphi = cv.take(Nq * m), dnum = cv.take(Nq * Dv), dden = cv.take(Nq),
                 S = cv.take(m * Dv), z = cv.take(m), A = cv.take(c * c), dA = cv.take(c * c),
                 tm = cv.take(c * std::max(m, Dv)), tv = cv.take(c * Dv);
    std::fill(dpsi.begin(), dpsi.end(), T(0));
    const T* vh = io.v + b * io.v_sb + hk * io.v_sh;
    const uint8_t* valid = io.valid ? io.valid + b * Nk : nullptr;
    const int64_t* st = io.start + b * Nk;
    T* dvh = dv + (b * p.Hkv + hk) * Nk * Dv;
    std::fill_n(dvh, Nk * Dv, T(0));
    features<T>(io.k + b * io.k_sb + hk * io.k_sh, io.k_sn, Nk, p, o.feature, io.W, valid, kt.data(), psi.data());
    for (int64_t g = 0; g < p.G; ++g) {
      const int64_t h = hk * p.G + g;
      features<T>(io.q + b * io.q_sb + h * io.q_sh, io.q_sn, Nq, p, o.feature, io.W, nullptr, qt.data(), phi.data());
      const T* dob = dout + (b * p.Hq + h) * Nq * Dv;
      const T* ob = out + (b * p.Hq + h) * Nq * Dv;
      const T* db = den + (b * p.Hq + h) * Nq;
      // dnum = dO / den, dden = −(dO·O) / den
      for (int64_t i = 0; i < Nq; ++i) {
        const T inv = T(1) / db[i];
        T dot = 0;
        for (int64_t e = 0; e < Dv; ++e) {
          dnum[i * Dv + e] = dob[i * Dv + e] * inv;
          dot += dob[i * Dv + e] * ob[i * Dv + e];
        }
        dden[i] = -dot * inv;
      }
      if (!o.causal) {
        tile::gemm(true, false, m, Dv, Nk, T(1), psi.data(), m, vh, io.v_sn, T(0), S.data(), Dv);
        std::fill(z.begin(), z.end(), T(0));
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t r = 0; r < m; ++r) z[r] += psi[j * m + r];
        // dΦ = dnum·Sᵀ + dden·zᵀ
        tile::gemm(false, true, Nq, m, Dv, T(1), dnum.data(), Dv, S.data(), Dv, T(0), dphi.data(), m);
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t r = 0; r < m; ++r) dphi[i * m + r] += dden[i] * z[r];
        // R = Φᵀ·dnum (reuses S), r = Φᵀ·dden (reuses z); dΨ += V·Rᵀ + 1·rᵀ, dV += Ψ·R
        tile::gemm(true, false, m, Dv, Nq, T(1), phi.data(), m, dnum.data(), Dv, T(0), S.data(), Dv);
        std::fill(z.begin(), z.end(), T(0));
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t r = 0; r < m; ++r) z[r] += phi[i * m + r] * dden[i];
        tile::gemm(false, true, Nk, m, Dv, T(1), vh, io.v_sn, S.data(), Dv, T(1), dpsi.data(), m);
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t r = 0; r < m; ++r) dpsi[j * m + r] += z[r];
        tile::gemm(false, false, Nk, Dv, m, T(1), psi.data(), m, S.data(), Dv, T(1), dvh, Dv);
      } else {
        // Chunk C's A and dA = dnum_C·V_Cᵀ + dden_C·1ᵀ, both masked.
        auto chunk_mats = [&](int64_t c0, int64_t cl) {
          const T *ph = phi.data() + c0 * m, *ps = psi.data() + c0 * m, *vc = vh + c0 * io.v_sn;
          tile::gemm(false, true, cl, cl, m, T(1), ph, m, ps, m, T(0), A.data(), c);
          tile::gemm(false, true, cl, cl, Dv, T(1), dnum.data() + c0 * Dv, Dv, vc, io.v_sn, T(0), dA.data(), c);
          for (int64_t i = 0; i < cl; ++i)
            for (int64_t j = 0; j < cl; ++j) dA[i * c + j] += dden[c0 + i];
          causal_mask(A.data(), cl, c, c0, st, o.chunk_key_hi);
          causal_mask(dA.data(), cl, c, c0, st, o.chunk_key_hi);
        };
        // Forward sweep: dΦ_C = [prefix rows] (dnum_C·S⁻ᵀ + dden_C·z⁻ᵀ) + dA·Ψ_C
        std::fill(S.begin(), S.end(), T(0));
        std::fill(z.begin(), z.end(), T(0));
        for (int64_t c0 = 0; c0 < Nk; c0 += c) {
          const int64_t cl = std::min(c, Nk - c0);
          T* dph = dphi.data() + c0 * m;
          chunk_mats(c0, cl);
          auto prefix = [&](int64_t i) { return st[c0 + i] < c0; };
          masked_rows(dnum.data() + c0 * Dv, tv.data(), cl, Dv, prefix);
          tile::gemm(false, true, cl, m, Dv, T(1), tv.data(), Dv, S.data(), Dv, T(0), dph, m);
          for (int64_t i = 0; i < cl; ++i)
            if (prefix(i))
              for (int64_t r = 0; r < m; ++r) dph[i * m + r] += dden[c0 + i] * z[r];
          tile::gemm(false, false, cl, m, cl, T(1), dA.data(), c, psi.data() + c0 * m, m, T(1), dph, m);
          advance_state(S.data(), z.data(), psi.data(), vh, io.v_sn, c0, cl, m, Dv, st);
        }
        // Reverse sweep with the suffix state R⁺ (in S), r⁺ (in z) of the later queries in the run
        // open at the chunk's end: for keys j of that run
        //   dΨ_j += R⁺·v_j + r⁺      dV_j += R⁺ᵀ·Ψ_j
        // and for all: dΨ_C += dAᵀ·Φ_C, dV_C += Aᵀ·dnum_C.
        std::fill(S.begin(), S.end(), T(0));
        std::fill(z.begin(), z.end(), T(0));
        const int64_t last = ((Nk - 1) / c) * c;
        for (int64_t c0 = last; c0 >= 0; c0 -= c) {
          const int64_t cl = std::min(c, Nk - c0);
          const T *ph = phi.data() + c0 * m, *ps = psi.data() + c0 * m, *vc = vh + c0 * io.v_sn;
          T* dps = dpsi.data() + c0 * m;
          T* dvc = dvh + c0 * Dv;
          chunk_mats(c0, cl);
          const int64_t open_run = st[c0 + cl - 1];
          tile::gemm(false, true, cl, m, Dv, T(1), vc, io.v_sn, S.data(), Dv, T(0), tm.data(), m);
          for (int64_t j = 0; j < cl; ++j)
            if (st[c0 + j] == open_run)
              for (int64_t r = 0; r < m; ++r) dps[j * m + r] += tm[j * m + r] + z[r];
          tile::gemm(false, false, cl, Dv, m, T(1), ps, m, S.data(), Dv, T(0), tm.data(), Dv);
          for (int64_t j = 0; j < cl; ++j)
            if (st[c0 + j] == open_run)
              for (int64_t e = 0; e < Dv; ++e) dvc[j * Dv + e] += tm[j * Dv + e];
          tile::gemm(true, false, cl, m, cl, T(1), dA.data(), c, ph, m, T(1), dps, m);
          tile::gemm(true, false, cl, Dv, cl, T(1), A.data(), c, dnum.data() + c0 * Dv, Dv, T(1), dvc, Dv);
          // R⁺ for the run open at c0: the queries of C that read the prefix, plus the old R⁺ when
          // that run continues through the whole chunk.
          if (open_run >= c0) {
            std::fill(S.begin(), S.end(), T(0));
            std::fill(z.begin(), z.end(), T(0));
          }
          auto prefix = [&](int64_t i) { return st[c0 + i] < c0; };
          masked_rows(dnum.data() + c0 * Dv, tv.data(), cl, Dv, prefix);
          tile::gemm(true, false, m, Dv, cl, T(1), ph, m, tv.data(), Dv, T(1), S.data(), Dv);
          for (int64_t i = 0; i < cl; ++i)
            if (prefix(i))
              for (int64_t r = 0; r < m; ++r) z[r] += ph[i * m + r] * dden[c0 + i];
        }
      }
      features_backward<T>(qt.data(), phi.data(), dphi.data(), Nq, p, o.feature, io.W, nullptr,
                           dq + (b * p.Hq + h) * Nq * D, D);
    }
    features_backward<T>(kt.data(), psi.data(), dpsi.data(), Nk, p, o.feature, io.W, valid,
                         dk + (b * p.Hkv + hk) * Nk * D, D);
  }
}

struct LinearForward {
  Tensor out, den;
};

Tensor projection_as(const LinearAttentionOptions& o, DType dtype) {
  if (o.feature != LinearFeature::favor) return Tensor();
  return o.projection.to(Device::cpu).to(dtype).contiguous();
}

LinearForward cpu_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const LinearProblem& p,
                          const LinearAttentionOptions& o) {
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const Tensor W = projection_as(o, p.dtype);
  const std::vector<uint8_t> valid = valid_bytes(o);
  const std::vector<int64_t> start = run_starts(o, p);
  LinearForward f{Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.dtype), Tensor::empty({p.B, p.Hq, p.Nq}, p.dtype)};
  if (p.B * p.Hq * p.Nq == 0) return f;
  if (p.dtype == DType::f32)
    run_forward<float>(make_io<float>(q, k, v, W, valid, start), p, o, f.out.data<float>(), f.den.data<float>());
  else run_forward<double>(make_io<double>(q, k, v, W, valid, start), p, o, f.out.data<double>(), f.den.data<double>());
  return f;
}

std::vector<Tensor> cpu_backward(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                 const Tensor& out, const Tensor& den, const LinearProblem& p,
                                 const LinearAttentionOptions& o) {
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const Tensor dout = dout_in.contiguous();
  const Tensor W = projection_as(o, p.dtype);
  const std::vector<uint8_t> valid = valid_bytes(o);
  const std::vector<int64_t> start = run_starts(o, p);
  Tensor dq = zeros({p.B, p.Hq, p.Nq, p.D}, p.dtype), dk = zeros({p.B, p.Hkv, p.Nk, p.D}, p.dtype),
         dv = zeros({p.B, p.Hkv, p.Nk, p.Dv}, p.dtype);
  if (p.B * p.Hq * p.Nq == 0 || p.Nk == 0) return {dq, dk, dv};
  if (p.dtype == DType::f32)
    run_backward<float>(make_io<float>(q, k, v, W, valid, start), p, o, dout.data<float>(), out.data<float>(),
                        den.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>());
  else
    run_backward<double>(make_io<double>(q, k, v, W, valid, start), p, o, dout.data<double>(), out.data<double>(),
                         den.data<double>(), dq.data<double>(), dk.data<double>(), dv.data<double>());
  return {dq, dk, dv};
}

#ifdef QKV_WITH_CUDA
cuda_linear::Geometry geometry(const LinearProblem& p, const LinearAttentionOptions& o) {
  cuda_linear::Geometry g;
  g.B = p.B, g.Hq = p.Hq, g.Hkv = p.Hkv, g.G = p.G, g.Nq = p.Nq, g.Nk = p.Nk, g.D = p.D, g.Dv = p.Dv, g.m = p.m;
  g.chunk = o.chunk;
  g.rs = p.rs;
  g.eps = o.eps;
  g.feature = static_cast<int>(o.feature);
  g.causal = o.causal;
  g.chunk_key_hi = o.chunk_key_hi;
  g.dtype = p.dtype;
  return g;
}
Tensor device_projection(const LinearAttentionOptions& o, DType dtype) {
  if (o.feature != LinearFeature::favor) return Tensor();
  return o.projection.to(dtype).to(Device::cuda).contiguous();
}
#endif

// The hand-written vjp of linear_attention.h by the kernels that ran the forward.
struct LinearAttentionBackward : autograd::Node {
  LinearProblem p;
  LinearAttentionOptions o;
  Tensor q, k, v, out, den;  // detached
  bool cuda = false;
  const char* name() const override { return cuda ? "CudaLinearAttentionBackward" : "LinearAttentionBackward"; }
  std::vector<Tensor> backward(const Tensor& dout) override {
#ifdef QKV_WITH_CUDA
    if (cuda)
      return cuda_linear::backward(dout, q, k, v, out, den, device_projection(o, p.dtype), run_starts(o, p),
                                   valid_bytes(o), geometry(p, o));
#endif
    return cpu_backward(dout, q, k, v, out, den, p, o);
  }
  void release() override {
    q = k = v = out = den = Tensor();
    o = LinearAttentionOptions();
  }
};

}  // namespace

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& opts) {
  const LinearProblem p = check_linear(q, k, v, opts);
  LinearForward f;
  bool cuda = false;
#ifdef QKV_WITH_CUDA
  if (q.device() == Device::cuda) {
    if (p.Nk == 0) {  // no key: O = 0, den = ε
      f.out = zeros({p.B, p.Hq, p.Nq, p.Dv}, p.dtype, Device::cuda);
      f.den = full({p.B, p.Hq, p.Nq}, opts.eps, p.dtype, Device::cuda);
    } else {
      cuda_linear::Forward r = cuda_linear::forward(q, k, v, device_projection(opts, p.dtype), run_starts(opts, p),
                                                    valid_bytes(opts), geometry(p, opts));
      f.out = r.out;
      f.den = r.den;
    }
    cuda = true;
  }
#endif
  if (!cuda) {
    QKV_CHECK(q.device() == Device::cpu, "[linear_attention] this build has no CUDA kernel for linear attention");
    f = cpu_forward(q, k, v, p, opts);
  }
  if (!autograd::any_requires_grad({&q, &k, &v})) return f.out;
  auto node = std::make_shared<LinearAttentionBackward>();
  node->p = p;
  node->o = opts;
  node->q = q.detach();
  node->k = k.detach();
  node->v = v.detach();
  node->out = f.out.detach();
  node->den = f.den;
  node->cuda = cuda;
  return autograd::record(f.out, node, {q, k, v});
}

// ---- The recurrent state ----

LinearState::LinearState(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim,
                         const LinearAttentionOptions& opts)
    : opts_(opts), B_(batch), Hq_(q_heads), Hkv_(kv_heads), D_(head_dim), Dv_(v_head_dim) {
  QKV_CHECK(batch > 0 && kv_heads > 0 && q_heads % kv_heads == 0 && head_dim > 0 && v_head_dim > 0,
            "[linear_state] invalid geometry: batch ", batch, ", q_heads ", q_heads, ", kv_heads ", kv_heads,
            ", head_dim ", head_dim, ", v_head_dim ", v_head_dim);
  m_ = linear_feature_dim(opts_, D_);
  if (opts_.feature == LinearFeature::favor) W_ = opts_.projection.to(Device::cpu).to(DType::f64).contiguous();
  opts_.key_padding = Tensor();
  S_.assign(static_cast<size_t>(B_ * Hkv_ * m_ * Dv_), 0.0);
  z_.assign(static_cast<size_t>(B_ * Hkv_ * m_), 0.0);
}

void LinearState::clear() {
  std::fill(S_.begin(), S_.end(), 0.0);
  std::fill(z_.begin(), z_.end(), 0.0);
  length_ = 0;
}

int64_t LinearState::state_bytes() const { return static_cast<int64_t>((S_.size() + z_.size()) * sizeof(double)); }

Tensor LinearState::step(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& key_padding) {
  QKV_CHECK(q_in.defined() && k_in.defined() && v_in.defined() && q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
            "[linear_state] q, k, v must be [B,H,n,D]");
  const int64_t n = q_in.size(2);
  const Shape wq{B_, Hq_, n, D_}, wk{B_, Hkv_, n, D_}, wv{B_, Hkv_, n, Dv_};
  QKV_CHECK(q_in.shape() == wq && k_in.shape() == wk && v_in.shape() == wv, "[linear_state] q ",
            shape_str(q_in.shape()), ", k ", shape_str(k_in.shape()), ", v ", shape_str(v_in.shape()),
            " but the state expects q ", shape_str(wq), ", k ", shape_str(wk), ", v ", shape_str(wv));
  if (key_padding.defined())
    QKV_CHECK(key_padding.dtype() == DType::boolean && key_padding.shape() == (Shape{B_, n}),
              "[linear_state] key_padding must be bool [B, n] = [", B_, ", ", n, "], got ",
              shape_str(key_padding.shape()));
  const Device dev = q_in.device();
  const DType dt = q_in.dtype();
  const Tensor q = q_in.to(Device::cpu).to(DType::f64).contiguous();
  const Tensor k = k_in.to(Device::cpu).to(DType::f64).contiguous();
  const Tensor v = v_in.to(Device::cpu).to(DType::f64).contiguous();
  const Tensor kp = key_padding.defined() ? key_padding.to(Device::cpu).contiguous() : Tensor();
  Tensor out = Tensor::empty({B_, Hq_, n, Dv_}, DType::f64);
  LinearProblem p;
  p.D = D_;
  p.m = m_;
  p.rs = std::sqrt(opts_.scale > 0 ? opts_.scale : 1.0 / std::sqrt(static_cast<double>(D_)));
  const double* W = W_.defined() ? W_.data<double>() : nullptr;
  const int64_t G = Hq_ / Hkv_;
  std::vector<double> xt(D_), kf(m_), qf(m_);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t hk = 0; hk < Hkv_; ++hk) {
      double* S = S_.data() + (b * Hkv_ + hk) * m_ * Dv_;
      double* z = z_.data() + (b * Hkv_ + hk) * m_;
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t valid = !kp.defined() || kp.data<bool>()[b * n + t];
        features<double>(k.data<double>() + ((b * Hkv_ + hk) * n + t) * D_, D_, 1, p, opts_.feature, W, &valid,
                         xt.data(), kf.data());
        const double* vt = v.data<double>() + ((b * Hkv_ + hk) * n + t) * Dv_;
        for (int64_t r = 0; r < m_; ++r) {
          z[r] += kf[r];
          for (int64_t e = 0; e < Dv_; ++e) S[r * Dv_ + e] += kf[r] * vt[e];
        }
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = hk * G + g;
          features<double>(q.data<double>() + ((b * Hq_ + h) * n + t) * D_, D_, 1, p, opts_.feature, W, nullptr,
                           xt.data(), qf.data());
          double den = opts_.eps;
          for (int64_t r = 0; r < m_; ++r) den += qf[r] * z[r];
          double* o = out.data<double>() + ((b * Hq_ + h) * n + t) * Dv_;
          for (int64_t e = 0; e < Dv_; ++e) {
            double num = 0;
            for (int64_t r = 0; r < m_; ++r) num += qf[r] * S[r * Dv_ + e];
            o[e] = num / den;
          }
        }
      }
    }
  length_ += n;
  return out.to(dt).to(dev);
}

}  // namespace qkv::attn

// ---- Gradcheck cases ----

namespace qkv::attn {

void register_linear_attention_gradchecks(autograd::GradcheckRegistry& r) {
  // B = 2, Hq = 4, Hkv = 2 (GQA), N = 5, D = 3; batch row 1 pads its key 1 (a key inside the
  // sequence, so later queries must skip it). Chunks 1 (the recurrence), 2 (N not a multiple)
  // and 5 (= N, the quadratic form); non-causal also with Nq < Nk.
  const LinearFeature feats[] = {LinearFeature::elu1, LinearFeature::relu, LinearFeature::favor};
  uint64_t seed = 9000;
  for (LinearFeature f : feats)
    for (int causal = 0; causal < 2; ++causal)
      for (int64_t chunk : {int64_t(1), int64_t(2), int64_t(5), int64_t(-2)}) {
        // chunk -2: chunks of 2 with segment runs [0, 3) and [3, 5) (a run starting mid-chunk)
        const bool segments = chunk < 0;
        if (segments && !causal) continue;
        if (segments) chunk = 2;
        const int64_t nq = causal ? 5 : (chunk == 2 ? 3 : 5), nk = 5;
        LinearAttentionOptions o;
        o.feature = f;
        o.causal = causal;
        o.chunk = chunk;
        if (f == LinearFeature::favor) o.projection = favor_projection(4, 3, 77);
        Tensor kp = Tensor::empty({2, nk}, DType::boolean);
        for (int64_t e = 0; e < 2 * nk; ++e) kp.data<bool>()[e] = e != nk + 1;
        o.key_padding = kp;
        if (segments) o.segment_ids = from_vector_i64({0, 0, 0, 1, 1, 0, 0, 0, 1, 1}, {2, nk});
        const std::string name =
            cat("linear ", linear_feature_name(f), causal ? " causal" : " non-causal", " chunk ", chunk,
                segments ? " segments" : "", " GQA key padding q [2,4,", nq, ",3] k [2,2,", nk, ",3]");
        const uint64_t s = seed;
        seed += 3;
        r.add({"linear_attention", name,
               [=] {
                 return std::vector<Tensor>{randn({2, 4, nq, 3}, s, 0, 0.0, 1.0, DType::f64),
                                            randn({2, 2, nk, 3}, s + 1, 0, 0.0, 1.0, DType::f64),
                                            randn({2, 2, nk, 3}, s + 2, 0, 0.0, 1.0, DType::f64)};
               },
               [=](const std::vector<Tensor>& x) { return linear_attention(x[0], x[1], x[2], o); }});
      }
}

}  // namespace qkv::attn
