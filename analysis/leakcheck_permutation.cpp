// Permutation equivariance (seed 1 §16): attention reads its keys as a set, so a model with no
// positional information (position = none, no window) cannot tell token order. Two checks, both on
// the seeded probe (leakcheck.h states them):
//   permutation_equivariance  the model with its causal mask lifted (its own attention ops wrapped,
//       so a planted fault stays in): permuting the probe's tokens permutes every layer's output and
//       the logits, to float32 rounding.
//   permutation_equivariance.causal_prefix  the model as it runs (causal): shuffling tokens [0, s)
//       leaves the first block's output at positions t >= s unchanged, to float32 rounding (its
//       attention sees {x_0..x_t} as a bag). The deeper blocks are NOT checked but measured: they
//       read the first block's outputs at positions < s, which do change (position j < s sees a
//       different prefix), so a causal stack of >= 2 blocks can tell order without positions; the
//       detail reports how much (a finding about the model, not a leak).
// Neither is exact: a permuted key order sums the softmax and the weighted values in another order.
#include <algorithm>
#include <numeric>

#include "tensor/ops.h"
#include "analysis/leakcheck_internal.h"

namespace qkv::analysis {

using leak::fmt;
using leak::max_abs;
using leak::max_delta;

namespace {

// The model's attention ops with the causal mask lifted (window too: a sliding window is itself
// positional, and models with one are not checked).
class LiftCausal : public nn::AttentionOps {
 public:
  explicit LiftCausal(std::shared_ptr<const nn::AttentionOps> inner) : inner_(std::move(inner)) {}
  Tensor rope(const Tensor& x, const Tensor& positions, double theta, int64_t cached) const override {
    return inner_->rope(x, positions, theta, cached);
  }
  attn::AttentionOptions options(attn::AttentionOptions o, const nn::ModelConfig& cfg, bool training,
                                 nn::RngContext& rng) const override {
    o = inner_->options(std::move(o), cfg, training, rng);
    o.causal = false;
    o.window = 0;
    return o;
  }
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& o) const override {
    return inner_->attention(q, k, v, o);
  }
  Tensor attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                          const attn::AttentionOptions& o) const override {
    return inner_->attention_packed(qkv, q_heads, kv_heads, o);
  }
  attn::AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const attn::AttentionOptions& o) const override {
    return inner_->attention_with_weights(q, k, v, o);
  }

 private:
  std::shared_ptr<const nn::AttentionOps> inner_;
};

// A seeded shuffle of [0, n) (Fisher-Yates on a 64-bit LCG) that moves every element when n > 1.
std::vector<int64_t> shuffle(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  uint64_t s = seed | 1;
  for (int64_t i = n - 1; i > 0; --i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    std::swap(p[i], p[(s >> 33) % static_cast<uint64_t>(i + 1)]);
  }
  for (int64_t i = 0; i < n; ++i)  // a fixed point would compare a position with itself
    if (p[i] == i) std::swap(p[i], p[(i + 1) % n]);
  return p;
}

// Logits and every layer's output of one forward of `rows`.
std::vector<Tensor> outputs(const nn::DecoderModel& m, const std::vector<std::vector<int64_t>>& rows) {
  std::vector<Tensor> hidden;
  nn::ForwardArgs a;
  a.ids = leak::ids_tensor(rows);
  a.hidden = &hidden;
  std::vector<Tensor> outs{leak::forward(m, a)};
  outs.insert(outs.end(), hidden.begin(), hidden.end());
  for (auto& t : outs) t = t.to(Device::cpu).to(DType::f64).contiguous();
  return outs;
}

// Row r, positions [from, L), of a [R, L, X] tensor, rows gathered by `order` when given.
Tensor rows_of(const Tensor& t, int64_t r, int64_t from, const std::vector<int64_t>* order = nullptr) {
  Tensor row = t.narrow(0, r, 1).squeeze(0);  // [L, X]
  if (order) row = index_select(row, 0, from_vector_i64(*order, {static_cast<int64_t>(order->size())}));
  return row.narrow(0, from, row.size(0) - from).contiguous();
}

std::string where(size_t i) { return i == 0 ? "logits" : "layer " + std::to_string(i - 1); }

}  // namespace

std::string permutation_not_applicable(const nn::ModelConfig& c) {
  if (c.position != nn::Position::none)
    return "the model has positions (model.position is not \"none\"): order is visible by design";
  if (c.window > 0) return "model.window > 0: a sliding window is positional information";
  if (c.attention_pattern != nn::AttentionPattern::full)
    return "model.attention_pattern is not full: the checks lift the softmax attention's causal mask";
  if (c.block_size < 3) return "model.block_size < 3: no prefix to permute";
  return "";
}

std::vector<LeakCheck> check_permutation_equivariance(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const nn::ModelConfig& c = model.config();
  const std::string why = permutation_not_applicable(c);
  QKV_CHECK(why.empty(), "[leakcheck] permutation_equivariance does not apply: ", why);
  const int64_t L = leak::probe_len(c, o);
  QKV_CHECK(L >= 3, "[leakcheck] permutation_equivariance needs a probe of >= 3 tokens, got ", L);
  const double tol = leak::rounding_tolerance(c, L);
  const auto probe = leak::probe_rows(c, o, 1, L, 7)[0];
  std::vector<LeakCheck> out;

  {  // every layer equivariant, causal mask lifted
    auto lifted = copy_model(model, c);
    lifted->set_attention_ops(std::make_shared<LiftCausal>(model.attention_ops()));
    const std::vector<int64_t> pi = shuffle(L, o.seed);
    std::vector<int64_t> permuted(static_cast<size_t>(L));
    for (int64_t t = 0; t < L; ++t) permuted[t] = probe[pi[t]];
    const auto base = outputs(*lifted, {probe}), perm = outputs(*lifted, {permuted});
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      const Tensor want = rows_of(base[i], 0, 0, &pi);  // (π h)[t] = h[π(t)]
      const double rel = leak::ratio(max_delta(rows_of(perm[i], 0, 0), want), max_abs(want));
      if (rel > worst) worst = rel, worst_i = i;
    }
    out.push_back(leak::make_check("permutation_equivariance", worst, tol,
                                   "causal mask lifted: max over logits and " + std::to_string(base.size() - 1) +
                                       " layers of max|h(pi x) - pi h(x)| / max|h| for a seeded shuffle of the " +
                                       std::to_string(L) + "-token probe (worst at " + where(worst_i) + "); " +
                                       leak::rounding_tolerance_note(c, L)));
  }
  {  // as the model runs (causal): the first block at t >= s blind to the order of tokens [0, s)
    const leak::EvalModel m(model);
    std::vector<int64_t> cuts{2, std::max<int64_t>(2, L / 4), std::max<int64_t>(2, L / 2), L - 1};
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::vector<int64_t>> rows{probe};
    for (size_t r = 0; r < cuts.size(); ++r) {
      const std::vector<int64_t> pi = shuffle(cuts[r], o.seed + 1 + r);
      std::vector<int64_t> row = probe;
      for (int64_t t = 0; t < cuts[r]; ++t) row[t] = probe[pi[t]];
      rows.push_back(row);
    }
    const auto outs = outputs(*m, rows);  // logits, then block 0, 1, ...
    // Checked: block 0 (and the logits of a one-block model, a per-position function of it).
    // Reported: the deeper blocks, which see block 0's outputs at positions < s, and those differ.
    double first = 0, deeper = 0;
    std::string at = "layer 0", deeper_at;
    for (size_t i = 0; i < outs.size(); ++i)
      for (size_t r = 0; r < cuts.size(); ++r) {
        const Tensor want = rows_of(outs[i], 0, cuts[r]);
        const double rel =
            leak::ratio(max_delta(rows_of(outs[i], static_cast<int64_t>(r) + 1, cuts[r]), want), max_abs(want));
        const bool checked = i == 1 || (i == 0 && c.n_layer == 1);
        const std::string here = where(i) + ", prefix " + std::to_string(cuts[r]);
        if (checked && rel > first) first = rel, at = here;
        if (!checked && i > 0 && rel > deeper) deeper = rel, deeper_at = here;
      }
    std::string cut_list;
    for (size_t r = 0; r < cuts.size(); ++r) cut_list += (r ? ", " : "") + std::to_string(cuts[r]);
    const std::string finding =
        c.n_layer == 1 ? "finding: a one-block causal model with no positions reads its context as a bag of tokens "
                         "and cannot tell order; set model.position to learn it"
                       : "finding: deeper blocks do tell order (max relative change " + fmt(deeper) + " at " +
                             deeper_at + "): the causal mask alone leaks position into a model with none";
    out.push_back(leak::make_check("permutation_equivariance.causal_prefix", first, tol,
                                   finding + "; checked: block 0" + (c.n_layer == 1 ? " and logits" : "") +
                                       " at positions t >= s unchanged when tokens [0, s) are shuffled, s in {" +
                                       cut_list + "} (worst at " + at + "); " + leak::rounding_tolerance_note(c, L)));
  }
  return out;
}

}  // namespace qkv::analysis
