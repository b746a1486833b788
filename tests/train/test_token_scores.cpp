// Per-token log-probabilities (`qkv eval --per-token`, train/evaluate.h): each against a float64
// log-softmax of the same logits, and under numerics = invariant the scores of a text equal, bit
// for bit, those computed from KV-cache decoding one token at a time.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "autograd/grad_mode.h"
#include "model_fixtures.h"
#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "train/evaluate.h"

using namespace qkv;

namespace {

// Head size 18, vocabulary 67, windows of 16.
std::unique_ptr<nn::DecoderModel> small_model() {
  return test::eval_model(test::gpt2_config(/*n_head=*/2, /*n_embd=*/36, /*ffn_hidden=*/144, /*vocab_size=*/67,
                                            /*block_size=*/16),
                          3);
}

}  // namespace

TEST_CASE("token_logprobs is z[t] - logsumexp(z) of each row", "[eval][per_token]") {
  const Tensor z = randn({5, 67}, 9, 0, 0.0, 3.0, DType::f32);
  const std::vector<int32_t> t = {0, 66, 3, 3, 40};
  const auto lp = train::token_logprobs(z, t);
  const auto zv = z.to_vector();
  for (int64_t i = 0; i < 5; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < 67; ++v) m = std::max(m, zv[i * 67 + v]);
    for (int64_t v = 0; v < 67; ++v) s += std::exp(zv[i * 67 + v] - m);
    CHECK(lp[i] == Approx(zv[i * 67 + t[i]] - m - std::log(s)).margin(1e-5));
  }
  CHECK_THROWS_WITH(train::token_logprobs(z, {0, 67, 1, 1, 1}), Catch::Contains("target 67 at row 1"));
  CHECK_THROWS_WITH(train::token_logprobs(z, {0}), Catch::Contains("need [N, V]"));
}

TEST_CASE("score_tokens scores every target of full and partial windows against a float64 log-softmax",
          "[eval][per_token]") {
  const auto model = small_model();
  const nn::DecoderModel& m = *model;
  const int64_t T = m.config().block_size;
  const auto tokens = test::stride_tokens(2 * (T + 1) + 6, m.config().vocab_size);  // two full windows and 6 more
  const auto s = train::score_tokens(m, tokens, "test");
  REQUIRE(s.logprob.size() == static_cast<size_t>(2 * T + 5));
  autograd::NoGradGuard ng;
  size_t k = 0;
  for (int64_t start = 0; start + 1 < static_cast<int64_t>(tokens.size()); start += T + 1) {
    const int64_t len = std::min<int64_t>(T + 1, static_cast<int64_t>(tokens.size()) - start);
    std::vector<int64_t> ids(tokens.begin() + start, tokens.begin() + start + len - 1);
    nn::ForwardArgs a;
    a.ids = from_vector_i64(ids, {1, len - 1});
    const auto z = m.forward(a).to(DType::f64).to_vector();
    const int64_t V = m.config().vocab_size;
    for (int64_t i = 0; i + 1 < len; ++i, ++k) {
      CHECK(s.index[k] == start + 1 + i);
      CHECK(s.token[k] == tokens[start + 1 + i]);
      double mx = -INFINITY, sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, z[i * V + v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(z[i * V + v] - mx);
      CHECK(s.logprob[k] == Approx(z[i * V + tokens[start + 1 + i]] - mx - std::log(sum)).margin(1e-5));
    }
  }
  CHECK(k == s.logprob.size());
  CHECK_THROWS_WITH(train::score_tokens(m, std::vector<int32_t>{4}, "one.txt"), Catch::Contains("one.txt"));
}

TEST_CASE("under invariant numerics the scores equal KV-cache decoding's log-probs bit for bit",
          "[eval][per_token][invariant][exact]") {
  const auto model = small_model();
  const nn::DecoderModel& m = *model;
  const auto tokens = test::stride_tokens(14, m.config().vocab_size);
  for (Numerics mode : {Numerics::invariant, Numerics::standard}) {
    const NumericsGuard guard(mode);
    const auto s = train::score_tokens(m, tokens, "test");
    autograd::NoGradGuard ng;
    nn::ModelCache cache = m.make_cache(1, 16);
    double worst = 0;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      nn::ForwardArgs a;
      a.cache = &cache;
      a.ids = from_vector_i64({tokens[i]}, {1, 1});
      const auto lp = train::token_logprobs(m.forward(a).select(0, 0), {tokens[i + 1]});
      worst = std::max(worst, std::abs(lp[0] - s.logprob[i]));
    }
    if (mode == Numerics::invariant) CHECK(worst == 0.0);
    else CHECK(worst < 1e-5);
  }
}
