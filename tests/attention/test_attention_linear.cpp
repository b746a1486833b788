// Linear attention (attention/linear/linear_attention.h) against a naive float64 reference: explicit
// loops of O_i = Σ_{j visible} (Φ_i·Ψ_j) v_j / (Σ_{j visible} Φ_i·Ψ_j + ε), with no state, no chunks
// and no BLAS; its gradients by central differences of the same loops.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attention/linear/linear_attention.h"
#include "analysis/leakcheck.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "compare_util.h"
#include "bench/attention_bench.h"
#include "nn/transformer.h"
#include "tensor/allocator.h"
#include "tensor/ops.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/optimizer.h"

using namespace qkv;
using attn::LinearAttentionOptions;
using attn::LinearFeature;

namespace {

struct Dims {
  int64_t B, Hq, Hkv, Nq, Nk, D;
};

// φ of one row x (already scaled), by the header's definitions.
std::vector<double> phi_ref(const std::vector<double>& x, LinearFeature f, const std::vector<double>& W, int64_t m) {
  const int64_t D = static_cast<int64_t>(x.size());
  std::vector<double> out;
  if (f == LinearFeature::favor) {
    double sq = 0;
    for (double t : x) sq += t * t;
    for (int64_t r = 0; r < m; ++r) {
      double u = 0;
      for (int64_t d = 0; d < D; ++d) u += W[r * D + d] * x[d];
      out.push_back(std::exp(u - sq / 2) / std::sqrt(static_cast<double>(m)));
    }
  } else {
    for (double t : x) out.push_back(f == LinearFeature::relu ? std::max(t, 0.0) : (t > 0 ? t + 1 : std::exp(t)));
  }
  return out;
}

// The naive reference: q, k, v as flat row-major float64 vectors.
std::vector<double> naive(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                          const Dims& d, const LinearAttentionOptions& o, const std::vector<double>& W,
                          const std::vector<bool>& valid, const std::vector<double>& seg = {}) {
  const int64_t D = d.D, Dv = d.D, G = d.Hq / d.Hkv;
  const int64_t m = o.feature == LinearFeature::favor ? static_cast<int64_t>(W.size()) / D : D;
  const double rs = std::sqrt(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D)));
  auto row = [&](const std::vector<double>& t, int64_t H, int64_t N, int64_t b, int64_t h, int64_t i) {
    std::vector<double> x(D);
    for (int64_t e = 0; e < D; ++e) x[e] = rs * t[((b * H + h) * N + i) * D + e];
    return x;
  };
  std::vector<double> out(d.B * d.Hq * d.Nq * Dv, 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.Nq; ++i) {
        const std::vector<double> fq = phi_ref(row(q, d.Hq, d.Nq, b, h, i), o.feature, W, m);
        double den = o.eps;
        std::vector<double> num(Dv, 0.0);
        for (int64_t j = 0; j < d.Nk; ++j) {
          if (o.causal && j > i) continue;
          if (!valid.empty() && !valid[b * d.Nk + j]) continue;
          if (!seg.empty() && seg[b * d.Nk + j] != seg[b * d.Nk + i]) continue;
          const std::vector<double> fk = phi_ref(row(k, d.Hkv, d.Nk, b, h / G, j), o.feature, W, m);
          double w = 0;
          for (int64_t r = 0; r < m; ++r) w += fq[r] * fk[r];
          den += w;
          for (int64_t e = 0; e < Dv; ++e) num[e] += w * v[((b * d.Hkv + h / G) * d.Nk + j) * Dv + e];
        }
        for (int64_t e = 0; e < Dv; ++e) out[((b * d.Hq + h) * d.Nq + i) * Dv + e] = num[e] / den;
      }
  return out;
}

struct Case {
  Dims d;
  LinearAttentionOptions o;
  std::vector<bool> valid;
  std::vector<double> W, seg;
  Tensor q, k, v;
};

// Segments (causal only), as packed documents: row 0 runs [0, 3) [3, 7) [7, N) (a start on a
// chunk boundary of 3 and one inside a chunk), row 1 runs [0, 5) [5, 6) [6, N) (a one-token run).
Case make_case(const Dims& d, LinearFeature f, bool causal, int64_t chunk, bool padding, uint64_t seed,
               DType dtype = DType::f64, bool segments = false) {
  Case c;
  c.d = d;
  c.o.feature = f;
  c.o.causal = causal;
  c.o.chunk = chunk;
  if (f == LinearFeature::favor) {
    c.o.projection = attn::favor_projection(6, d.D, seed + 17);
    c.W = c.o.projection.to_vector();
  }
  if (padding) {
    // row 0: last key padded; row 1: keys 1 and 2 padded (inside the sequence)
    Tensor kp = Tensor::empty({d.B, d.Nk}, DType::boolean);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t j = 0; j < d.Nk; ++j) {
        const bool ok = b % 2 == 0 ? j != d.Nk - 1 : (j != 1 && j != 2);
        kp.data<bool>()[b * d.Nk + j] = ok;
        c.valid.push_back(ok);
      }
    c.o.key_padding = kp;
  }
  if (segments) {
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t j = 0; j < d.Nk; ++j)
        c.seg.push_back(b % 2 == 0 ? (j < 3 ? 0 : j < 7 ? 1 : 2) : (j < 5 ? 9 : j < 6 ? 4 : 8));
    c.o.segment_ids = from_vector(c.seg, {d.B, d.Nk}, DType::i64);
  }
  c.q = randn({d.B, d.Hq, d.Nq, d.D}, seed, 0, 0.0, 1.0, dtype);
  c.k = randn({d.B, d.Hkv, d.Nk, d.D}, seed + 1, 0, 0.0, 1.0, dtype);
  c.v = randn({d.B, d.Hkv, d.Nk, d.D}, seed + 2, 0, 0.0, 1.0, dtype);
  return c;
}

std::string label(LinearFeature f, bool causal, int64_t chunk, bool gqa, bool pad) {
  return cat(attn::linear_feature_name(f), causal ? " causal" : " non-causal", " chunk ", chunk, gqa ? " GQA" : " MHA",
             pad ? " padded" : "");
}

const LinearFeature kFeatures[] = {LinearFeature::elu1, LinearFeature::relu, LinearFeature::favor};

}  // namespace

TEST_CASE("linear attention forward equals the naive float64 formula", "[attention][linear]") {
  // N = 13 spans several chunks of 3 (the last one partial), one chunk of 13 (c = N), the
  // recurrence (c = 1) and a chunk larger than N.
  uint64_t seed = 100;
  for (LinearFeature f : kFeatures)
    for (bool causal : {false, true})
      for (bool gqa : {false, true})
        for (bool pad : {false, true})
          for (bool seg : {false, true})
            for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(13), int64_t(64)}) {
              if (seg && !causal) continue;
              const Dims d{2, gqa ? 4 : 2, 2, 13, 13, 4};
              const Case c = make_case(d, f, causal, chunk, pad, seed += 5, DType::f32, seg);
              INFO(label(f, causal, chunk, gqa, pad) << (seg ? " segments" : ""));
              const Tensor out = attn::linear_attention(c.q, c.k, c.v, c.o);
              test::check_close(out,
                                naive(c.q.to_vector(), c.k.to_vector(), c.v.to_vector(), d, c.o, c.W, c.valid, c.seg),
                                1e-5, 1e-6);
            }
}

TEST_CASE("linear attention: many chunks and a long sequence in float32", "[attention][linear][long]") {
  // N = 300 with c = 64: four full chunks and a partial one, every query reading the prefix state.
  for (LinearFeature f : kFeatures) {
    const Dims d{1, 2, 1, 300, 300, 8};
    const Case c = make_case(d, f, true, 64, false, 500 + static_cast<uint64_t>(f), DType::f32);
    INFO(attn::linear_feature_name(f));
    test::check_close(attn::linear_attention(c.q, c.k, c.v, c.o),
                      naive(c.q.to_vector(), c.k.to_vector(), c.v.to_vector(), d, c.o, c.W, c.valid), 1e-4, 1e-6);
  }
}

TEST_CASE("linear attention backward equals central differences of the naive formula", "[attention][linear][slow]") {
  uint64_t seed = 700;
  for (LinearFeature f : kFeatures)
    for (bool causal : {false, true})
      for (bool gqa : {false, true})
        for (bool pad : {false, true})
          for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(8)})
            for (bool seg : {false, true}) {
              if (!causal && (chunk != 3 || seg)) continue;  // chunks and segments only shape the causal form
              const Dims d{2, gqa ? 4 : 2, 2, causal ? 8 : 5, 8, 3};
              Case c = make_case(d, f, causal, chunk, pad, seed += 5, DType::f64, seg);
              INFO(label(f, causal, chunk, gqa, pad) << (seg ? " segments" : ""));
              c.q.set_requires_grad(true);
              c.k.set_requires_grad(true);
              c.v.set_requires_grad(true);
              const Tensor out = attn::linear_attention(c.q, c.k, c.v, c.o);
              REQUIRE(out.grad_fn());
              CHECK(std::string(out.grad_fn()->name()) == "LinearAttentionBackward");
              const Tensor u = randn(out.shape(), seed + 3, 0, 0.0, 1.0, DType::f64);
              autograd::backward(out, u);
              const std::vector<double> uv = u.to_vector();
              std::vector<double> x[3] = {c.q.to_vector(), c.k.to_vector(), c.v.to_vector()};
              auto loss = [&] {
                const std::vector<double> o = naive(x[0], x[1], x[2], d, c.o, c.W, c.valid, c.seg);
                double s = 0;
                for (size_t e = 0; e < o.size(); ++e) s += uv[e] * o[e];
                return s;
              };
              const Tensor* grads[3] = {&c.q, &c.k, &c.v};
              for (int a = 0; a < 3; ++a) {
                std::vector<double> want(x[a].size());
                for (size_t e = 0; e < x[a].size(); ++e) {
                  const double keep = x[a][e], h = 1e-6;
                  x[a][e] = keep + h;
                  const double lp = loss();
                  x[a][e] = keep - h;
                  const double lm = loss();
                  x[a][e] = keep;
                  want[e] = (lp - lm) / (2 * h);
                }
                INFO("input "
                     << "qkv"[a]);
                test::check_close(grads[a]->grad(), want, 1e-5, 1e-6);
              }
            }
}

TEST_CASE("linear attention: padded keys contribute nothing, values past them do not matter", "[attention][linear]") {
  const Dims d{2, 2, 2, 9, 9, 4};
  for (LinearFeature f : kFeatures)
    for (bool causal : {false, true}) {
      Case c = make_case(d, f, causal, 4, true, 910, DType::f32);
      const std::vector<double> before = attn::linear_attention(c.q, c.k, c.v, c.o).to_vector();
      // batch row 1, key 2 is padded: change its k and v wildly
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t e = 0; e < 4; ++e) {
          c.k.data<float>()[((1 * 2 + h) * 9 + 2) * 4 + e] = 37.0f;
          c.v.data<float>()[((1 * 2 + h) * 9 + 2) * 4 + e] = -91.0f;
        }
      CHECK(attn::linear_attention(c.q, c.k, c.v, c.o).to_vector() == before);
    }
}

TEST_CASE("linear attention: favor features estimate the softmax kernel exp(x·y)", "[attention][linear]") {
  // E_w[φ(x)·φ(y)] = exp(xᵀy): with m = 20000 features the estimate is within a few percent.
  const int64_t D = 4, m = 20000;
  const Tensor W = attn::favor_projection(m, D, 3);
  const std::vector<double> w = W.to_vector();
  const std::vector<double> x = {0.3, -0.2, 0.5, 0.1}, y = {0.4, 0.1, -0.3, 0.6};
  const std::vector<double> fx = phi_ref(x, LinearFeature::favor, w, m), fy = phi_ref(y, LinearFeature::favor, w, m);
  double est = 0, exact = 0;
  for (int64_t r = 0; r < m; ++r) est += fx[r] * fy[r];
  for (int64_t e = 0; e < D; ++e) exact += x[e] * y[e];
  CHECK(est == Approx(std::exp(exact)).epsilon(0.03));
  // One query, one key: O = w·v / (w + ε) = v up to ε / w.
  LinearAttentionOptions o;
  o.feature = LinearFeature::favor;
  o.projection = W.narrow(0, 0, 8).contiguous();
  o.scale = 1;
  const Tensor q = from_vector(x, {1, 1, 1, D}, DType::f64), k = from_vector(y, {1, 1, 1, D}, DType::f64);
  const Tensor v = from_vector({1.5, -2, 0.25, 4}, {1, 1, 1, D}, DType::f64);
  const std::vector<double> got = attn::linear_attention(q, k, v, o).to_vector();
  for (int e = 0; e < D; ++e) CHECK(got[e] == Approx(v.to_vector()[e]).epsilon(1e-5));
  // The model's W is a pure function of (m, D, layer): never redrawn.
  CHECK(attn::favor_projection_for_layer(8, 4, 2).to_vector() == attn::favor_projection_for_layer(8, 4, 2).to_vector());
  CHECK(attn::favor_projection_for_layer(8, 4, 2).to_vector() != attn::favor_projection_for_layer(8, 4, 3).to_vector());
}

TEST_CASE("linear attention: the recurrent state continues the causal forward", "[attention][linear]") {
  // Prompt of 5 as one chunk, then tokens one by one, then a chunk of 3: equal to the parallel
  // causal forward over all 13, with and without padding, under GQA; the state never grows.
  for (LinearFeature f : kFeatures)
    for (bool pad : {false, true}) {
      const Dims d{2, 4, 2, 13, 13, 4};
      const Case c = make_case(d, f, true, 4, pad, 1300 + static_cast<uint64_t>(f), DType::f32);
      const std::vector<double> want = attn::linear_attention(c.q, c.k, c.v, c.o).to_vector();
      attn::LinearState st(2, 4, 2, 4, 4, c.o);
      const int64_t bytes = st.state_bytes();
      std::vector<double> got(want.size());
      int64_t t = 0;
      for (int64_t n : {5, 1, 1, 1, 1, 1, 3}) {
        const Tensor kp = pad ? c.o.key_padding.narrow(1, t, n).contiguous() : Tensor();
        const Tensor o = st.step(c.q.narrow(2, t, n), c.k.narrow(2, t, n), c.v.narrow(2, t, n), kp);
        const std::vector<double> ov = o.to_vector();
        for (int64_t bh = 0; bh < 8; ++bh)
          for (int64_t i = 0; i < n; ++i)
            for (int64_t e = 0; e < 4; ++e) got[(bh * 13 + t + i) * 4 + e] = ov[(bh * n + i) * 4 + e];
        t += n;
        CHECK(st.state_bytes() == bytes);
      }
      CHECK(st.length() == 13);
      INFO(attn::linear_feature_name(f) << (pad ? " padded" : ""));
      test::check_close(from_vector(got, {static_cast<int64_t>(got.size())}, DType::f64), want, 1e-5, 1e-7);
    }
}

TEST_CASE("linear attention refuses bad input with one line naming it", "[attention][linear]") {
  const Tensor q = randn({1, 2, 4, 3}, 1), k = randn({1, 2, 5, 3}, 2), v = randn({1, 2, 5, 3}, 3);
  LinearAttentionOptions o;
  o.causal = true;
  CHECK_THROWS_WITH(attn::linear_attention(q, k, v, o), Catch::Contains("Nq == Nk"));
  o.causal = false;
  o.chunk = 0;
  CHECK_THROWS_WITH(attn::linear_attention(q, k, v, o), Catch::Contains("chunk"));
  o.chunk = 4;
  o.key_padding = Tensor::empty({1, 4}, DType::boolean);
  CHECK_THROWS_WITH(attn::linear_attention(q, k, v, o), Catch::Contains("key_padding"));
  o.key_padding = Tensor();
  o.feature = LinearFeature::favor;
  CHECK_THROWS_WITH(attn::linear_attention(q, k, v, o), Catch::Contains("projection"));
  CHECK_THROWS_WITH(attn::parse_linear_feature("softmax", "model.linear_feature"),
                    Catch::Contains("model.linear_feature"));
  CHECK_THROWS_WITH(attn::linear_attention(randn({1, 3, 4, 3}, 1), k, v), Catch::Contains("multiple"));
}

TEST_CASE("linear attention: a query that sees no valid key gets 0, not NaN", "[attention][linear]") {
  // Causal with the first two keys padded: rows 0 and 1 see nothing.
  const Tensor q = randn({1, 1, 4, 3}, 1, 0, 0.0, 1.0, DType::f64), k = randn({1, 1, 4, 3}, 2, 0, 0.0, 1.0, DType::f64),
               v = randn({1, 1, 4, 3}, 3, 0, 0.0, 1.0, DType::f64);
  LinearAttentionOptions o;
  o.causal = true;
  o.key_padding = from_vector({0, 0, 1, 1}, {1, 4}, DType::boolean);
  const std::vector<double> out = attn::linear_attention(q, k, v, o).to_vector();
  for (int e = 0; e < 6; ++e) CHECK(out[e] == 0.0);
  for (double x : out) CHECK(std::isfinite(x));
}

TEST_CASE("linear attention memory grows linearly in N, never N × N", "[attention][linear]") {
  // Allocator peak of one causal forward + backward (inputs, output, den, gradients and the kernels'
  // scratch, which comes from the allocator) at N and 4N: about 4x, where N × N weights would be 16x.
  auto peak = [](int64_t n) {
    Tensor q = randn({1, 2, n, 16}, 1), k = randn({1, 2, n, 16}, 2), v = randn({1, 2, n, 16}, 3);
    q.set_requires_grad(true);
    k.set_requires_grad(true);
    v.set_requires_grad(true);
    LinearAttentionOptions o;
    o.causal = true;
    const int64_t before = allocator_stats().bytes_in_use;
    reset_peak_bytes();
    autograd::backward(attn::linear_attention(q, k, v, o), randn({1, 2, n, 16}, 4));
    return allocator_stats().peak_bytes - before;
  };
  const int64_t p1 = peak(1024), p4 = peak(4096);
  std::printf("[linear] peak bytes fwd+bwd: N=1024 %lld, N=4096 %lld (ratio %.2f)\n", static_cast<long long>(p1),
              static_cast<long long>(p4), static_cast<double>(p4) / static_cast<double>(p1));
  CHECK(p4 < 5 * p1);
  CHECK(p4 > 3 * p1);
  CHECK(p4 < 4096 * 4096 * 4);  // less than one float32 N × N matrix
}

TEST_CASE("qkv bench --pattern linear rows carry pattern, kernel and kept pairs", "[attention][linear][bench]") {
  attn::AttentionBenchOptions o;
  o.linear = true;
  o.ns = {64, 128};
  o.hkvs = {2};
  o.heads = 2;
  o.head_dims = {8};
  o.repeats = 1;
  o.threads = 1;
  const auto rows = attn::bench_attention(o);
  REQUIRE(rows.size() == 2);
  for (const auto& r : rows) {
    CHECK(r.pattern == "linear");
    CHECK(r.kernel == "linear");
    CHECK(r.kept_pairs == o.batch * o.heads * r.n * (r.n + 1) / 2);  // over the whole problem, as full causal's
    CHECK(r.peak_bytes > 0);
  }
}

// ---- The model: config keys, decode through the recurrent state, training ----

namespace {

// A linear-attention model through the config: V 37, C 32, Hq 4, T 32; llama (RoPE, GQA 4:2) or
// gpt2 (learned positions, packed c_attn).
Config linear_config(const std::string& family, const std::string& feature, int64_t chunk = 5) {
  Config cfg;
  apply_override(cfg, "model.family=" + family);
  cfg.model.vocab_size = 37;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = 2;
  cfg.model.n_embd = 32;
  cfg.model.block_size = 32;
  cfg.model.ffn_multiple_of = 16;
  cfg.model.init_std = 0.2;
  apply_override(cfg, "model.attention_pattern=linear");
  apply_override(cfg, "model.linear_feature=" + feature);
  cfg.model.linear_chunk = chunk;
  return cfg;
}

std::vector<int64_t> lcg(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return v;
}

double rel(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double d = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::isfinite(x[i]));
    d = std::max(d, std::abs(x[i] - y[i]));
    s = std::max(s, std::abs(y[i]));
  }
  return d / s;
}

}  // namespace

TEST_CASE("model.attention_pattern = linear: keys, defaults and refused combinations", "[attention][linear][config]") {
  Config cfg = linear_config("llama", "favor");
  nn::ModelConfig m = train::model_config(cfg, 37);
  CHECK(m.attention_pattern == nn::AttentionPattern::linear);
  CHECK(m.linear_feature == attn::LinearFeature::favor);
  CHECK(m.linear_features == 8);  // 0 -> the head size
  CHECK(m.linear_chunk == 5);
  // Defaults: full softmax attention, elu1, chunk 64 (what an old checkpoint's config reads as).
  CHECK(train::model_config(Config{}, 65).attention_pattern == nn::AttentionPattern::full);
  CHECK(Config{}.model.linear_feature == attn::LinearFeature::elu1);
  CHECK(Config{}.model.linear_chunk == 64);
  // A changed linear setting is a different model (checkpoints and --resume compare it).
  Config other = cfg;
  other.model.linear_chunk = 7;
  auto d = train::model_difference(m, train::model_config(other, 37));
  REQUIRE(d);
  CHECK(d->key == "model.linear_chunk");
  other = cfg;
  other.model.attention_pattern = AttentionChoice{};  // full, without the keys only linear uses
  other.model.linear_feature = Config{}.model.linear_feature;
  other.model.linear_chunk = Config{}.model.linear_chunk;
  d = train::model_difference(m, train::model_config(other, 37));
  REQUIRE(d);
  CHECK(d->key == "model.attention_pattern");
  // Combinations that have no meaning without softmax weights: one line naming the key.
  auto refuses = [&](const std::function<void(Config&)>& set, const std::string& key) {
    Config bad = linear_config("llama", "elu1");
    set(bad);
    CHECK_THROWS_WITH(train::model_config(bad, 37), Catch::Contains(key));
  };
  refuses([](Config& c) { c.model.position = nn::Position::alibi; }, "model.position");
  refuses([](Config& c) { c.model.attn_dropout = 0.1; }, "model.attn_dropout");
  refuses([](Config& c) { c.model.window = 4; }, "model.window");
  refuses([](Config& c) { c.model.attn_kernel = attn::Kernel::reference; }, "model.attn_kernel");
  refuses([](Config& c) { c.model.linear_chunk = 0; }, "model.linear_chunk");
  // Unknown spellings are refused as they are read, naming the key.
  Config bad = linear_config("llama", "elu1");
  CHECK_THROWS_WITH(apply_override(bad, "model.linear_feature=softmax"), Catch::Contains("model.linear_feature"));
  CHECK_THROWS_WITH(apply_override(bad, "model.attention_pattern=quadratic"),
                    Catch::Contains("model.attention_pattern"));
}

TEST_CASE("a linear model decodes through its recurrent state: equal to the parallel forward, constant memory",
          "[attention][linear][model]") {
  for (const char* family : {"llama", "gpt2"})
    for (const char* feature : {"elu1", "relu", "favor"}) {
      auto m = train::build_model(linear_config(family, feature), 37);
      m->init_weights(21);
      m->eval();
      const int64_t T = 23;  // chunks of 5: four full and a partial one
      const Tensor ids = from_vector_i64(
          [&] {
            auto a = lcg(T, 37, 1);
            auto b = lcg(T, 37, 2);
            a.insert(a.end(), b.begin(), b.end());
            return a;
          }(),
          {2, T});
      autograd::NoGradGuard no_grad;
      nn::ForwardArgs full_args;
      full_args.ids = ids;
      const Tensor full = m->forward(full_args);
      nn::ModelCache cache = m->make_cache(2, T);
      REQUIRE(cache.layers.empty());
      REQUIRE(cache.linear.size() == 2);
      const int64_t bytes = cache.bytes();
      CHECK(m->make_cache(2, 4 * T).bytes() == bytes);  // no capacity-sized buffer
      std::vector<Tensor> parts;
      int64_t t = 0;
      for (int64_t n : {4, 1, 1, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
        nn::ForwardArgs a;
        a.ids = ids.narrow(1, t, n).contiguous();
        a.cache = &cache;
        parts.push_back(m->forward(a));
        t += n;
        CHECK(cache.length() == t);
        CHECK(cache.bytes() == bytes);  // does not grow with the length
      }
      REQUIRE(t == T);
      const double e = rel(cat(parts, 1), full);
      std::printf("[linear] decode %-5s %-5s: recurrent state vs parallel forward rel %.2e, state %lld bytes\n", family,
                  feature, e, static_cast<long long>(bytes));
      CHECK(e < 1e-5);
    }
}

TEST_CASE("a linear model with packed documents equals each document alone", "[attention][linear][model]") {
  auto m = train::build_model(linear_config("llama", "elu1", 3), 37);
  m->init_weights(5);
  m->eval();
  const std::vector<int64_t> d1 = lcg(4, 37, 7), d2 = lcg(6, 37, 8);
  std::vector<int64_t> ids(d1);
  ids.insert(ids.end(), d2.begin(), d2.end());
  autograd::NoGradGuard no_grad;
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {1, 10});
  a.positions = from_vector_i64({0, 1, 2, 3, 0, 1, 2, 3, 4, 5}, {1, 10});
  a.segment_ids = from_vector_i64({0, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {1, 10});
  const Tensor packed = m->forward(a);
  nn::ForwardArgs b;
  b.ids = from_vector_i64(d2, {1, 6});
  const Tensor alone = m->forward(b);
  CHECK(rel(packed.narrow(1, 4, 6).contiguous(), alone) < 1e-5);
}

TEST_CASE("a tiny linear model trains: the loss falls with each feature map", "[attention][linear][model][slow]") {
  for (const char* feature : {"elu1", "relu", "favor"}) {
    Config cfg = linear_config("llama", feature, 8);
    auto model = train::build_model(cfg, 37);
    model->init_weights(1337);
    // A repeating sequence: predictable from the previous tokens.
    std::vector<int64_t> seq;
    for (int64_t i = 0; i < 4 * 33; ++i) seq.push_back((i * 7 + i / 5) % 37);
    std::vector<int64_t> x, y;
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t t = 0; t < 32; ++t) {
        x.push_back(seq[r * 33 + t]);
        y.push_back(seq[r * 33 + t + 1]);
      }
    const Tensor ids = from_vector_i64(x, {4, 32}), targets = from_vector_i64(y, {4, 32});
    std::vector<train::OptimParam> ps;
    for (const auto& p : model->named_parameters()) ps.push_back({p.name, p.tensor, p.decay});
    train::AdamWOptions opts;
    opts.lr = 3e-3;
    train::AdamW opt(ps, opts);
    std::vector<double> losses;
    for (int step = 0; step < 40; ++step) {
      nn::ForwardArgs a;
      a.ids = ids;
      Tensor loss = ag::cross_entropy(ag::reshape(model->forward(a), {-1, 37}), targets.reshape({-1}));
      losses.push_back(loss.item());
      autograd::zero_grad(model->parameters());
      autograd::backward(loss);
      opt.step();
    }
    std::printf("[linear] train %-5s: loss %.4f -> %.4f after 40 steps\n", feature, losses[0], losses.back());
    CHECK(std::isfinite(losses.back()));
    CHECK(losses.back() < 0.7 * losses[0]);
  }
}

// ---- leakcheck ----

namespace {

const analysis::LeakCheck* find_check(const std::vector<analysis::LeakCheck>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("leakcheck: a linear model passes every applicable check; the softmax ones are reported not applicable",
          "[attention][linear][leakcheck]") {
  for (const char* feature : {"elu1", "relu", "favor"}) {
    Config cfg = linear_config("llama", feature, 4);
    cfg.model.block_size = 16;
    auto m = train::build_model(cfg, 37);
    m->init_weights(3);
    m->eval();
    const auto checks = analysis::run_model_checks(*m, {});
    for (const char* name : {"future_token_perturbation", "kv_decode", "chunked_prefill", "greedy_generation",
                             "padding_invariance", "padding_target_loss", "packing_invariance", "reference_attention",
                             "reference_attention_backward", "kernel_probes", "dropout_discipline", "batch_composition",
                             "thread_count", "trainer_vs_sampler", "batched_generation"}) {
      const analysis::LeakCheck* c = find_check(checks, name);
      INFO(feature << " " << name);
      REQUIRE(c);
      INFO(c->value << " (threshold " << c->threshold << "): " << c->detail);
      CHECK(c->pass);
    }
    CHECK(checks.size() == 15);
    CHECK(find_check(checks, "future_token_perturbation")->value == 0.0);  // exactly: no future key is read
    CHECK(find_check(checks, "greedy_generation")->value == 0.0);
    CHECK(find_check(checks, "reference_attention")->value < 1e-5);  // vs the naive float64 linear loop
    // mask.* for linear attention, and the permutation checks (the model has positions)
    const auto na = analysis::not_applicable_checks(*m);
    REQUIRE(na.size() == 2);
    CHECK(na[0].first == "mask.*");
    CHECK(na[0].second.find("not applicable") != std::string::npos);
    CHECK(na[1].first == "permutation_equivariance");
  }
  // A softmax model has no mask.* entry (only the permutation checks, as it has positions).
  const auto softmax_na = analysis::not_applicable_checks(*train::build_model(Config{}, 65));
  REQUIRE(softmax_na.size() == 1);
  CHECK(softmax_na[0].first == "permutation_equivariance");
}

TEST_CASE("leakcheck: a causal chunk that reads its own later keys is caught", "[attention][linear][leakcheck]") {
  Config cfg = linear_config("llama", "elu1", 4);
  cfg.model.block_size = 16;
  auto m = train::build_model(cfg, 37);
  m->init_weights(3);
  m->eval();
  const analysis::PlantedFault planted(*m, analysis::Fault::linear_chunk_future);
  const auto checks = analysis::run_model_checks(*m, {});
  for (const char* name : {"future_token_perturbation", "kv_decode", "chunked_prefill", "reference_attention",
                           "reference_attention_backward"}) {
    const analysis::LeakCheck* c = find_check(checks, name);
    REQUIRE(c);
    INFO(name << " = " << c->value << " (threshold " << c->threshold << "): " << c->detail);
    CHECK_FALSE(c->pass);
    CHECK(c->value > 10 * std::max(c->threshold, 1e-7));
  }
}

// ---- CUDA ----

TEST_CASE("linear attention on the GPU equals the CPU kernel, forward and backward", "[attention][linear][cuda]") {
  if (!test::cuda_device_present()) return;
  uint64_t seed = 4000;
  for (LinearFeature f : kFeatures)
    for (bool causal : {false, true})
      for (int variant = 0; variant < 3; ++variant) {  // plain, key padding, key padding + segments
        if (!causal && variant == 2) continue;
        for (int64_t chunk : {int64_t(3), int64_t(13)}) {
          const Dims d{2, 4, 2, causal ? 13 : 9, 13, 4};
          const DType dt = variant == 1 ? DType::f32 : DType::f64;
          Case c = make_case(d, f, causal, chunk, variant > 0, seed += 5, dt, variant == 2);
          INFO(label(f, causal, chunk, true, variant > 0)
               << (variant == 2 ? " segments" : "") << " " << (dt == DType::f32 ? "f32" : "f64"));
          const Tensor u = randn({d.B, d.Hq, d.Nq, d.D}, seed + 3, 0, 0.0, 1.0, dt);
          auto run = [&](Device dev) {
            Tensor q = c.q.to(dev), k = c.k.to(dev), v = c.v.to(dev);
            q.set_requires_grad(true);
            k.set_requires_grad(true);
            v.set_requires_grad(true);
            const Tensor out = attn::linear_attention(q, k, v, c.o);
            CHECK(out.device() == dev);
            autograd::backward(out, u.to(dev));
            return std::vector<Tensor>{out.to(Device::cpu), q.grad().to(Device::cpu), k.grad().to(Device::cpu),
                                       v.grad().to(Device::cpu)};
          };
          const std::vector<Tensor> cpu = run(Device::cpu), gpu = run(Device::cuda);
          const double tol = dt == DType::f32 ? 1e-4 : 1e-10;
          const char* names[] = {"out", "dq", "dk", "dv"};
          for (int a = 0; a < 4; ++a) {
            INFO(names[a]);
            // float32: both kernels round; dq cancels (dnum·S against dden·z), so the absolute
            // tolerance scales with the largest element
            const std::vector<double> want = cpu[a].to_vector();
            double scale = 0;
            for (double x : want) scale = std::max(scale, std::abs(x));
            test::check_close(gpu[a], want, tol, tol * scale);
          }
        }
      }
  // The planted fault reaches the GPU kernel too (it reads the chunk's later keys).
  Case c = make_case({1, 2, 1, 8, 8, 4}, LinearFeature::elu1, true, 4, false, 77, DType::f64);
  c.o.chunk_key_hi = c.o.chunk;  // a wrong in-chunk rule: every key of the chunk
  const std::vector<double> want = attn::linear_attention(c.q, c.k, c.v, c.o).to_vector();
  test::check_close(
      attn::linear_attention(c.q.to(Device::cuda), c.k.to(Device::cuda), c.v.to(Device::cuda), c.o).to(Device::cpu),
      want, 1e-10, 1e-12);
  c.o.chunk_key_hi = 1;
  CHECK(rel(attn::linear_attention(c.q, c.k, c.v, c.o), from_vector(want, c.q.shape(), DType::f64)) > 1e-3);
}

TEST_CASE("a linear model on the GPU: forward, backward and recurrent decode equal the CPU's",
          "[attention][linear][cuda]") {
  if (!test::cuda_device_present()) return;
  for (const char* feature : {"elu1", "favor"}) {
    auto cpu = train::build_model(linear_config("llama", feature, 3), 37);
    cpu->init_weights(9);
    auto gpu = train::build_model(linear_config("llama", feature, 3), 37);
    gpu->init_weights(9);
    gpu->to(Device::cuda);
    const Tensor ids = from_vector_i64(lcg(2 * 7, 37, 3), {2, 7});
    auto loss_and_grad = [&](nn::DecoderModel& m) {
      nn::ForwardArgs a;
      a.ids = ids;
      const Tensor logits = m.forward(a);
      autograd::backward(ag::sum(logits));
      return std::make_pair(logits.to(Device::cpu), m.named_parameters()[1].tensor.grad().to(Device::cpu));
    };
    const auto [lc, gc] = loss_and_grad(*cpu);
    const auto [lg, gg] = loss_and_grad(*gpu);
    INFO(feature);
    CHECK(rel(lg, lc) < 1e-5);
    CHECK(rel(gg, gc) < 1e-4);
    // Decode on the device through the recurrent state, token by token.
    autograd::NoGradGuard no_grad;
    gpu->eval();
    nn::ModelCache cache = gpu->make_cache(2, 7);
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < 7; ++t) {
      nn::ForwardArgs a;
      a.ids = ids.narrow(1, t, 1).contiguous();
      a.cache = &cache;
      parts.push_back(gpu->forward(a).to(Device::cpu));
    }
    CHECK(rel(cat(parts, 1), lc) < 1e-5);
  }
}
