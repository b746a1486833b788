// Shared pieces of the leakage checks: the seeded probe batch, eval copies of the model, float
// comparisons, and the naive float64 attention that the reference checks trust.
//
// The naive attention is deliberately the textbook loop (Vaswani et al. 2017): per (b, h, i) the
// logits s_ij = (q_i · k_j) / sqrt(d_head) (+ ALiBi) over the keys the mask admits, a max-shifted
// softmax over j, then Σ_j a_ij v_j, with query head h reading K/V head h / (Hq / Hkv). It shares
// no code with attention/ (not the mask predicate, not the head mapping), so a bug planted there
// cannot hide by appearing on both sides of a comparison.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "autograd/grad_mode.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "tensor/philox.h"
#include "analysis/leakcheck_internal.h"

namespace qkv::analysis {

namespace leak {

int64_t probe_len(const nn::ModelConfig& c, const LeakCheckOptions& o) {
  return std::max<int64_t>(1, std::min(c.block_size, o.max_probe_len));
}

std::vector<std::vector<int64_t>> probe_rows(const nn::ModelConfig& c, const LeakCheckOptions& o, int64_t rows,
                                             int64_t len, uint32_t stream) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(rows), std::vector<int64_t>(static_cast<size_t>(len)));
  const auto V = static_cast<uint32_t>(c.vocab_size);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < len; t += 4) {
      const Philox4 x = philox4x32_10(static_cast<uint32_t>(t / 4), static_cast<uint32_t>(r), stream, 0x9e37u,
                                      static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32));
      for (int64_t k = 0; k < 4 && t + k < len; ++k) out[r][t + k] = static_cast<int64_t>(x.v[k] % V);
    }
  return out;
}

Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows) {
  const int64_t R = static_cast<int64_t>(rows.size()), T = rows.empty() ? 0 : static_cast<int64_t>(rows[0].size());
  std::vector<int64_t> flat;
  flat.reserve(static_cast<size_t>(R * T));
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return from_vector_i64(flat, {R, T});
}
Tensor ids_tensor(const std::vector<int64_t>& row) {
  return from_vector_i64(row, {1, static_cast<int64_t>(row.size())});
}

EvalModel::EvalModel(const nn::DecoderModel& m) : ptr_(&m) {
  if (m.is_training()) {
    owned_ = copy_model(m, m.config());
    ptr_ = owned_.get();
  }
}

Tensor forward(const nn::DecoderModel& m, nn::ForwardArgs& a) {
  autograd::NoGradGuard no_grad;
  return m.forward(a);
}
Tensor forward(const nn::DecoderModel& m, const Tensor& ids) {
  nn::ForwardArgs a;
  a.ids = ids;
  return forward(m, a);
}

namespace {
// Calls f(x) on every element of a float tensor as double, in row-major order.
// Device tensors are copied to the host first.
template <class F>
void each(const Tensor& a, F&& f) {
  const Tensor c = a.device() == Device::cpu ? a.contiguous() : a.to(Device::cpu);
  const int64_t n = c.numel();
  if (c.dtype() == DType::f32) {
    const float* p = c.data<float>();
    for (int64_t i = 0; i < n; ++i) f(i, static_cast<double>(p[i]));
  } else if (c.dtype() == DType::f64) {
    const double* p = c.data<double>();
    for (int64_t i = 0; i < n; ++i) f(i, p[i]);
  } else {
    const auto v = c.to_vector();
    for (int64_t i = 0; i < n; ++i) f(i, v[static_cast<size_t>(i)]);
  }
}
}  // namespace

double max_abs(const Tensor& a) {
  double m = 0;
  each(a, [&](int64_t, double x) { m = std::isnan(x) ? INFINITY : std::max(m, std::abs(x)); });
  return m;
}

double max_delta(const Tensor& a, const Tensor& b) {
  QKV_CHECK(a.shape() == b.shape(), "[leakcheck] comparing ", shape_str(a.shape()), " with ", shape_str(b.shape()));
  const Tensor bc = (b.device() == Device::cpu ? b : b.to(Device::cpu)).to(DType::f64).contiguous();
  const double* pb = bc.data<double>();
  double m = 0;
  each(a, [&](int64_t i, double x) {
    const double d = std::abs(x - pb[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  });
  return m;
}

double rounding_tolerance(const nn::ModelConfig& c, int64_t probe_len) {
  const double u = std::ldexp(1.0, -24);
  const int64_t K = std::max({c.n_embd, c.ffn_hidden, probe_len, int64_t{1}});
  return u * std::sqrt(static_cast<double>(K)) * static_cast<double>(2 + 6 * c.n_layer);
}

std::string rounding_tolerance_note(const nn::ModelConfig& c, int64_t probe_len) {
  const int64_t K = std::max({c.n_embd, c.ffn_hidden, probe_len, int64_t{1}});
  return "float32 rounding bound u*sqrt(K)*(2+6*n_layer) = 2^-24*sqrt(" + std::to_string(K) + ")*" +
         std::to_string(2 + 6 * c.n_layer) + " = " + fmt(rounding_tolerance(c, probe_len));
}

LeakCheck make_check(std::string name, double value, double threshold, std::string detail) {
  LeakCheck c;
  c.name = std::move(name);
  c.value = std::isnan(value) ? INFINITY : value;
  c.threshold = threshold;
  c.pass = std::isfinite(c.value) && c.value <= threshold;
  c.detail = std::move(detail);
  return c;
}

std::vector<double> position_gaps(const Tensor& a, const Tensor& b) {
  QKV_CHECK(a.dim() == 2 && a.shape() == b.shape(), "[leakcheck] comparing ", shape_str(a.shape()), " with ",
            shape_str(b.shape()), " (need two [T, V])");
  const int64_t T = a.size(0), V = a.size(1);
  const Tensor x = a.to(Device::cpu).to(DType::f64).contiguous(), y = b.to(Device::cpu).to(DType::f64).contiguous();
  const double *px = x.data<double>(), *py = y.data<double>();
  std::vector<double> out(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double d = std::abs(px[t * V + v] - py[t * V + v]);
      out[t] = std::isnan(d) ? INFINITY : std::max(out[t], d);
    }
  return out;
}

int64_t first_argmax_divergence(const Tensor& a, const Tensor& b) {
  QKV_CHECK(a.dim() == 2 && a.shape() == b.shape(), "[leakcheck] comparing ", shape_str(a.shape()), " with ",
            shape_str(b.shape()), " (need two [T, V])");
  const int64_t T = a.size(0), V = a.size(1);
  const Tensor x = a.to(Device::cpu).to(DType::f64).contiguous(), y = b.to(Device::cpu).to(DType::f64).contiguous();
  auto argmax = [V](const double* row) { return std::max_element(row, row + V) - row; };
  for (int64_t t = 0; t < T; ++t)
    if (argmax(x.data<double>() + t * V) != argmax(y.data<double>() + t * V)) return t;
  return -1;
}

void fold_gaps(std::vector<double>& per, int64_t& diverges_at, int64_t offset, const Tensor& got, const Tensor& want) {
  const std::vector<double> g = position_gaps(got, want);
  const size_t at = static_cast<size_t>(offset);
  if (per.size() < at + g.size()) per.resize(at + g.size(), 0.0);
  for (size_t t = 0; t < g.size(); ++t) per[at + t] = std::max(per[at + t], g[t]);
  const int64_t d = first_argmax_divergence(got, want);
  if (d >= 0 && (diverges_at < 0 || offset + d < diverges_at)) diverges_at = offset + d;
}

bool recurrent_decode(const nn::ModelConfig& c) { return c.attention_pattern == nn::AttentionPattern::linear; }

ConsistencyBound consistency_bound(const nn::ModelConfig& c, int64_t L, double scale, bool recurrent) {
  ConsistencyBound b;
  const bool exact = numerics() == Numerics::invariant && !recurrent;
  if (exact) {
    b.note = "threshold 0: numerics = invariant, so both ways must give the same bits";
    return b;
  }
  b.threshold = rounding_tolerance(c, L) * scale;
  b.note = "threshold " + rounding_tolerance_note(c, L) + " times max |logit| " + fmt(scale);
  if (recurrent)
    b.note += numerics() == Numerics::invariant
                  ? " (kept under numerics = invariant: linear attention decodes through its recurrent state, "
                    "which sums in another order than the parallel chunked form, so the two cannot be bitwise equal)"
                  : " (linear attention: the recurrent decode sums in another order than the chunked form)";
  else b.note += " (numerics = standard: the ways group their sums differently)";
  return b;
}

LeakCheck make_consistency_check(std::string name, std::vector<double> per, int64_t diverges_at,
                                 const ConsistencyBound& bound, std::string detail) {
  const auto it = std::max_element(per.begin(), per.end());
  const double worst = it == per.end() ? 0.0 : *it;
  if (it != per.end() && worst > 0) detail += "; worst at position " + std::to_string(it - per.begin());
  detail += diverges_at >= 0 ? "; greedy argmax first differs at position " + std::to_string(diverges_at)
                             : "; greedy argmax never differs";
  LeakCheck k = make_check(std::move(name), worst, bound.threshold, detail + "; " + bound.note);
  k.per_position = std::move(per);
  k.diverges_at = diverges_at;
  return k;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::shared_ptr<const attn::PatternPredicate> naive_pattern(const nn::ModelConfig& c, int64_t nk) {
  if (!c.pattern.sparse()) return nullptr;
  return std::make_shared<const attn::PatternPredicate>(c.pattern, nk, /*causal=*/true);
}
std::shared_ptr<const attn::SparsePattern> model_pattern(const nn::ModelConfig& c) {
  return c.pattern.sparse() ? std::make_shared<const attn::SparsePattern>(c.pattern) : nullptr;
}

bool naive_visible(const NaiveSpec& s, int64_t b, int64_t i, int64_t j) {
  const int64_t p = s.Nk - s.Nq + i;
  if ((s.causal || s.window > 0) && j > p) return false;
  if (s.window > 0 && j <= p - s.window) return false;
  if (s.pattern && !s.pattern->allows(p, j)) return false;
  if (!s.key_valid.empty() && !s.key_valid[static_cast<size_t>(b * s.Nk + j)]) return false;
  if (!s.segment.empty() &&
      s.segment[static_cast<size_t>(b * s.Nk + p)] != s.segment[static_cast<size_t>(b * s.Nk + j)])
    return false;
  return true;
}

int64_t naive_attention(const NaiveSpec& s, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, std::vector<double>& out, std::vector<double>* weights) {
  const int64_t G = s.Hq / s.Hkv;
  const double scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  out.assign(static_cast<size_t>(s.B * s.Hq * s.Nq * s.Dv), 0.0);
  if (weights) weights->assign(static_cast<size_t>(s.B * s.Hq * s.Nq * s.Nk), 0.0);
  std::vector<double> logit(static_cast<size_t>(s.Nk)), a(static_cast<size_t>(s.Nk));
  std::vector<uint8_t> vis(static_cast<size_t>(s.Nk));
  int64_t empty_rows = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t kh = h / G;
      for (int64_t i = 0; i < s.Nq; ++i) {
        const double* qi = &q[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.D)];
        const int64_t p = s.Nk - s.Nq + i;
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Nk; ++j) {
          vis[j] = naive_visible(s, b, i, j);
          if (!vis[j]) continue;
          const double* kj = &k[static_cast<size_t>(((b * s.Hkv + kh) * s.Nk + j) * s.D)];
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += qi[d] * kj[d];
          logit[j] =
              dot * scale - (s.alibi.empty() ? 0.0 : s.alibi[static_cast<size_t>(h)] * static_cast<double>(p - j));
          mx = std::max(mx, logit[j]);
        }
        if (mx == -INFINITY) {  // no visible key: zero weights, zero output (attention.h)
          ++empty_rows;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < s.Nk; ++j) sum += a[j] = vis[j] ? std::exp(logit[j] - mx) : 0.0;
        double* o = &out[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.Dv)];
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (!vis[j]) continue;
          a[j] /= sum;
          if (weights) (*weights)[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.Nk + j)] = a[j];
          const double* vj = &v[static_cast<size_t>(((b * s.Hkv + kh) * s.Nk + j) * s.Dv)];
          for (int64_t d = 0; d < s.Dv; ++d) o[d] += a[j] * vj[d];
        }
      }
    }
  return empty_rows;
}

void naive_rope(std::vector<double>& x, int64_t B, int64_t H, int64_t N, int64_t D, const std::vector<int64_t>& pos,
                double theta) {
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        double* r = &x[static_cast<size_t>(((b * H + h) * N + n) * D)];
        const double p = static_cast<double>(pos[static_cast<size_t>(b * N + n)]);
        for (int64_t f = 0; f < half; ++f) {
          const double ang = p * std::pow(theta, -2.0 * static_cast<double>(f) / static_cast<double>(D));
          const double c = std::cos(ang), s = std::sin(ang), x1 = r[f], x2 = r[f + half];
          r[f] = x1 * c - x2 * s;
          r[f + half] = x2 * c + x1 * s;
        }
      }
}

std::vector<double> naive_alibi_slopes(int64_t H) {
  auto pow2_slopes = [](int64_t n) {
    std::vector<double> s;
    for (int64_t h = 0; h < n; ++h)
      s.push_back(std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(n)));
    return s;
  };
  int64_t P = 1;
  while (P * 2 <= H) P *= 2;
  std::vector<double> s = pow2_slopes(P);
  if (P == H) return s;
  const std::vector<double> more = pow2_slopes(2 * P);
  for (size_t i = 0; static_cast<int64_t>(s.size()) < H; i += 2) s.push_back(more[i]);
  return s;
}

}  // namespace leak

std::unique_ptr<nn::DecoderModel> copy_model(const nn::DecoderModel& model, const nn::ModelConfig& cfg) {
  auto out = std::make_unique<nn::DecoderModel>(cfg);
  out->set_attention_ops(model.attention_ops());  // the same attention (a planted fault included)
  out->set_bf16_autocast(model.bf16_autocast());  // the same precision (a model trained in bf16)
  out->to(model.device());                        // the copy runs where the model runs
  std::map<std::string, Tensor> src;
  for (const auto& p : model.named_parameters()) src[p.name] = p.tensor;
  autograd::NoGradGuard no_grad;
  for (const auto& p : out->named_parameters()) {
    auto it = src.find(p.name);
    QKV_CHECK(it != src.end(), "[leakcheck] model copy: parameter ", p.name, " is missing from the source model");
    QKV_CHECK(it->second.shape() == p.tensor.shape(), "[leakcheck] model copy: ", p.name, " is ",
              shape_str(it->second.shape()), " in the source but ", shape_str(p.tensor.shape()), " in the copy");
    copy_(p.tensor, it->second);
  }
  out->eval();
  return out;
}

std::vector<std::pair<std::string, std::string>> not_applicable_checks(const nn::ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  const attn::Pattern k = c.pattern.kind;
  if (k == attn::Pattern::global || k == attn::Pattern::bigbird || k == attn::Pattern::block_sparse) {
    // These patterns are anchored at absolute positions (global tokens, blocks): a left-padded or
    // packed sequence legitimately sees other keys than the same tokens alone.
    const std::string why = std::string("model.attention_pattern = ") + attn::pattern_name(k) +
                            " is anchored at absolute positions, so left padding and packing change what it sees";
    for (const char* n : {"padding_invariance", "padding_target_loss", "packing_invariance"}) out.emplace_back(n, why);
  }
  if (c.attention_pattern == nn::AttentionPattern::linear)
    out.emplace_back("mask.*",
                     "not applicable to model.attention_pattern = linear: it forms no softmax weights to mask "
                     "(reference_attention and its backward check it against naive float64 linear loops instead)");
  if (const std::string why = permutation_not_applicable(c); !why.empty())
    out.emplace_back("permutation_equivariance", why);
  return out;
}

std::vector<LeakCheck> run_model_checks(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  std::vector<LeakCheck> out;
  const auto skipped = not_applicable_checks(m->config());
  auto applies = [&](const std::string& name) {
    return std::none_of(skipped.begin(), skipped.end(), [&](const auto& s) { return s.first == name; });
  };
  const bool shift_invariant = applies("padding_invariance"), softmax = applies("mask.*");
  const auto& families = model_check_families();
  for (const auto& f : o.families)
    if (std::count(families.begin(), families.end(), f) == 0) {
      std::string known;
      for (const auto& k : families) known += (known.empty() ? "" : ", ") + k;
      fail("leakcheck: unknown check family '", f, "'; the families are: ", known);
    }
  auto guarded = [&](const char* family, auto&& fn) {
    if (!o.families.empty() && std::count(o.families.begin(), o.families.end(), family) == 0) return;
    try {
      for (auto& c : fn()) out.push_back(std::move(c));
    } catch (const std::exception& e) {
      out.push_back(leak::make_check(family, INFINITY, 0, std::string("error: ") + e.what()));
    }
  };
  using V = std::vector<LeakCheck>;
  guarded("future_token_perturbation", [&] { return V{check_future_perturbation(*m, o)}; });
  guarded("train_vs_inference", [&] { return check_train_vs_inference(*m, o); });
  if (shift_invariant) {  // else reported by not_applicable_checks
    guarded("padding", [&] { return check_padding(*m, o); });
    guarded("packing_invariance", [&] { return V{check_packing(*m, o)}; });
  }
  guarded("batch_composition", [&] { return V{check_batch_composition(*m, o)}; });
  guarded("thread_count", [&] { return V{check_thread_count(*m, o)}; });
  guarded("trainer_vs_sampler", [&] { return V{check_trainer_vs_sampler(*m, o)}; });
  guarded("batched_generation", [&] { return V{check_batched_generation(*m, o)}; });
  if (softmax) guarded("mask", [&] { return check_mask_semantics(*m, o); });
  guarded("reference_attention", [&] { return V{check_reference_attention(*m, o)}; });
  guarded("reference_attention_backward", [&] { return V{check_reference_attention_backward(*m, o)}; });
  guarded("kernel_probes", [&] { return V{check_kernel_probes(*m, o)}; });
  guarded("dropout_discipline", [&] { return V{check_dropout(*m, o)}; });
  if (applies("permutation_equivariance"))
    guarded("permutation_equivariance", [&] { return check_permutation_equivariance(*m, o); });
  return out;
}

const std::vector<std::string>& model_check_families() {
  static const std::vector<std::string> families = {"future_token_perturbation",
                                                    "train_vs_inference",
                                                    "padding",
                                                    "packing_invariance",
                                                    "batch_composition",
                                                    "thread_count",
                                                    "trainer_vs_sampler",
                                                    "batched_generation",
                                                    "mask",
                                                    "reference_attention",
                                                    "reference_attention_backward",
                                                    "kernel_probes",
                                                    "dropout_discipline",
                                                    "permutation_equivariance"};
  return families;
}

std::vector<std::pair<std::string, std::string>> not_applicable_checks(const nn::DecoderModel& model) {
  return not_applicable_checks(model.config());
}

}  // namespace qkv::analysis
