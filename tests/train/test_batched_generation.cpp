// Batched generation (train/sampler.h generate_batch, nn ForwardArgs::row_caches): under
// numerics = invariant a prompt's completion and log-probs are exactly those of decoding it alone,
// whatever the batch size, row, or the other prompts beside it. References: the batch-1 cached
// forward, train::generate on the prompt alone, and token_logprobs on the whole sequence's forward.
#include <catch2/catch.hpp>
#include <cstring>

#include "autograd/grad_mode.h"
#include "model_fixtures.h"
#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "train/bench.h"
#include "train/evaluate.h"
#include "train/sampler.h"

using namespace qkv;
using test::tokens;

namespace {

nn::ModelConfig gpt2_like() { return test::ragged_gpt2(/*ffn_hidden=*/200, /*block_size=*/64); }
nn::ModelConfig llama_like() { return test::ragged_llama(/*ffn_hidden=*/200, /*block_size=*/64); }

nn::ModelConfig linear_like() {
  nn::ModelConfig c = llama_like();
  c.attention_pattern = nn::AttentionPattern::linear;
  return c;
}

Tensor ids_of(const std::vector<int32_t>& ids, int64_t from, int64_t n) {
  std::vector<int64_t> v(ids.begin() + from, ids.begin() + from + n);
  return from_vector_i64(v, {1, n});
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data<float>(), y.data<float>(), x.numel() * sizeof(float)) == 0;
}

std::unique_ptr<nn::DecoderModel> make_model(const nn::ModelConfig& c) { return test::eval_model(c, 7); }

// Prompts of lengths 1..: 3, 17, 1, 9, 30, 5, ... (more than any batch size below).
std::vector<std::vector<int32_t>> prompts_for(int64_t n, int64_t vocab) {
  const int64_t lengths[] = {3, 17, 1, 9, 30, 5, 12, 2, 21, 7, 14};
  std::vector<std::vector<int32_t>> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(tokens(lengths[i % 11], 40 + static_cast<uint64_t>(i), vocab));
  return p;
}

}  // namespace

TEST_CASE("row caches: each row's logits are bitwise its batch-1 cached forward's", "[invariant][exact][sample]") {
  const NumericsGuard mode(Numerics::invariant);
  autograd::NoGradGuard ng;
  for (const nn::ModelConfig& mc : {gpt2_like(), llama_like(), linear_like()}) {
    INFO("family " << nn::family_name(mc.family) << ", linear "
                   << (mc.attention_pattern == nn::AttentionPattern::linear));
    auto m = make_model(mc);
    // Three rows with contexts of 5, 19 and 1 tokens, then steps of T = 1 and T = 3 tokens per row.
    const int64_t prefix[] = {5, 19, 1};
    std::vector<std::vector<int32_t>> seqs;
    std::vector<nn::ModelCache> rows, alone;
    for (int64_t b = 0; b < 3; ++b) {
      seqs.push_back(tokens(prefix[b] + 4, 3 + static_cast<uint64_t>(b), mc.vocab_size));
      for (auto* set : {&rows, &alone}) {
        set->push_back(m->make_cache(1, 32));
        nn::ForwardArgs a;
        a.ids = ids_of(seqs[b], 0, prefix[b]);
        a.cache = &set->back();
        m->forward(a);
      }
    }
    int64_t done = 0;
    for (const int64_t T : {int64_t{1}, int64_t{3}}) {
      INFO("T " << T);
      std::vector<int64_t> ids;
      nn::ForwardArgs batched;
      for (int64_t b = 0; b < 3; ++b) {
        for (int64_t t = 0; t < T; ++t) ids.push_back(seqs[b][static_cast<size_t>(prefix[b] + done + t)]);
        batched.row_caches.push_back(&rows[static_cast<size_t>(b)]);
      }
      batched.ids = from_vector_i64(ids, {3, T});
      const Tensor logits = m->forward(batched);
      REQUIRE(logits.shape() == Shape{3, T, mc.vocab_size});
      for (int64_t b = 0; b < 3; ++b) {
        INFO("row " << b);
        nn::ForwardArgs a;
        a.ids = ids_of(seqs[b], prefix[b] + done, T);
        a.cache = &alone[static_cast<size_t>(b)];
        CHECK(bitwise_equal(logits.select(0, b), m->forward(a).select(0, 0)));
        CHECK(rows[static_cast<size_t>(b)].length() == prefix[b] + done + T);
      }
      done += T;
    }
    // One more step (one more token per row, contexts 9, 23, 5) against an independent reference:
    // row 1's whole sequence in one uncached forward (softmax attention; linear attention's
    // chunked whole-sequence op is another algorithm than its recurrent step).
    if (mc.attention_pattern == nn::AttentionPattern::linear) continue;
    nn::ForwardArgs whole, last;
    last.ids = from_vector_i64({seqs[0][8], seqs[1][22], seqs[2][4]}, {3, 1});
    last.row_caches = {&rows[0], &rows[1], &rows[2]};
    std::vector<int32_t> longer = seqs[1];
    longer.push_back(seqs[1][22]);
    whole.ids = ids_of(longer, 0, static_cast<int64_t>(longer.size()));
    const Tensor ref = m->forward(whole).select(0, 0).select(0, static_cast<int64_t>(longer.size()) - 1);
    CHECK(bitwise_equal(m->forward(last).select(0, 1).select(0, 0), ref));
  }
}

TEST_CASE("row caches refuse a count mismatch, a shared cache or key padding beside them", "[sample]") {
  auto m = make_model(gpt2_like());
  autograd::NoGradGuard ng;
  nn::ModelCache a = m->make_cache(1, 8), b = m->make_cache(1, 8);
  nn::ForwardArgs f;
  f.ids = from_vector_i64({1, 2}, {2, 1});
  f.row_caches = {&a};
  CHECK_THROWS_WITH(m->forward(f), Catch::Contains("row_caches has 1 caches for 2 rows"));
  f.row_caches = {&a, &b};
  f.cache = &a;
  CHECK_THROWS_WITH(m->forward(f), Catch::Contains("not both"));
  f.cache = nullptr;
  f.key_padding = from_vector_i64({1, 1}, {2, 1}, DType::boolean);
  CHECK_THROWS_WITH(m->forward(f), Catch::Contains("key_padding"));
  CHECK(a.length() == 0);
}

TEST_CASE("generate_batch, greedy, invariant: each prompt's tokens are generate's for it alone",
          "[invariant][exact][sample]") {
  const NumericsGuard mode(Numerics::invariant);
  for (const nn::ModelConfig& mc : {gpt2_like(), llama_like()}) {
    INFO("family " << nn::family_name(mc.family));
    auto m = make_model(mc);
    const auto prompts = prompts_for(11, mc.vocab_size);
    train::SampleOptions o;
    o.temperature = 0;
    o.max_new_tokens = 9;
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) alone.push_back(train::generate(*m, p, o));
    for (const int64_t B : {1, 3, 8}) {
      INFO("batch " << B);
      std::vector<size_t> order;
      const auto got = train::generate_batch(*m, prompts, o, B, false,
                                             [&](size_t i, const train::Completion&) { order.push_back(i); });
      REQUIRE(got.size() == prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        INFO("prompt " << i);
        CHECK(got[i].tokens == alone[i]);
        CHECK(got[i].logprobs.empty());
      }
      std::vector<size_t> want(prompts.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = i;
      CHECK(order == want);  // reported in prompt order
    }
  }
}

TEST_CASE("sample log-probs are token_logprobs of the whole sequence's logits, bit for bit (invariant)",
          "[invariant][exact][sample]") {
  const NumericsGuard mode(Numerics::invariant);
  auto m = make_model(llama_like());
  const int64_t V = m->config().vocab_size;
  const auto prompts = prompts_for(5, V);
  train::SampleOptions o;
  o.temperature = 0.9;
  o.max_new_tokens = 6;
  const auto batched = train::generate_batch(*m, prompts, o, 3, /*logprobs=*/true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    // generate, alone, with the prompt's draw stream: the same tokens and log-probs.
    train::SampleOptions oi = o;
    oi.stream = static_cast<uint32_t>(i);
    std::vector<double> lp;
    const auto toks = train::generate(*m, prompts[i], oi, {}, &lp);
    CHECK(toks == batched[i].tokens);
    CHECK(lp == batched[i].logprobs);
    // The reference: the whole sequence (prompt + tokens but the last) in one forward, and
    // token_logprobs on the rows that predicted the generated tokens.
    std::vector<int32_t> seq = prompts[i];
    seq.insert(seq.end(), toks.begin(), toks.end() - 1);
    autograd::NoGradGuard ng;
    nn::ForwardArgs a;
    a.ids = ids_of(seq, 0, static_cast<int64_t>(seq.size()));
    const auto P = static_cast<int64_t>(prompts[i].size());
    const Tensor rows = m->forward(a).select(0, 0).narrow(0, P - 1, o.max_new_tokens);
    const std::vector<double> want = train::token_logprobs(rows, toks);
    CHECK(batched[i].logprobs == want);
    for (double x : want) CHECK(x <= 0);
  }
}

TEST_CASE("a sampled completion does not depend on the batch size or the row it ran in", "[invariant][sample]") {
  const NumericsGuard mode(Numerics::invariant);
  auto m = make_model(gpt2_like());
  auto prompts = prompts_for(7, m->config().vocab_size);
  train::SampleOptions o;
  o.temperature = 1.3;
  o.top_k = 50;
  o.max_new_tokens = 8;
  o.seed = 99;
  const auto ref = train::generate_batch(*m, prompts, o, 1);
  for (const int64_t B : {2, 5, 7}) {
    INFO("batch " << B);
    const auto got = train::generate_batch(*m, prompts, o, B);
    for (size_t i = 0; i < prompts.size(); ++i) CHECK(got[i].tokens == ref[i].tokens);
  }
  // Prompts draw from their own streams: two copies of one prompt sample different completions
  // (with 8 tokens at temperature 1.3 over 50 ids, equal ones would be a broken stream).
  prompts[1] = prompts[0];
  const auto same = train::generate_batch(*m, prompts, o, 4);
  CHECK(same[0].tokens == ref[0].tokens);
  CHECK(same[1].tokens != same[0].tokens);
}

TEST_CASE("generate_batch refuses a context past block_size, an empty prompt and batch size 0", "[sample]") {
  auto m = make_model(gpt2_like());  // block_size 64
  train::SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 10;
  std::vector<std::vector<int32_t>> prompts = {tokens(4, 1, 259), tokens(55, 2, 259)};
  // 55 + 10 - 1 = 64 fits exactly; 56 does not.
  CHECK(train::generate_batch(*m, prompts, o, 2)[1].tokens.size() == 10);
  prompts[1].push_back(0);
  CHECK_THROWS_WITH(train::generate_batch(*m, prompts, o, 2),
                    Catch::Contains("prompt 1: 56 tokens") && Catch::Contains("model.block_size 64"));
  prompts[1].clear();
  CHECK_THROWS_WITH(train::generate_batch(*m, prompts, o, 2), Catch::Contains("prompt 1 encodes to no tokens"));
  CHECK_THROWS_WITH(train::generate_batch(*m, {tokens(3, 1, 259)}, o, 0), Catch::Contains("batch size must be >= 1"));
  o.max_new_tokens = 0;
  CHECK(train::generate_batch(*m, {tokens(3, 1, 259)}, o, 1)[0].tokens.empty());
}

TEST_CASE("bench --what batch: the consistency count is 1 in the invariant mode", "[sample][bench]") {
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 32;
  c.model.vocab_size = 64;
  c.data.random_tokens = true;
  train::BatchBenchOptions o;
  o.prompts = 5;
  o.batch_size = 3;
  o.max_new_tokens = 6;
  o.count = 20;
  const train::BatchBenchResult r = train::bench_batch(c, o);
  REQUIRE(r.runs.size() == 2);
  CHECK(r.runs[0].batch_size == 1);
  CHECK(r.runs[1].batch_size == 3);
  CHECK(r.runs[0].tokens == 5 * 6);
  CHECK(r.runs[1].tokens == 5 * 6);
  CHECK(r.speedup > 0);
  CHECK(r.trials == 20);
  CHECK(r.distinct_invariant == 1);
  CHECK(r.distinct_logprobs_invariant == 1);
  CHECK(r.distinct_standard >= 1);
  CHECK(r.distinct_logprobs_standard >= r.distinct_standard);
}

TEST_CASE("standard numerics: a row decoded among others differs from it alone (the checks above are not vacuous)",
          "[invariant][sample]") {
  // Wide enough that the batch's GEMM (M = 4 rows) and the lone row's GEMV sum in other orders.
  nn::ModelConfig mc = gpt2_like();
  mc.n_embd = 256;
  mc.ffn_hidden = 1024;
  auto m = make_model(mc);
  autograd::NoGradGuard ng;
  auto gap = [&] {
    std::vector<nn::ModelCache> rows, alone;
    for (int64_t b = 0; b < 4; ++b)
      for (auto* set : {&rows, &alone}) {
        set->push_back(m->make_cache(1, 32));
        nn::ForwardArgs a;
        a.ids = ids_of(tokens(10, 60 + static_cast<uint64_t>(b), mc.vocab_size), 0, 10);
        a.cache = &set->back();
        m->forward(a);
      }
    double worst = 0;
    for (int64_t step = 0; step < 8; ++step) {
      const std::vector<int32_t> next = tokens(4, 90 + static_cast<uint64_t>(step), mc.vocab_size);
      nn::ForwardArgs batched;
      batched.ids = from_vector_i64(std::vector<int64_t>(next.begin(), next.end()), {4, 1});
      for (auto& c : rows) batched.row_caches.push_back(&c);
      const Tensor logits = m->forward(batched);
      nn::ForwardArgs one;
      one.ids = ids_of(next, 0, 1);
      one.cache = &alone[0];
      worst = std::max(worst, max_abs_diff(logits.select(0, 0), m->forward(one).select(0, 0)));
    }
    return worst;
  };
  double standard = 0, invariant = 0;
  {
    const NumericsGuard mode(Numerics::standard);
    standard = gap();
  }
  {
    const NumericsGuard mode(Numerics::invariant);
    invariant = gap();
  }
  CHECK(standard > 0);
  CHECK(standard < 1e-3);
  CHECK(invariant == 0.0);
}
