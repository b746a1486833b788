// Runtime invariants of attention, checked when AttentionOptions::check_invariants is set:
//   shape(QKᵀ) = [Nq, Nk], d_k(Q) = d_k(K), n_k(K) = n_k(V)   (check_problem, before any work)
//   A_ij = 0 where (i, j) is masked        Σ_j A_ij = 1 for valid query rows        O = A·V
// The fused kernel never materializes A, so its check recomputes each row in float64 from the
// saved lse with the full mask predicate, independently of the kernel's tile skipping: a tile
// wrongly skipped or a key wrongly kept shows up as a row that does not sum to 1 or an O ≠ A·V.
// Cost O(B·Hq·Nq·Nk·D): a debug mode.
#include <omp.h>

#include <atomic>
#include <cmath>
#include <mutex>

#include "attention/cpu/reference.h"
#include "tensor/ops.h"

namespace qkv::attn {

namespace {

double sum_tolerance(DType t) { return t == DType::f32 ? 1e-3 : 1e-9; }

[[noreturn]] void violated(const char* kernel, int64_t b, int64_t h, int64_t i, const std::string& what) {
  fail("[attention] invariant violated (", kernel, "): query row ", i, " of batch ", b, ", head ", h, ": ", what);
}

template <class T>
void check_fused_rows(const Tensor& q, const Tensor& k, const Tensor& v, const FusedForward& f, const Problem& p,
                      const MaskPlan& plan, const DropoutDraw& drop) {
  const double tol = sum_tolerance(p.dtype);
  const int64_t rows = p.B * p.Hq * p.Nq;
  std::mutex mu;
  std::string first_error;
  int64_t first_row = INT64_MAX;
#pragma omp parallel if (rows * p.Nk > (1 << 14) && !omp_in_parallel())
  {
    std::vector<double> s(p.Nk), w(p.Nk), o(p.Dv);
    std::vector<T> z(p.Nk);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % p.Nq, h = (r / p.Nq) % p.Hq, b = r / (p.Nq * p.Hq), hk = plan.kv_head(h);
      std::string err;
      const double lse = static_cast<double>(f.lse.data<T>()[r]);
      const T* orow = f.out.data<T>() + r * p.Dv;
      bool any_visible = false, any_finite = false;
      for (int64_t j = 0; j < p.Nk; ++j) {
        const T* qr = q.data<T>() + b * q.stride(0) + h * q.stride(1) + i * q.stride(2);
        const T* kr = k.data<T>() + b * k.stride(0) + hk * k.stride(1) + j * k.stride(2);
        double dot = 0;
        for (int64_t d = 0; d < p.D; ++d)
          dot += static_cast<double>(qr[d * q.stride(3)]) * static_cast<double>(kr[d * k.stride(3)]);
        double x = p.scale * dot;
        if (plan.has_bias()) x += static_cast<double>(plan.bias_row<T>(b, h, i)[j * plan.bias_col_stride()]);
        if (plan.has_alibi()) x -= static_cast<double>(static_cast<T>(plan.alibi_slope(h))) * (plan.pos(i) - j);
        const bool vis = plan.visible(b, h, i, j);
        s[j] = vis ? x : -INFINITY;
        any_visible = any_visible || vis;
        any_finite = any_finite || (vis && std::isfinite(x));
      }
      if (!any_finite) {
        if (!std::isinf(lse) || lse > 0) err = cat("no visible key but lse = ", lse, " (expected -inf)");
        for (int64_t c = 0; c < p.Dv && err.empty(); ++c)
          if (orow[c] != T(0)) err = cat("no visible key but output[", c, "] = ", orow[c], " (expected 0)");
      } else if (!std::isfinite(lse)) {
        err = cat("has visible keys but lse = ", lse);
      } else {
        double total = 0;
        for (int64_t j = 0; j < p.Nk; ++j) total += (w[j] = std::exp(s[j] - lse));
        if (std::fabs(total - 1) > tol) err = cat("weights sum to ", total, ", not 1");
        if (drop.on()) drop.row(b, h, i, 0, p.Nk, z.data());
        std::fill(o.begin(), o.end(), 0.0);
        double vmax = 0;
        for (int64_t j = 0; j < p.Nk; ++j) {
          const double wz = w[j] * (drop.on() ? static_cast<double>(z[j]) : 1.0);
          const T* vr = v.data<T>() + b * v.stride(0) + hk * v.stride(1) + j * v.stride(2);
          for (int64_t c = 0; c < p.Dv; ++c) {
            const double vv = static_cast<double>(vr[c * v.stride(3)]);
            o[c] += wz * vv;
            vmax = std::max(vmax, std::fabs(vv) * (drop.on() ? drop.keep_scale() : 1.0));
          }
        }
        for (int64_t c = 0; c < p.Dv && err.empty(); ++c)
          if (!(std::fabs(o[c] - static_cast<double>(orow[c])) <= tol * (1 + vmax)))
            err = cat("output[", c, "] = ", orow[c], " but A·V gives ", o[c]);
      }
      if (!err.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        if (r < first_row) {
          first_row = r;
          first_error = err;
        }
      }
    }
  }
  if (first_row != INT64_MAX) {
    const int64_t i = first_row % p.Nq, h = (first_row / p.Nq) % p.Hq, b = first_row / (p.Nq * p.Hq);
    violated("fused", b, h, i, first_error);
  }
}

}  // namespace

void check_fused_invariants(const Tensor& q, const Tensor& k, const Tensor& v, const FusedForward& f, const Problem& p,
                            const MaskPlan& plan, const DropoutDraw& drop) {
  if (p.dtype == DType::f32) check_fused_rows<float>(q, k, v, f, p, plan, drop);
  else check_fused_rows<double>(q, k, v, f, p, plan, drop);
}

void check_reference_invariants(const AttentionWeights& r, const Problem& p, const MaskPlan& plan) {
  QKV_CHECK(r.weights.shape() == (Shape{p.B, p.Hq, p.Nq, p.Nk}),
            "[attention] invariant violated (reference): weights are ", shape_str(r.weights.shape()), ", expected ",
            shape_str({p.B, p.Hq, p.Nq, p.Nk}));
  const std::vector<double> a = r.weights.to_vector();
  const double tol = sum_tolerance(p.dtype);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Nq; ++i) {
        const double* row = a.data() + ((b * p.Hq + h) * p.Nq + i) * p.Nk;
        double total = 0;
        bool any_visible = false;
        for (int64_t j = 0; j < p.Nk; ++j) {
          const bool vis = plan.visible(b, h, i, j);
          any_visible = any_visible || vis;
          if (!vis && row[j] != 0) violated("reference", b, h, i, cat("masked key ", j, " has weight ", row[j]));
          if (!std::isfinite(row[j])) violated("reference", b, h, i, cat("weight of key ", j, " is ", row[j]));
          total += row[j];
        }
        const double want = any_visible ? 1.0 : 0.0;
        if (std::fabs(total - want) > tol)
          violated("reference", b, h, i, cat("weights sum to ", total, ", not ", want));
      }
  QKV_CHECK(all_finite(r.out), "[attention] invariant violated (reference): output has non-finite values");
}

}  // namespace qkv::attn
