// Seed 1 §16: attention without positional information is permutation-equivariant (permuting the
// tokens permutes every layer's output), which is why position must be injected. Shown side by
// side with the cure: learned, sinusoidal, RoPE and ALiBi positions, or the causal mask, break the
// symmetry measurably. Also the leakcheck rows that state it for position = none models.
//
// Threshold: the two forwards reduce over keys in another order (and GEMMs may block the permuted
// rows differently), so equality holds to float32 rounding only. We use leakcheck's documented bound
// tol = u·sqrt(K)·(2 + 6·n_layer), u = 2^-24, K the longest reduction (analysis/leakcheck_internal.h):
// for the models here (n_embd 16, ffn 64, 12 tokens, 2 layers) 2^-24·8·14 ≈ 6.7e-6, relative to the
// largest output. A model with positions must move its outputs by far more than that: we assert
// > 1e-2 relative (measured 0.1-1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "analysis/leakcheck.h"
#include "analysis/leakcheck_internal.h"
#include "attention/attention.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

// The library's attention with the causal mask lifted: the decoder model as a bidirectional stack.
class NonCausal : public nn::AttentionOps {
 public:
  attn::AttentionOptions options(attn::AttentionOptions o, const nn::ModelConfig&, bool,
                                 nn::RngContext&) const override {
    o.causal = false;
    return o;
  }
};

nn::ModelConfig tiny(nn::Position pos, nn::Family family = nn::Family::gpt2) {
  nn::ModelConfig c;
  c.family = family;
  if (family == nn::Family::llama) {
    c.norm = nn::NormKind::rmsnorm;
    c.activation = nn::Activation::swiglu;
    c.bias = false;
    c.tie_embeddings = false;
  }
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 64;
  c.block_size = 12;
  c.vocab_size = 29;
  c.init_std = 0.3;  // attention far from uniform, so a positional signal is visible
  c.position = pos;
  return c;
}

const std::vector<int64_t> kIds{3, 17, 5, 28, 0, 11, 9, 21, 14, 2, 7, 25};
const std::vector<int64_t> kPerm{7, 2, 10, 0, 5, 11, 3, 9, 1, 4, 8, 6};  // no fixed point

// Logits and every block's output for one row of tokens, float64, [T, X] each.
std::vector<std::vector<double>> layer_outputs(const nn::DecoderModel& m, const std::vector<int64_t>& ids) {
  autograd::NoGradGuard ng;
  std::vector<Tensor> hidden;
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {1, static_cast<int64_t>(ids.size())});
  a.hidden = &hidden;
  std::vector<std::vector<double>> out{m.forward(a).to_vector()};
  for (const auto& h : hidden) out.push_back(h.to_vector());
  return out;
}

// max over logits and layers of max_t |out(π x)[t] − out(x)[π(t)]| / max|out(x)|
double equivariance_error(const nn::DecoderModel& m) {
  std::vector<int64_t> permuted(kIds.size());
  for (size_t t = 0; t < kIds.size(); ++t) permuted[t] = kIds[kPerm[t]];
  const auto base = layer_outputs(m, kIds), perm = layer_outputs(m, permuted);
  const size_t T = kIds.size();
  double worst = 0;
  for (size_t l = 0; l < base.size(); ++l) {
    const size_t X = base[l].size() / T;
    double num = 0, den = 0;
    for (size_t t = 0; t < T; ++t)
      for (size_t x = 0; x < X; ++x) {
        num = std::max(num, std::abs(perm[l][t * X + x] - base[l][kPerm[t] * X + x]));
        den = std::max(den, std::abs(base[l][t * X + x]));
      }
    REQUIRE(std::isfinite(num));
    worst = std::max(worst, num / den);
  }
  return worst;
}

std::unique_ptr<nn::DecoderModel> model(const nn::ModelConfig& c, bool causal) {
  auto m = std::make_unique<nn::DecoderModel>(c);
  m->init_weights(5);
  m->eval();
  if (!causal) m->set_attention_ops(std::make_shared<NonCausal>());
  return m;
}

}  // namespace

TEST_CASE("without positions and without a causal mask, permuting tokens permutes every layer's output",
          "[permutation]") {
  const double tol = analysis::leak::rounding_tolerance(tiny(nn::Position::none), 12);
  REQUIRE(tol == Approx(std::ldexp(1.0, -24) * 8 * 14));
  for (auto family : {nn::Family::gpt2, nn::Family::llama}) {
    const double err = equivariance_error(*model(tiny(nn::Position::none, family), /*causal=*/false));
    INFO(nn::family_name(family) << ": " << err << " (tolerance " << tol << ")");
    CHECK(err <= tol);
  }
}

TEST_CASE("positions (learned, sinusoidal, RoPE, ALiBi) or the causal mask break permutation equivariance",
          "[permutation]") {
  struct Case {
    const char* name;
    nn::Position pos;
    bool causal;
  };
  const Case cases[] = {{"learned", nn::Position::learned, false},
                        {"sinusoidal", nn::Position::sinusoidal, false},
                        {"rope", nn::Position::rope, false},
                        {"alibi", nn::Position::alibi, false},
                        {"none + causal mask", nn::Position::none, true}};
  for (const Case& c : cases)
    for (auto family : {nn::Family::gpt2, nn::Family::llama}) {
      const double err = equivariance_error(*model(tiny(c.pos, family), c.causal));
      INFO(c.name << " " << nn::family_name(family) << ": " << err);
      CHECK(err > 1e-2);
    }
}

TEST_CASE("a causal stack without positions: block 0 is blind to the order of earlier tokens, block 1 is not",
          "[permutation]") {
  // Position t of block 0 attends over {x_0..x_t} as a set; block 1 reads block 0's outputs at
  // j < s, and those saw different prefixes once tokens [0, s) are shuffled: the causal mask alone
  // gives a model without positions a sense of order.
  const auto m = model(tiny(nn::Position::none), /*causal=*/true);
  std::vector<int64_t> shuffled = kIds;
  const int64_t s = 6;
  std::reverse(shuffled.begin(), shuffled.begin() + s);
  const auto base = layer_outputs(*m, kIds), perm = layer_outputs(*m, shuffled);
  const double tol = analysis::leak::rounding_tolerance(m->config(), 12);
  for (size_t l = 1; l < base.size(); ++l) {  // [0] is the logits, then block 0, block 1
    const size_t X = base[l].size() / 12;
    double num = 0, den = 0;
    for (size_t e = s * X; e < base[l].size(); ++e) {
      num = std::max(num, std::abs(perm[l][e] - base[l][e]));
      den = std::max(den, std::abs(base[l][e]));
    }
    INFO("block " << l - 1 << ": " << num / den);
    if (l == 1) CHECK(num / den <= tol);
    if (l == 2) CHECK(num / den > 1e-2);
  }
}

TEST_CASE("the attention op alone: rows permuted with q, k, v permute the output; causal does not", "[permutation]") {
  const int64_t N = 70;  // two query blocks and two key tiles of the fused kernel
  const Tensor q = randn({1, 2, N, 8}, 1, 0, 0.0, 2.0), k = randn({1, 2, N, 8}, 2, 0, 0.0, 2.0),
               v = randn({1, 2, N, 8}, 3);
  std::vector<int64_t> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.end());
  std::rotate(perm.begin(), perm.begin() + 5, perm.end());
  const Tensor idx = from_vector_i64(perm, {N});
  auto P = [&](const Tensor& t) { return index_select(t, 2, idx); };
  for (bool causal : {false, true}) {
    attn::AttentionOptions o;
    o.causal = causal;
    const Tensor want = P(attn::attention(q, k, v, o));
    const Tensor got = attn::attention(P(q), P(k), P(v), o);
    const double rel = analysis::leak::max_delta(got, want) / analysis::leak::max_abs(want);
    INFO("causal " << causal << ": " << rel);
    // One attention layer: K = max(D, N) = 70, three reductions (scores, softmax sum, weighted sum).
    if (!causal) CHECK(rel <= std::ldexp(1.0, -24) * std::sqrt(70.0) * 3);
    if (causal) CHECK(rel > 1e-2);
  }
}

TEST_CASE("leakcheck's permutation_equivariance applies to position = none models only, and catches a position leak",
          "[permutation][leakcheck][long]") {
  analysis::LeakCheckOptions o;
  auto find = [](const std::vector<analysis::LeakCheck>& v, const std::string& name) {
    for (const auto& c : v)
      if (c.name == name) return c;
    FAIL("no check named " << name);
    return analysis::LeakCheck{};
  };
  SECTION("position = none: both rows present and passing, in run_model_checks") {
    for (auto family : {nn::Family::gpt2, nn::Family::llama}) {
      const auto m = model(tiny(nn::Position::none, family), true);
      CHECK(analysis::permutation_not_applicable(m->config()).empty());
      const auto checks = analysis::run_model_checks(*m, o);
      const auto eq = find(checks, "permutation_equivariance"),
                 prefix = find(checks, "permutation_equivariance.causal_prefix");
      INFO(eq.detail << "\n" << prefix.detail);
      CHECK(eq.pass);
      CHECK(prefix.pass);
      CHECK(eq.threshold == Approx(analysis::leak::rounding_tolerance(m->config(), 12)));
      CHECK(prefix.detail.find("finding: ") == 0);
      for (const auto& c : checks) {
        INFO(c.name << " " << c.value << " " << c.detail);
        CHECK(c.pass);
      }
    }
  }
  SECTION("positions or a window: not applicable, said why, and absent from run_model_checks") {
    for (auto pos : {nn::Position::learned, nn::Position::sinusoidal, nn::Position::rope, nn::Position::alibi}) {
      const auto m = model(tiny(pos), true);
      CHECK(analysis::permutation_not_applicable(m->config()).find("model.position") != std::string::npos);
      for (const auto& c : analysis::run_model_checks(*m, o)) CHECK(c.name.rfind("permutation", 0) != 0);
      CHECK_THROWS_WITH(analysis::check_permutation_equivariance(*m, o), Catch::Contains("does not apply"));
    }
    auto c = tiny(nn::Position::none);
    c.window = 4;
    CHECK(analysis::permutation_not_applicable(c).find("model.window") != std::string::npos);
  }
  SECTION("a planted position signal (ALiBi slopes slipped into the options) fails both rows") {
    class LeakPosition : public nn::AttentionOps {
     public:
      attn::AttentionOptions options(attn::AttentionOptions o, const nn::ModelConfig& c, bool,
                                     nn::RngContext&) const override {
        o.alibi_slopes.assign(static_cast<size_t>(c.n_head), 0.5f);
        return o;
      }
    };
    const auto m = model(tiny(nn::Position::none), true);
    m->set_attention_ops(std::make_shared<LeakPosition>());
    const auto checks = analysis::check_permutation_equivariance(*m, o);
    REQUIRE(checks.size() == 2);
    for (const auto& c : checks) {
      INFO(c.name << " " << c.value);
      CHECK(!c.pass);
      CHECK(c.value > 100 * c.threshold);
    }
  }
}
