// The checks that look inside attention: mask semantics on synthetic inputs (the visible(b,h,i,j)
// rules of attention.h), every layer's attention on its real inputs against the naive float64 loop
// (leakcheck_common.cpp), forward and backward, and dropout discipline (off in eval,
// deterministic for one seed in training, different for two).
//
// The backward check differentiates the attention op the model calls on each layer's captured
// q/k/v (RoPE applied inside the graph, so its vjp is checked too) with a seeded dO, and compares
// dq, dk, dv with the float64 vjp below; the forward checks alone cannot see a kernel whose
// forward is right and whose gradient is not (a fused backward recomputes P on its own).
//
// Mask semantics compare attention_with_weights' weights P [B, Hq, Nq, Nk] with the naive
// predicate cell by cell: a masked cell must be exactly 0 (masking happens on logits, before
// softmax, so nothing leaks as a tiny weight), a visible cell must be > 0 (inputs are drawn so no
// visible weight underflows), a row with any visible key sums to 1, a row with none is counted
// and is all zeros with a zero output. The cases cover Nq = Nk, Nq < Nk (bottom-right: query i at
// Nk - Nq + i), a sliding window at both shapes, and left padding that empties rows.
#include <algorithm>
#include <cmath>

#include "attention/alibi.h"
#include "attention/attention.h"
#include "attention/rope.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "analysis/leakcheck_internal.h"

namespace qkv::analysis {

using leak::fmt;
using leak::max_abs;
using leak::max_delta;

namespace {

std::vector<double> to_f64(const Tensor& t) { return t.to_vector(); }

Tensor f32_tensor(const std::vector<double>& v, const Shape& shape) { return from_vector(v, shape, DType::f32); }

struct MaskCase {
  const char* name;
  int64_t nq, nk;
  bool window, padded;
};

}  // namespace

std::vector<LeakCheck> check_mask_semantics(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const nn::ModelConfig& c = model.config();
  const int64_t B = 2, Hq = c.n_head, Hkv = c.n_kv_head, D = c.head_dim(), N = 12, pad = 3;
  const int64_t w = c.window > 0 && c.window < N - 1 ? c.window : 4;
  const MaskCase cases[] = {{"causal, left padding", N, N, false, true},
                            {"causal, Nq < Nk", 5, N, false, false},
                            {"window, left padding", N, N, true, true},
                            {"window, Nq < Nk", 5, N, true, false}};
  double masked_max = 0, rowsum_err = 0, empty_err = 0, kernel_err = 0;
  int64_t br_mismatch = 0, win_mismatch = 0, br_cells = 0, win_cells = 0, expected_empty = 0;
  uint64_t stream = 0x3a5c;
  for (const MaskCase& mc : cases) {
    leak::NaiveSpec s;
    s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Nq = mc.nq, s.Nk = mc.nk, s.D = D, s.Dv = D;
    s.causal = true;
    s.window = mc.window ? w : 0;
    s.pattern = leak::naive_pattern(c, mc.nk);
    attn::AttentionOptions opts;
    opts.causal = true;
    opts.window = s.window;
    opts.pattern = leak::model_pattern(c);
    if (mc.padded) {
      s.key_valid.assign(static_cast<size_t>(B * mc.nk), 1);
      for (int64_t j = 0; j < pad; ++j) s.key_valid[static_cast<size_t>(mc.nk + j)] = 0;  // row 1, left padding
      opts.key_padding = Tensor::empty({B, mc.nk}, DType::boolean);
      for (int64_t i = 0; i < B * mc.nk; ++i) opts.key_padding.data<bool>()[i] = s.key_valid[static_cast<size_t>(i)];
    }
    // Drawn on the host (the same values on every device), then moved to where the model runs,
    // so a GPU model's check exercises the device kernels.
    const Device dev = model.device();
    const Tensor q = randn({B, Hq, mc.nq, D}, o.seed, ++stream << 40).to(dev),
                 k = randn({B, Hkv, mc.nk, D}, o.seed, ++stream << 40).to(dev),
                 v = randn({B, Hkv, mc.nk, D}, o.seed, ++stream << 40).to(dev);
    if (opts.key_padding.defined()) opts.key_padding = opts.key_padding.to(dev);
    std::vector<double> ref_out, ref_w;
    const int64_t empty = leak::naive_attention(s, to_f64(q), to_f64(k), to_f64(v), ref_out, &ref_w);
    expected_empty += empty;

    opts.kernel = attn::Kernel::reference;
    const attn::AttentionWeights r = model.attention_ops()->attention_with_weights(q, k, v, opts);
    attn::AttentionOptions fused_opts = opts;
    fused_opts.kernel = attn::Kernel::fused;
    const Tensor fused = model.attention_ops()->attention(q, k, v, fused_opts);
    const attn::AttentionShape shape{B, Hq, Hkv, mc.nq, mc.nk};
    empty_err += std::abs(static_cast<double>(r.fully_masked_rows - empty)) +
                 std::abs(static_cast<double>(attn::count_fully_masked_rows(shape, opts) - empty));

    const std::vector<double> W = to_f64(r.weights), ro = to_f64(r.out), fo = to_f64(fused);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < mc.nq; ++i) {
          const size_t row = static_cast<size_t>((b * Hq + h) * mc.nq + i);
          double sum = 0;
          bool any = false;
          for (int64_t j = 0; j < mc.nk; ++j) {
            const double x = W[row * static_cast<size_t>(mc.nk) + static_cast<size_t>(j)];
            const bool vis = leak::naive_visible(s, b, i, j);
            any = any || vis;
            sum += x;
            if (!vis) masked_max = std::isnan(x) ? INFINITY : std::max(masked_max, std::abs(x));
            const bool mismatch = vis != (x > 0);  // NaN counts as a mismatch on visible cells
            if (mc.nq < mc.nk) ++br_cells, br_mismatch += mismatch;
            if (mc.window) ++win_cells, win_mismatch += mismatch;
          }
          if (any) {
            rowsum_err = std::isnan(sum) ? INFINITY : std::max(rowsum_err, std::abs(sum - 1.0));
          } else {  // a fully masked row: zero weights and zero outputs from both kernels
            double z = std::abs(sum);
            for (int64_t d = 0; d < D; ++d)
              z = std::max({z, std::abs(ro[row * static_cast<size_t>(D) + static_cast<size_t>(d)]),
                            std::abs(fo[row * static_cast<size_t>(D) + static_cast<size_t>(d)])});
            empty_err += std::isnan(z) ? INFINITY : z;
          }
        }
    const Tensor ref_t = f32_tensor(ref_out, {B, Hq, mc.nq, D});
    const double floor = leak::attention_floors(D, D, 0, {}, {}, to_f64(v), {}, false).out;
    kernel_err =
        std::max({kernel_err, leak::floored_ratio(r.out, ref_t, floor), leak::floored_ratio(fused, ref_t, floor)});
  }
  const std::string shapes =
      "B=2, Hq=" + std::to_string(Hq) + ", Hkv=" + std::to_string(Hkv) + ", D=" + std::to_string(D);
  std::vector<LeakCheck> out;
  out.push_back(leak::make_check("mask.masked_weights_zero", masked_max, 0,
                                 "max |weight| over masked cells (causal, window, padding; " + shapes + ")"));
  out.push_back(
      leak::make_check("mask.rows_sum_to_one", rowsum_err, 1e-6, "max |Σ_j weight - 1| over rows with a visible key"));
  out.push_back(leak::make_check("mask.fully_masked_rows", empty_err, 0,
                                 std::to_string(expected_empty) +
                                     " rows emptied by left padding: |miscount| (weights "
                                     "and counter) + max |weight or output| in them (both kernels)"));
  out.push_back(leak::make_check("mask.bottom_right_causal", static_cast<double>(br_mismatch), 0,
                                 "cells of " + std::to_string(br_cells) +
                                     " with Nq=5 < Nk=12 whose visibility differs "
                                     "from query i at position Nk-Nq+i"));
  out.push_back(leak::make_check("mask.window_boundary", static_cast<double>(win_mismatch), 0,
                                 "cells of " + std::to_string(win_cells) +
                                     " whose visibility differs from "
                                     "p-" +
                                     std::to_string(w) + " < j <= p (window " + std::to_string(w) + ")"));
  out.push_back(leak::make_check("mask.kernels_vs_naive", kernel_err, 1e-5,
                                 "max|Δout| / max(max|out|, " + fmt(leak::kFloorShare) +
                                     " max|v|), reference and fused kernels vs naive float64 on the four cases "
                                     "(GQA head h reads kv head h/(Hq/Hkv))"));
  return out;
}

namespace {

// The reference checks' probe: 3 rows (plain, left-padded, packed) through an eval copy, every
// layer's attention captured, and the naive spec of the masks the model applied.
struct RealAttention {
  int64_t B = 3, L = 0;
  std::vector<int64_t> pos, seg;
  std::vector<uint8_t> valid;
  nn::ForwardArgs args;  // the probe's positions, segments and key padding (on the host)
  std::vector<nn::AttentionCapture> caps;
  leak::NaiveSpec spec;
  std::string what;  // the masks and positions, for the detail
};

RealAttention capture_real_attention(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  RealAttention r;
  const nn::ModelConfig& c = model.config();
  const int64_t B = r.B, L = r.L = leak::probe_len(c, o), Hq = c.n_head, Hkv = c.n_kv_head, hd = c.head_dim();
  const auto rows = leak::probe_rows(c, o, B, L, 8);
  // Row 0 plain; row 1 left-padded by P (pads in segment -1, positions restart at its first real
  // token); row 2 two packed documents.
  const int64_t P = L >= 2 ? std::max<int64_t>(1, L / 4) : 0, half = L / 2;
  r.pos.assign(static_cast<size_t>(B * L), 0);
  r.seg.assign(static_cast<size_t>(B * L), 0);
  r.valid.assign(static_cast<size_t>(B * L), 1);
  for (int64_t t = 0; t < L; ++t) {
    r.pos[static_cast<size_t>(t)] = t;
    const size_t r1 = static_cast<size_t>(L + t), r2 = static_cast<size_t>(2 * L + t);
    r.valid[r1] = t >= P;
    r.seg[r1] = t >= P ? 0 : -1;
    r.pos[r1] = t >= P ? t - P : 0;
    r.seg[r2] = t >= half ? 1 : 0;
    r.pos[r2] = t >= half ? t - half : t;
  }
  nn::ForwardArgs& a = r.args;
  a.ids = leak::ids_tensor(rows);
  a.positions = from_vector_i64(r.pos, {B, L});
  a.segment_ids = from_vector_i64(r.seg, {B, L});
  a.key_padding = Tensor::empty({B, L}, DType::boolean);
  for (int64_t i = 0; i < B * L; ++i) a.key_padding.data<bool>()[i] = r.valid[static_cast<size_t>(i)] != 0;
  a.attention = &r.caps;
  leak::forward(model, a);
  a.attention = nullptr;
  QKV_CHECK(static_cast<int64_t>(r.caps.size()) == c.n_layer, "[leakcheck] captured ", r.caps.size(),
            " attention layers from a model of ", c.n_layer);

  leak::NaiveSpec& s = r.spec;
  s.B = B, s.Hq = Hq, s.Hkv = Hkv, s.Nq = L, s.Nk = L, s.D = hd, s.Dv = hd;
  s.causal = true;
  s.window = c.window;
  s.pattern = leak::naive_pattern(c, L);
  s.key_valid = r.valid;
  s.segment = r.seg;
  if (c.position == nn::Position::alibi) s.alibi = leak::naive_alibi_slopes(Hq);
  r.what = std::string("scale 1/sqrt(") + std::to_string(hd) + "), causal";
  if (c.window > 0) r.what += ", window " + std::to_string(c.window);
  if (c.pattern.sparse()) r.what += ", pattern " + c.pattern.describe();
  r.what += ", key padding, segments, GQA " + std::to_string(Hq) + ":" + std::to_string(Hkv);
  if (c.position == nn::Position::rope) r.what += ", RoPE at the given positions";
  if (c.position == nn::Position::alibi) r.what += ", ALiBi";
  return r;
}

}  // namespace

LeakCheck check_reference_attention(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const RealAttention r = capture_real_attention(*m, o);
  const int64_t B = r.B, L = r.L, Hq = c.n_head, Hkv = c.n_kv_head, hd = c.head_dim();
  double worst = 0;
  int64_t worst_layer = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::vector<double> q = to_f64(r.caps[l].q), k = to_f64(r.caps[l].k), ref;
    if (c.position == nn::Position::rope) {
      leak::naive_rope(q, B, Hq, L, hd, r.pos, c.rope_theta);
      leak::naive_rope(k, B, Hkv, L, hd, r.pos, c.rope_theta);
    }
    if (c.attention_pattern == nn::AttentionPattern::linear) {
      const attn::LinearAttentionOptions lo;  // the model's layers use the default eps and scale
      const std::vector<double> W = c.linear_feature == attn::LinearFeature::favor
                                        ? attn::favor_projection_for_layer(c.linear_features, hd, l).to_vector()
                                        : std::vector<double>();
      leak::naive_linear_attention(r.spec, c.linear_feature, W, lo.eps, q, k, to_f64(r.caps[l].v), ref);
    } else {
      leak::naive_attention(r.spec, q, k, to_f64(r.caps[l].v), ref, nullptr);
    }
    const Tensor ref_t = from_vector(ref, {B, Hq, L, hd}, DType::f64);
    const double floor = leak::attention_floors(hd, hd, 0, q, k, to_f64(r.caps[l].v), {}, false).out;
    const double d = leak::floored_ratio(r.caps[l].out, ref_t, floor);
    if (l == 0 || d > worst) {
      worst = d;
      worst_layer = l;
    }
  }
  return leak::make_check("reference_attention", worst, 1e-4,
                          "every layer's attention output on its real q/k/v (3 rows: plain, left-padded, packed) vs "
                          "naive float64 (" +
                              r.what + "); max|Δ| / max(max|out|, " + fmt(leak::kFloorShare) +
                              " max|v|), worst layer " + std::to_string(worst_layer));
}

namespace leak {

AttentionFloors attention_floors(int64_t D, int64_t Dv, double scale, const std::vector<double>& q,
                                 const std::vector<double>& k, const std::vector<double>& v,
                                 const std::vector<double>& dout, bool linear) {
  auto max_abs_of = [](const std::vector<double>& x) {
    double m = 0;
    for (double e : x) m = std::isnan(e) ? INFINITY : std::max(m, std::abs(e));
    return m;
  };
  auto max_row_norm = [](const std::vector<double>& x, int64_t n) {
    double m = 0;
    for (size_t r = 0; r + static_cast<size_t>(n) <= x.size(); r += static_cast<size_t>(n)) {
      double sq = 0;
      for (int64_t d = 0; d < n; ++d) sq += x[r + static_cast<size_t>(d)] * x[r + static_cast<size_t>(d)];
      m = std::max(m, std::sqrt(sq));
    }
    return m;
  };
  const double s = scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  AttentionFloors f;
  f.out = kFloorShare * max_abs_of(v);
  f.dv = kFloorShare * max_abs_of(dout);
  if (!linear && !dout.empty()) {
    const double g = 2 * s * max_row_norm(dout, Dv) * max_row_norm(v, Dv);
    f.dq = kFloorShare * g * max_abs_of(k);
    f.dk = kFloorShare * g * max_abs_of(q);
  }
  return f;
}

void naive_linear_attention(const NaiveSpec& s, attn::LinearFeature f, const std::vector<double>& W, double eps,
                            const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                            std::vector<double>& out) {
  const int64_t G = s.Hq / s.Hkv, D = s.D;
  const int64_t m = f == attn::LinearFeature::favor ? static_cast<int64_t>(W.size()) / D : D;
  const double rs = std::sqrt(s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  auto phi = [&](const double* x) {
    std::vector<double> t(static_cast<size_t>(D)), o(static_cast<size_t>(m));
    double sq = 0;
    for (int64_t d = 0; d < D; ++d) {
      t[d] = rs * x[d];
      sq += t[d] * t[d];
    }
    for (int64_t r = 0; r < m; ++r) {
      if (f == attn::LinearFeature::favor) {
        double u = 0;
        for (int64_t d = 0; d < D; ++d) u += W[r * D + d] * t[d];
        o[r] = std::exp(u - sq / 2) / std::sqrt(static_cast<double>(m));
      } else {
        o[r] = f == attn::LinearFeature::relu ? std::max(t[r], 0.0) : (t[r] > 0 ? t[r] + 1 : std::exp(t[r]));
      }
    }
    return o;
  };
  out.assign(static_cast<size_t>(s.B * s.Hq * s.Nq * s.Dv), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        const std::vector<double> fq = phi(&q[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * D)]);
        double den = eps;
        std::vector<double> num(static_cast<size_t>(s.Dv), 0.0);
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (!naive_visible(s, b, i, j)) continue;
          const size_t kr = static_cast<size_t>((b * s.Hkv + h / G) * s.Nk + j);
          const std::vector<double> fk = phi(&k[kr * static_cast<size_t>(D)]);
          double w = 0;
          for (int64_t r = 0; r < m; ++r) w += fq[r] * fk[r];
          den += w;
          for (int64_t d = 0; d < s.Dv; ++d) num[d] += w * v[kr * static_cast<size_t>(s.Dv) + static_cast<size_t>(d)];
        }
        for (int64_t d = 0; d < s.Dv; ++d)
          out[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.Dv + d)] = num[d] / den;
      }
}

void naive_linear_attention_backward(const NaiveSpec& s, attn::LinearFeature f, const std::vector<double>& W,
                                     double eps, const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<double>& dout,
                                     std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  const int64_t G = s.Hq / s.Hkv, D = s.D, Dv = s.Dv;
  const int64_t m = f == attn::LinearFeature::favor ? static_cast<int64_t>(W.size()) / D : D;
  const double rs = std::sqrt(s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  auto phi = [&](const double* x) {
    std::vector<double> o(static_cast<size_t>(m));
    double sq = 0;
    for (int64_t d = 0; d < D; ++d) sq += rs * x[d] * rs * x[d];
    for (int64_t r = 0; r < m; ++r) {
      if (f == attn::LinearFeature::favor) {
        double u = 0;
        for (int64_t d = 0; d < D; ++d) u += W[r * D + d] * rs * x[d];
        o[r] = std::exp(u - sq / 2) / std::sqrt(static_cast<double>(m));
      } else {
        const double t = rs * x[r];
        o[r] = f == attn::LinearFeature::relu ? std::max(t, 0.0) : (t > 0 ? t + 1 : std::exp(t));
      }
    }
    return o;
  };
  // dx += rs·vjp_φ(rs·x, g)
  auto phi_vjp = [&](const double* x, const std::vector<double>& g, double* dx) {
    const std::vector<double> fx = phi(x);
    for (int64_t d = 0; d < D; ++d) {
      const double t = rs * x[d];
      double acc = 0;
      if (f == attn::LinearFeature::favor) {
        for (int64_t r = 0; r < m; ++r) acc += g[r] * fx[r] * (W[r * D + d] - t);
      } else {
        acc = g[d] * (t > 0 ? 1.0 : f == attn::LinearFeature::relu ? 0.0 : std::exp(t));
      }
      dx[d] += rs * acc;
    }
  };
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  std::vector<std::vector<double>> dpsi(static_cast<size_t>(s.B * s.Hkv * s.Nk), std::vector<double>(m, 0.0));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        const size_t qr = static_cast<size_t>((b * s.Hq + h) * s.Nq + i);
        const std::vector<double> fq = phi(&q[qr * D]);
        std::vector<size_t> vis;
        std::vector<double> w;
        double den = eps;
        std::vector<double> num(static_cast<size_t>(Dv), 0.0);
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (!naive_visible(s, b, i, j)) continue;
          const size_t kr = static_cast<size_t>((b * s.Hkv + h / G) * s.Nk + j);
          const std::vector<double> fk = phi(&k[kr * D]);
          double wij = 0;
          for (int64_t r = 0; r < m; ++r) wij += fq[r] * fk[r];
          vis.push_back(kr);
          w.push_back(wij);
          den += wij;
          for (int64_t e = 0; e < Dv; ++e) num[e] += wij * v[kr * Dv + e];
        }
        const double* go = &dout[qr * Dv];
        double dden = 0;
        for (int64_t e = 0; e < Dv; ++e) dden -= go[e] * num[e] / den;
        dden /= den;
        std::vector<double> dphi(static_cast<size_t>(m), 0.0);
        for (size_t a = 0; a < vis.size(); ++a) {
          const size_t kr = vis[a];
          const std::vector<double> fk = phi(&k[kr * D]);
          double dw = dden;
          for (int64_t e = 0; e < Dv; ++e) {
            dw += go[e] / den * v[kr * Dv + e];
            dv[kr * Dv + e] += w[a] * go[e] / den;
          }
          for (int64_t r = 0; r < m; ++r) {
            dphi[r] += dw * fk[r];
            dpsi[kr][r] += dw * fq[r];
          }
        }
        phi_vjp(&q[qr * D], dphi, &dq[qr * D]);
      }
  for (size_t kr = 0; kr < dpsi.size(); ++kr) phi_vjp(&k[kr * D], dpsi[kr], &dk[kr * D]);
}

void naive_attention_backward(const NaiveSpec& s, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& dout, std::vector<double>& dq,
                              std::vector<double>& dk, std::vector<double>& dv) {
  std::vector<double> out, w;
  naive_attention(s, q, k, v, out, &w);  // P (zero rows where fully masked) and O
  const int64_t G = s.Hq / s.Hkv;
  const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  std::vector<double> dp(static_cast<size_t>(s.Nk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        const int64_t kh = h / G, row = (b * s.Hq + h) * s.Nq + i;
        const double* p = &w[static_cast<size_t>(row * s.Nk)];
        const double* go = &dout[static_cast<size_t>(row * s.Dv)];
        const double* o = &out[static_cast<size_t>(row * s.Dv)];
        const double* qi = &q[static_cast<size_t>(row * s.D)];
        double di = 0;  // rowsum(dO ∘ O)
        for (int64_t d = 0; d < s.Dv; ++d) di += go[d] * o[d];
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (p[j] == 0) continue;  // masked (or underflowed): no gradient flows through it
          const size_t kr = static_cast<size_t>((b * s.Hkv + kh) * s.Nk + j);
          const double* vj = &v[kr * static_cast<size_t>(s.Dv)];
          double dpj = 0;
          for (int64_t d = 0; d < s.Dv; ++d) {
            dv[kr * static_cast<size_t>(s.Dv) + static_cast<size_t>(d)] += p[j] * go[d];
            dpj += go[d] * vj[d];
          }
          const double ds = scale * p[j] * (dpj - di);
          const double* kj = &k[kr * static_cast<size_t>(s.D)];
          for (int64_t d = 0; d < s.D; ++d) {
            dq[static_cast<size_t>(row * s.D + d)] += ds * kj[d];
            dk[kr * static_cast<size_t>(s.D) + static_cast<size_t>(d)] += ds * qi[d];
          }
        }
      }
}

LeakCheck reference_attention_backward(const nn::DecoderModel& model, const LeakCheckOptions& o,
                                       const AttentionFn& fn) {
  const EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const RealAttention r = capture_real_attention(*m, o);
  const int64_t B = r.B, L = r.L, Hq = c.n_head, Hkv = c.n_kv_head, hd = c.head_dim();
  const Device dev = m->device();
  const bool rope = c.position == nn::Position::rope;
  // A gpt2-style model (fused c_attn) without RoPE trains through attention_packed: check that op too.
  const bool linear = c.attention_pattern == nn::AttentionPattern::linear;
  const bool packed = c.family == nn::Family::gpt2 && !rope && !linear;
  attn::AttentionOptions opts;
  opts.causal = true;
  opts.window = c.window;
  opts.pattern = leak::model_pattern(c);
  opts.kernel = c.attn_kernel;
  opts.key_padding = r.args.key_padding.to(dev);
  opts.segment_ids = r.args.segment_ids.to(dev);
  if (c.position == nn::Position::alibi) opts.alibi_slopes = attn::alibi_slopes(Hq);
  // The model's own attention ops (a planted fault lives there) have the last word on the options
  // and apply RoPE, as in the model's forward.
  const auto ops = m->attention_ops();
  nn::RngContext no_dropout;
  opts = ops->options(opts, c, /*training=*/false, no_dropout);
  const Tensor positions = r.args.positions.to(dev);
  // The seeded output gradient, drawn on the host so every device sees the same values.
  const Tensor dout = randn({B, Hq, L, hd}, o.seed, uint64_t{0xba} << 40);
  const std::vector<double> dout64 = to_f64(dout);
  std::vector<int64_t> neg_pos(r.pos.size());
  for (size_t e = 0; e < r.pos.size(); ++e) neg_pos[e] = -r.pos[e];

  double worst = 0;
  std::string worst_at = "none";
  auto note = [&](double d, int64_t layer, const char* grad, const char* path) {
    if (worst_at == "none" || d > worst || std::isnan(d)) {
      worst = std::isnan(d) ? INFINITY : d;
      worst_at = "layer " + std::to_string(layer) + " " + grad + " (" + path + ")";
    }
  };
  const autograd::GradModeGuard grad_on(true);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    // Float64 oracle on the captured (pre-RoPE) q/k/v; RoPE's vjp is the rotation by -position.
    std::vector<double> q = to_f64(r.caps[l].q), k = to_f64(r.caps[l].k), v = to_f64(r.caps[l].v);
    if (rope) {
      naive_rope(q, B, Hq, L, hd, r.pos, c.rope_theta);
      naive_rope(k, B, Hkv, L, hd, r.pos, c.rope_theta);
    }
    std::vector<double> dq, dk, dv;
    attn::LinearAttentionOptions lo;  // linear: the model's layer options (favor: the layer's W)
    if (linear) {
      lo.feature = c.linear_feature;
      lo.causal = true;
      lo.chunk = c.linear_chunk;
      lo.key_padding = opts.key_padding;
      lo.segment_ids = opts.segment_ids;
      if (c.linear_feature == attn::LinearFeature::favor)
        lo.projection = attn::favor_projection_for_layer(c.linear_features, hd, l).to(dev);
      const std::vector<double> W = lo.projection.defined() ? lo.projection.to_vector() : std::vector<double>();
      naive_linear_attention_backward(r.spec, c.linear_feature, W, lo.eps, q, k, v, dout64, dq, dk, dv);
    } else {
      naive_attention_backward(r.spec, q, k, v, dout64, dq, dk, dv);
    }
    if (rope) {
      naive_rope(dq, B, Hq, L, hd, neg_pos, c.rope_theta);
      naive_rope(dk, B, Hkv, L, hd, neg_pos, c.rope_theta);
    }
    const Tensor want[3] = {from_vector(dq, {B, Hq, L, hd}, DType::f64), from_vector(dk, {B, Hkv, L, hd}, DType::f64),
                            from_vector(dv, {B, Hkv, L, hd}, DType::f64)};
    const char* names[3] = {"dq", "dk", "dv"};
    // The floors from the inputs the oracle saw (RoPE'd q, k): see attention_floors.
    const AttentionFloors fl = attention_floors(hd, hd, 0, q, k, v, dout64, linear);
    const double floors[3] = {fl.dq, fl.dk, fl.dv};
    auto compare = [&](const Tensor* got, const char* path) {
      for (int t = 0; t < 3; ++t) note(floored_ratio(got[t], want[t], floors[t]), l, names[t], path);
    };

    // The op the captured forward ran: attention() on [B, H, L, hd] (RoPE applied in the graph).
    Tensor q0 = r.caps[l].q.clone().set_requires_grad(true);
    Tensor k0 = r.caps[l].k.clone().set_requires_grad(true);
    Tensor v0 = r.caps[l].v.clone().set_requires_grad(true);
    Tensor qa = q0, ka = k0;
    if (rope) {
      qa = ops->rope(q0, positions, c.rope_theta, 0);
      ka = ops->rope(k0, positions, c.rope_theta, 0);
    }
    autograd::backward(linear ? ops->linear_attention(qa, ka, v0, lo) : fn(qa, ka, v0, opts), dout.to(dev));
    const Tensor got[3] = {q0.grad(), k0.grad(), v0.grad()};
    compare(got, "attention");

    if (packed) {  // attention_packed on [B, L, Hq + 2·Hkv, hd], as the training forward calls it
      Tensor qkv = cat({r.caps[l].q.transpose(1, 2), r.caps[l].k.transpose(1, 2), r.caps[l].v.transpose(1, 2)}, 2)
                       .contiguous()
                       .set_requires_grad(true);
      autograd::backward(ops->attention_packed(qkv, Hq, Hkv, opts), dout.transpose(1, 2).contiguous().to(dev));
      const Tensor g = qkv.grad();
      const Tensor pg[3] = {g.narrow(2, 0, Hq).transpose(1, 2), g.narrow(2, Hq, Hkv).transpose(1, 2),
                            g.narrow(2, Hq + Hkv, Hkv).transpose(1, 2)};
      compare(pg, "attention_packed");
    }
  }
  return make_check("reference_attention_backward", worst, 1e-4,
                    "every layer's attention backward on its real q/k/v (the 3 probe rows) with a seeded N(0,1) dO: "
                    "dq, dk, dv" +
                        std::string(rope ? " through RoPE" : "") + " vs the naive float64 vjp (" + r.what +
                        (linear   ? "; linear_attention()"
                         : packed ? "; attention() and attention_packed"
                                  : "; attention()") +
                        "); max|Δ| / max(max|ref|, floor " + fmt(kFloorShare) +
                        " x the gradient's bound from the inputs), worst " + worst_at);
}

}  // namespace leak

LeakCheck check_reference_attention_backward(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const auto ops = model.attention_ops();
  return leak::reference_attention_backward(
      model, o, [ops](const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& opts) {
        return ops->attention(q, k, v, opts);
      });
}

LeakCheck check_dropout(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const nn::ModelConfig& c = model.config();
  nn::ModelConfig with = c, without = c;
  with.dropout = c.dropout > 0 ? c.dropout : 0.1;
  // linear attention has no weights to drop: its copy keeps attn_dropout = 0 (residual dropout only)
  with.attn_dropout = c.attention_pattern == nn::AttentionPattern::linear ? 0
                      : c.attn_dropout > 0                                ? c.attn_dropout
                                                                          : 0.1;
  without.dropout = without.attn_dropout = 0;
  const auto drop = copy_model(model, with), none = copy_model(model, without);
  const int64_t L = leak::probe_len(c, o);
  const Tensor ids = leak::ids_tensor(leak::probe_rows(c, o, 2, L, 9));
  const Tensor e0 = leak::forward(*none, ids), e1 = leak::forward(*drop, ids), e2 = leak::forward(*drop, ids);
  const double scale = max_abs(e0);
  const double d_eval = leak::ratio(std::max(max_delta(e1, e2), max_delta(e1, e0)), scale);
  drop->train();
  auto train_run = [&](uint64_t seed) {
    nn::ForwardArgs a;
    a.ids = ids;
    a.rng.seed = seed;
    a.rng.step = 3;
    return leak::forward(*drop, a);
  };
  const Tensor t1 = train_run(1234), t2 = train_run(1234), t3 = train_run(4321);
  const double d_train = leak::ratio(max_delta(t1, t2), scale), d_seed = leak::ratio(max_delta(t1, t3), scale);
  double value = std::max(d_eval, d_train);
  std::string detail = "copy with dropout " + fmt(with.dropout) + ", attn_dropout " + fmt(with.attn_dropout) +
                       ": eval twice and vs dropout-free (" + fmt(d_eval) + "), train with one seed twice (" +
                       fmt(d_train) + "); two seeds differ by " + fmt(d_seed);
  if (!(d_seed > 0)) {
    value = INFINITY;
    detail += " (dropout is not active in training)";
  }
  return leak::make_check("dropout_discipline", value, 0, detail);
}

}  // namespace qkv::analysis
