// Cross-attention (nn/cross_attention.h) against a naive float64 formula written here as explicit
// loops (projections, per-head masked softmax, output projection; RoPE by the rotate-half rule):
// outputs, and gradients w.r.t. x, the memory and every parameter, the latter by central
// differences of the naive formula. Cases cover Nq ≠ Nk both ways, padded memory rows (bool mask and
// lengths), GQA/MQA, RoPE on request, large logits over several key tiles, and bad input.
#include <catch2/catch.hpp>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/registry.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "examples/reverse_task.h"
#include "nn/cross_attention.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

// Sizes and masks of one naive evaluation.
struct Spec {
  int64_t B = 2, Nq = 3, Nk = 5, C = 8, Cm = 6, Hq = 2, Hkv = 2, hd = 4;
  bool bias = true, rope = false;
  double theta = 10000.0;
  std::vector<int> valid;  // [B*Nk], empty = every memory row real
};

// The inputs in a fixed order: x, memory, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b (biases empty when off).
using Inputs = std::vector<std::vector<double>>;

std::vector<Shape> input_shapes(const Spec& s) {
  const int64_t qd = s.Hq * s.hd, kvd = s.Hkv * s.hd;
  return {
      {s.B, s.Nq, s.C}, {s.B, s.Nk, s.Cm}, {qd, s.C}, {qd}, {kvd, s.Cm}, {kvd}, {kvd, s.Cm}, {kvd}, {s.C, qd}, {s.C}};
}

Inputs random_inputs(const Spec& s, uint64_t seed, double weight_std) {
  Inputs in;
  const auto shapes = input_shapes(s);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const bool is_bias = i >= 2 && i % 2 == 1;
    if (is_bias && !s.bias) {
      in.emplace_back();
      continue;
    }
    const double std = i < 2 ? 1.0 : (is_bias ? 0.3 : weight_std);
    in.push_back(randn(shapes[i], seed + i, 0, 0.0, std, DType::f64).to_vector());
  }
  return in;
}

// y[b, n, o] = Σ_c a[b, n, c] W[o, c] + bias[o]
std::vector<double> naive_linear(const std::vector<double>& a, int64_t rows, int64_t in, const std::vector<double>& W,
                                 const std::vector<double>& bias, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias.empty() ? 0.0 : bias[o];
      for (int64_t c = 0; c < in; ++c) acc += a[r * in + c] * W[o * in + c];
      y[r * out + o] = acc;
    }
  return y;
}

// Rotate-half RoPE on rows [B, N, H·hd] at positions 0..N-1.
void naive_rope(std::vector<double>& t, int64_t B, int64_t N, int64_t H, int64_t hd, double theta) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        double* r = &t[((b * N + n) * H + h) * hd];
        for (int64_t f = 0; f < hd / 2; ++f) {
          const double ang = static_cast<double>(n) * std::pow(theta, -2.0 * f / static_cast<double>(hd));
          const double x1 = r[f], x2 = r[f + hd / 2];
          r[f] = x1 * std::cos(ang) - x2 * std::sin(ang);
          r[f + hd / 2] = x2 * std::cos(ang) + x1 * std::sin(ang);
        }
      }
}

// out [B, Nq, C] of the formula in nn/cross_attention.h.
std::vector<double> naive_cross(const Spec& s, const Inputs& in) {
  const int64_t qd = s.Hq * s.hd, kvd = s.Hkv * s.hd, G = s.Hq / s.Hkv;
  std::vector<double> Q = naive_linear(in[0], s.B * s.Nq, s.C, in[2], in[3], qd);
  std::vector<double> K = naive_linear(in[1], s.B * s.Nk, s.Cm, in[4], in[5], kvd);
  const std::vector<double> V = naive_linear(in[1], s.B * s.Nk, s.Cm, in[6], in[7], kvd);
  if (s.rope) {
    naive_rope(Q, s.B, s.Nq, s.Hq, s.hd, s.theta);
    naive_rope(K, s.B, s.Nk, s.Hkv, s.hd, s.theta);
  }
  std::vector<double> A(static_cast<size_t>(s.B * s.Nq * qd), 0.0), logit(static_cast<size_t>(s.Nk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        const int64_t g = h / G;
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (!s.valid.empty() && !s.valid[b * s.Nk + j]) continue;
          double dot = 0;
          for (int64_t d = 0; d < s.hd; ++d)
            dot += Q[(b * s.Nq + i) * qd + h * s.hd + d] * K[(b * s.Nk + j) * kvd + g * s.hd + d];
          logit[j] = dot / std::sqrt(static_cast<double>(s.hd));
          mx = std::max(mx, logit[j]);
        }
        if (mx == -INFINITY) continue;  // all memory rows padded: a zero row
        double sum = 0;
        for (int64_t j = 0; j < s.Nk; ++j)
          if (s.valid.empty() || s.valid[b * s.Nk + j]) sum += std::exp(logit[j] - mx);
        for (int64_t j = 0; j < s.Nk; ++j) {
          if (!s.valid.empty() && !s.valid[b * s.Nk + j]) continue;
          const double p = std::exp(logit[j] - mx) / sum;
          for (int64_t d = 0; d < s.hd; ++d)
            A[(b * s.Nq + i) * qd + h * s.hd + d] += p * V[(b * s.Nk + j) * kvd + g * s.hd + d];
        }
      }
  return naive_linear(A, s.B * s.Nq, qd, in[8], in[9], s.C);
}

// d<u, naive_cross>/d(every input element), central differences in float64.
Inputs naive_grads(const Spec& s, Inputs in, const std::vector<double>& u, double eps = 1e-6) {
  auto loss = [&](const Inputs& x) {
    const auto out = naive_cross(s, x);
    double l = 0;
    for (size_t e = 0; e < out.size(); ++e) l += u[e] * out[e];
    return l;
  };
  Inputs g(in.size());
  for (size_t t = 0; t < in.size(); ++t) {
    g[t].resize(in[t].size());
    for (size_t e = 0; e < in[t].size(); ++e) {
      const double keep = in[t][e];
      in[t][e] = keep + eps;
      const double up = loss(in);
      in[t][e] = keep - eps;
      const double down = loss(in);
      in[t][e] = keep;
      g[t][e] = (up - down) / (2 * eps);
    }
  }
  return g;
}

nn::CrossAttentionConfig config_of(const Spec& s) {
  nn::CrossAttentionConfig c;
  c.d_model = s.C;
  c.d_memory = s.Cm;
  c.n_head = s.Hq;
  c.n_kv_head = s.Hkv;
  c.head_dim = s.hd;
  c.bias = s.bias;
  c.rope = s.rope;
  c.rope_theta = s.theta;
  return c;
}

Tensor padding_of(const Spec& s) {
  if (s.valid.empty()) return Tensor();
  Tensor t = Tensor::empty({s.B, s.Nk}, DType::boolean);
  for (int64_t e = 0; e < s.B * s.Nk; ++e) t.data<bool>()[e] = s.valid[e] != 0;
  return t;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max|a - b| / max|b|, and every element finite
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t e = 0; e < a.size(); ++e) {
    REQUIRE(std::isfinite(a[e]));
    m = std::max(m, std::abs(a[e] - b[e]));
  }
  return m / std::max(max_abs(b), 1e-300);
}

const char* kInputNames[] = {"x",           "memory",        "q_proj.weight", "q_proj.bias",   "k_proj.weight",
                             "k_proj.bias", "v_proj.weight", "v_proj.bias",   "o_proj.weight", "o_proj.bias"};

struct Result {
  std::vector<double> out;
  Inputs grads;  // same order as the inputs
};

// The module in `dtype` with its parameters set to `in`, forward and backward of <u, out>.
Result run_module(const Spec& s, const Inputs& in, const std::vector<double>& u, DType dtype,
                  nn::CrossAttentionArgs args = {}) {
  const auto shapes = input_shapes(s);
  nn::CrossAttention m(config_of(s));
  if (dtype == DType::f32) {
    autograd::NoGradGuard ng;
    const auto params = m.named_parameters();
    size_t p = 0;
    for (size_t i = 2; i < in.size(); ++i) {
      if (in[i].empty()) continue;
      REQUIRE(params[p].name == kInputNames[i]);  // names and order as documented
      copy_(params[p].tensor, from_vector(in[i], shapes[i]));
      ++p;
    }
    REQUIRE(p == params.size());
  }
  Tensor x = from_vector(in[0], shapes[0], dtype), mem = from_vector(in[1], shapes[1], dtype);
  x.set_requires_grad(true);
  mem.set_requires_grad(true);
  if (!args.memory_padding.defined() && args.memory_lengths.empty()) args.memory_padding = padding_of(s);
  Tensor out;
  std::vector<Tensor> leaves{x, mem};
  if (dtype == DType::f32) {
    out = m.forward(x, mem, args);
    for (const auto& p : m.named_parameters()) leaves.push_back(p.tensor);
  } else {  // the functional form in float64: the module's computation at full precision
    nn::CrossAttentionWeights w;
    Tensor* slots[] = {&w.q_w, &w.q_b, &w.k_w, &w.k_b, &w.v_w, &w.v_b, &w.o_w, &w.o_b};
    for (size_t i = 2; i < in.size(); ++i) {
      if (in[i].empty()) continue;
      *slots[i - 2] = from_vector(in[i], shapes[i], DType::f64);
      slots[i - 2]->set_requires_grad(true);
      leaves.push_back(*slots[i - 2]);
    }
    out = nn::cross_attention(x, mem, w, config_of(s), args);
  }
  autograd::backward(ag::sum(ag::mul(out, from_vector(u, out.shape(), dtype))));
  Result r{out.to_vector(), {}};
  size_t l = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].empty()) {
      r.grads.emplace_back();
      continue;
    }
    const Tensor g = leaves[l++].grad();
    r.grads.push_back(g.defined() ? g.to_vector() : std::vector<double>(in[i].size(), 0.0));
  }
  return r;
}

// Output and every gradient against the naive formula.
void check_against_naive(const Spec& s, uint64_t seed, double weight_std, DType dtype, double out_tol, double grad_tol,
                         nn::CrossAttentionArgs args = {}) {
  const Inputs in = random_inputs(s, seed, weight_std);
  const std::vector<double> u = randn({s.B, s.Nq, s.C}, seed + 50, 0, 0.0, 1.0, DType::f64).to_vector();
  const Result got = run_module(s, in, u, dtype, args);
  const std::vector<double> want = naive_cross(s, in);
  CHECK(rel_err(got.out, want) < out_tol);
  const Inputs g = naive_grads(s, in, u);
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].empty()) continue;
    INFO("gradient w.r.t. " << kInputNames[i]);
    if (i == 5 && !s.rope) {
      // Without RoPE k_proj.bias adds q_i·b_k to every logit of row i: softmax is shift-invariant, so its
      // gradient is exactly 0 in exact arithmetic; both sides must be at rounding level.
      CHECK(max_abs(got.grads[i]) <= grad_tol * max_abs(g[0]));
      CHECK(max_abs(g[i]) <= 1e-6 * max_abs(g[0]));
      continue;
    }
    REQUIRE(max_abs(g[i]) > 0);  // the reference reaches it (a zero reference would prove nothing)
    CHECK(rel_err(got.grads[i], g[i]) < grad_tol);
  }
}

}  // namespace

TEST_CASE("cross-attention float32 module matches the naive float64 formula, outputs and every gradient",
          "[cross_attention]") {
  SECTION("MHA, Nq < Nk, padded memory rows") {
    Spec s;
    s.Nq = 3;
    s.Nk = 7;
    s.valid = {1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    check_against_naive(s, 100, 0.5, DType::f32, 2e-6, 2e-4);
  }
  SECTION("GQA 4:2, Nq > Nk, no bias, padded memory") {
    Spec s;
    s.Nq = 6;
    s.Nk = 4;
    s.Hq = 4;
    s.Hkv = 2;
    s.hd = 2;
    s.bias = false;
    s.valid = {0, 1, 1, 1, 1, 1, 1, 0};
    check_against_naive(s, 200, 0.5, DType::f32, 2e-6, 2e-4);
  }
}

TEST_CASE("cross-attention in float64 matches the naive formula to 1e-7 (GQA, MQA, lengths, RoPE on request)",
          "[cross_attention]") {
  SECTION("MQA 3:1, memory lengths") {
    Spec s;
    s.Hq = 3;
    s.Hkv = 1;
    s.hd = 3;
    s.C = 6;
    s.Nq = 4;
    s.Nk = 6;
    s.valid = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0};
    nn::CrossAttentionArgs a;
    a.memory_lengths = {6, 2};  // the same rows as `valid`, given as lengths
    check_against_naive(s, 300, 0.5, DType::f64, 1e-12, 1e-7, a);
  }
  SECTION("GQA 4:2 with RoPE (positions of each sequence from 0)") {
    Spec s;
    s.Hq = 4;
    s.Hkv = 2;
    s.hd = 4;
    s.C = 8;
    s.Nq = 5;
    s.Nk = 3;
    s.rope = true;
    s.theta = 100.0;
    check_against_naive(s, 400, 0.5, DType::f64, 1e-12, 1e-7);
  }
  SECTION("large logits over three key tiles and two query blocks") {
    // Weights scaled so logits span about ±60: the stable softmax's max-shift and the kernel's
    // running rescale between 64-key tiles are both exercised.
    Spec s;
    s.B = 1;
    s.Nq = 70;
    s.Nk = 150;
    s.C = 4;
    s.Cm = 4;
    s.Hq = 2;
    s.Hkv = 1;
    s.hd = 2;
    s.valid.assign(150, 1);
    for (int j = 140; j < 150; ++j) s.valid[j] = 0;
    const Inputs in = random_inputs(s, 500, 3.0);
    double top = 0;  // the largest |logit| reached, from the naive projections
    {
      const auto Q = naive_linear(in[0], s.Nq, s.C, in[2], in[3], s.Hq * s.hd);
      const auto K = naive_linear(in[1], s.Nk, s.Cm, in[4], in[5], s.Hkv * s.hd);
      for (int64_t i = 0; i < s.Nq; ++i)
        for (int64_t j = 0; j < s.Nk; ++j)
          top = std::max(top, std::abs(Q[i * 4] * K[j * 2] + Q[i * 4 + 1] * K[j * 2 + 1]) / std::sqrt(2.0));
    }
    REQUIRE(top > 50);
    check_against_naive(s, 500, 3.0, DType::f64, 1e-11, 1e-6);
  }
}

TEST_CASE("cross-attention: padded memory rows change no output and get exactly zero gradient", "[cross_attention]") {
  Spec s;
  s.Nq = 4;
  s.Nk = 6;
  s.valid = {1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1};
  Inputs in = random_inputs(s, 600, 0.5);
  const std::vector<double> u = randn({s.B, s.Nq, s.C}, 650, 0, 0.0, 1.0, DType::f64).to_vector();
  const Result base = run_module(s, in, u, DType::f32);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < s.Nk; ++j)
      for (int64_t c = 0; c < s.Cm; ++c) {
        const double g = base.grads[1][(b * s.Nk + j) * s.Cm + c];
        if (s.valid[b * s.Nk + j]) continue;
        CHECK(g == 0.0);
        in[1][(b * s.Nk + j) * s.Cm + c] += 100.0;  // garbage in every padded row
      }
  const Result perturbed = run_module(s, in, u, DType::f32);
  CHECK(perturbed.out == base.out);  // bit for bit: the padded rows are never read
  // A real row does move the output (the comparison above can fail).
  in[1][0] += 1.0;
  CHECK(run_module(s, in, u, DType::f32).out != base.out);
}

TEST_CASE("cross-attention: memory rows as a set without RoPE, ordered with it; an all-padding memory gives zeros",
          "[cross_attention]") {
  Spec s;
  s.B = 1;
  s.Nq = 3;
  s.Nk = 5;
  const Inputs in = random_inputs(s, 700, 0.8);
  const std::vector<double> u(static_cast<size_t>(s.Nq * s.C), 1.0);
  const int perm[] = {3, 0, 4, 1, 2};
  Inputs shuffled = in;
  for (int j = 0; j < 5; ++j)
    for (int64_t c = 0; c < s.Cm; ++c) shuffled[1][j * s.Cm + c] = in[1][perm[j] * s.Cm + c];
  const double plain = rel_err(run_module(s, shuffled, u, DType::f32).out, run_module(s, in, u, DType::f32).out);
  CHECK(plain < 1e-6);  // float32 rounding of a reordered sum over 5 keys
  s.rope = true;
  s.theta = 10.0;
  const double rotated = rel_err(run_module(s, shuffled, u, DType::f32).out, run_module(s, in, u, DType::f32).out);
  CHECK(rotated > 1e-3);

  s.rope = false;
  s.B = 2;
  s.valid = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0};
  const Inputs in2 = random_inputs(s, 710, 0.8);
  const Result r = run_module(s, in2, std::vector<double>(static_cast<size_t>(2 * s.Nq * s.C), 1.0), DType::f32);
  // Batch row 1 reads no memory: the attention output is zero, so out = o_proj.bias exactly.
  for (int64_t i = 0; i < s.Nq; ++i)
    for (int64_t c = 0; c < s.C; ++c)
      CHECK(r.out[(s.Nq + i) * s.C + c] == static_cast<double>(static_cast<float>(in2[9][c])));
}

TEST_CASE("cross-attention rejects bad shapes and configs with one line naming the field", "[cross_attention]") {
  nn::CrossAttentionConfig c;
  c.d_model = 8;
  c.d_memory = 6;
  c.n_head = 2;
  c.n_kv_head = 2;
  nn::CrossAttention m(c);
  const Tensor x = zeros({2, 3, 8});
  CHECK_THROWS_WITH(m.forward(x, zeros({2, 4, 5})), Catch::Contains("memory must be [2, Nk, 6]"));
  CHECK_THROWS_WITH(m.forward(x, zeros({1, 4, 6})), Catch::Contains("memory must be [2, Nk, 6]"));
  CHECK_THROWS_WITH(m.forward(zeros({2, 3, 7}), zeros({2, 4, 6})), Catch::Contains("x must be [B, Nq, 8]"));
  nn::CrossAttentionArgs a;
  a.memory_padding = Tensor::empty({2, 3}, DType::boolean);
  CHECK_THROWS_WITH(m.forward(x, zeros({2, 4, 6}), a), Catch::Contains("memory_padding must be [2, 4]"));
  nn::CrossAttentionArgs l;
  l.memory_lengths = {4};
  CHECK_THROWS_WITH(m.forward(x, zeros({2, 4, 6}), l), Catch::Contains("memory_lengths has 1 entries"));
  c.n_kv_head = 3;
  CHECK_THROWS_WITH(nn::CrossAttention(c), Catch::Contains("cross_attention.n_head (2) must be divisible"));
  c.n_kv_head = 2;
  c.rope = true;
  c.head_dim = 3;
  CHECK_THROWS_WITH(nn::CrossAttention(c), Catch::Contains("cross_attention.rope needs an even head_dim"));
  c.rope = false;
  c.head_dim = 0;
  c.d_model = 7;
  CHECK_THROWS_WITH(nn::CrossAttention(c), Catch::Contains("cross_attention.d_model (7) must be divisible"));
}

TEST_CASE("cross_attention gradcheck cases are registered and pass", "[cross_attention][gradcheck]") {
  int n = 0;
  for (const auto& c : app::full_gradcheck_registry().cases()) {
    if (c.op != "cross_attention") continue;
    ++n;
    const auto r = autograd::run_gradcheck(c);
    INFO(c.name << ": " << r.max_abs_err << " " << r.error);
    CHECK(r.error.empty());
    CHECK(r.pass);
  }
  CHECK(n == 7);
}

// ---- the encoder–decoder built on it (nn/encoder_decoder.h) and the reversal task ----

namespace {

std::unique_ptr<nn::EncoderDecoder> small_seq2seq(uint64_t seed) {
  nn::EncoderDecoderConfig c;
  c.vocab_size = 13;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_hidden = 64;
  c.max_len = 9;
  c.init_std = 0.3;  // sharp attention, so a leak would show
  auto m = std::make_unique<nn::EncoderDecoder>(c);
  m->init_weights(seed);
  m->eval();
  return m;
}

std::vector<double> logits_of(const nn::EncoderDecoder& m, const examples::ReverseBatch& b) {
  autograd::NoGradGuard ng;
  return m.forward(b.src, b.src_padding, b.dec_in).to_vector();
}

}  // namespace

TEST_CASE("encoder-decoder: a padded source position changes no output, exactly", "[cross_attention][seq2seq]") {
  const examples::ReverseTask t;
  const auto m = small_seq2seq(3);
  const auto strings = examples::draw_strings(t, 6, 42, false);
  examples::ReverseBatch b = examples::make_batch(t, strings);
  const std::vector<double> base = logits_of(*m, b);
  int64_t perturbed = 0;
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t j = static_cast<int64_t>(strings[r].size()); j < t.max_len; ++j, ++perturbed)
      b.src.data<int64_t>()[r * t.max_len + j] = 3 + (r + j) % 10;  // real symbols where the padding was
  REQUIRE(perturbed > 0);
  CHECK(logits_of(*m, b) == base);  // bit for bit: the same batch shape, padded rows never read
  // The same change with the mask saying "real" does move the outputs (the check can fail).
  for (int64_t e = 0; e < 6 * t.max_len; ++e) b.src_padding.data<bool>()[e] = true;
  CHECK(logits_of(*m, b) != base);
}

TEST_CASE("encoder-decoder: a future target token changes no earlier prediction, exactly",
          "[cross_attention][seq2seq]") {
  const examples::ReverseTask t;
  const auto m = small_seq2seq(4);
  const int64_t T = t.max_len + 1, V = 13;
  const auto strings = examples::draw_strings(t, T, 43, false);
  const examples::ReverseBatch base_batch = examples::make_batch(t, std::vector<std::vector<int64_t>>(T, strings[0]));
  const std::vector<double> base = logits_of(*m, base_batch);
  // Row k of the perturbed batch changes every decoder input after position k; it is compared with
  // row k of a batch of copies (same shape, same row: identical rounding by construction).
  examples::ReverseBatch b = base_batch;
  b.dec_in = base_batch.dec_in.clone();
  for (int64_t k = 0; k < T; ++k)
    for (int64_t u = k + 1; u < T; ++u) b.dec_in.data<int64_t>()[k * T + u] = 3 + (k * 7 + u) % 10;
  const std::vector<double> got = logits_of(*m, b);
  double earlier = 0, later = 0;
  for (int64_t k = 0; k < T; ++k)
    for (int64_t p = 0; p < T; ++p)
      for (int64_t v = 0; v < V; ++v) {
        const double d = std::abs(got[(k * T + p) * V + v] - base[(k * T + p) * V + v]);
        (p <= k ? earlier : later) = std::max(p <= k ? earlier : later, d);
      }
  CHECK(earlier == 0.0);
  CHECK(later > 1e-3);  // the perturbation does reach the positions allowed to see it
}

TEST_CASE("encoder-decoder: gradients reach every parameter, memory included", "[cross_attention][seq2seq]") {
  const examples::ReverseTask t;
  auto m = small_seq2seq(5);
  const auto b = examples::make_batch(t, examples::draw_strings(t, 4, 44, false));
  autograd::backward(ag::cross_entropy(ag::reshape(m->forward(b.src, b.src_padding, b.dec_in), {-1, 13}), b.target));
  for (const auto& p : m->named_parameters()) {
    INFO(p.name);
    REQUIRE(p.tensor.grad().defined());
    double mx = 0;
    for (double g : p.tensor.grad().to_vector()) mx = std::max(mx, std::abs(g));
    CHECK(mx > 0);
  }
  CHECK(m->named_parameters()[0].name == "shared.weight");
}

TEST_CASE("encoder-decoder learns to reverse strings: >= 99% exact on held-out strings",
          "[cross_attention][seq2seq][slow]") {
  const examples::ReverseTask t;
  nn::EncoderDecoderConfig c;
  c.vocab_size = t.vocab();
  c.max_len = t.max_len + 1;
  nn::EncoderDecoder m(c);
  m.init_weights(1);
  examples::ReverseTrainOptions o;
  // One thread, as README's run: these GEMMs are tiny, and OpenBLAS's threads spin on a shared
  // machine (measured: 2 threads several times slower there). Restored after.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto rep = examples::train_reverse(m, t, o, [](int64_t step, double loss, double acc) {
    std::printf("reverse: step %lld loss %.4f held-out accuracy %.3f\n", static_cast<long long>(step), loss, acc);
    std::fflush(stdout);
  });
  omp_set_num_threads(threads);
  std::printf("reverse: %.1f%% after %lld steps, %.1f s\n", 100 * rep.accuracy, static_cast<long long>(rep.steps),
              rep.seconds);
  CHECK(rep.accuracy >= 0.99);
}
