// bf16 autocast (train.dtype = "bf16"): matmuls and attention take bfloat16-rounded inputs and
// gradients and accumulate in float32. Checked against float64 formulas written here, against
// FlashAttention's accuracy rule (error no more than 2x that of a naive bf16 attention, where
// every intermediate is rounded, both against exact float64), and on a short training run.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "attention/attention.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/transformer.h"
#include "tensor/ops.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/optimizer.h"

using namespace qkv;

namespace {

double bf16_of(double x) { return bf16_to_float(float_to_bf16(static_cast<float>(x))); }

std::vector<double> rounded(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  for (double& x : v) x = bf16_of(x);
  return v;
}

double max_abs(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// Row-major [m, k] x [n, k]^T in float64.
std::vector<double> mm_nt(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < k; ++t) c[i * n + j] += a[i * k + t] * b[j * k + t];
  return c;
}

}  // namespace

TEST_CASE("round_bf16 rounds to nearest even bf16 with a pass-through gradient; round_grad_bf16 rounds the gradient",
          "[autocast]") {
  Tensor x = from_vector({1.0, 1.00390625, 1.01171875, -3.14159265, 1e-3, 65504.5}, {6});
  x.set_requires_grad(true);
  const Tensor y = ag::round_bf16(x);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  CHECK(y.to_vector() ==
        std::vector<double>{1.0, 1.0, 1.015625, bf16_of(-3.14159265), bf16_of(1e-3), bf16_of(65504.5)});
  const Tensor g = from_vector({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {6});
  autograd::backward(y, g);
  CHECK(max_abs(x.grad().to_vector(), g.to_vector()) == 0.0);

  Tensor z = from_vector({2.0, 3.0}, {2});
  z.set_requires_grad(true);
  const Tensor w = ag::round_grad_bf16(z);
  CHECK(w.to_vector() == z.to_vector());
  autograd::backward(w, from_vector({1.00390625, 0.1}, {2}));
  CHECK(z.grad().to_vector() == std::vector<double>{1.0, bf16_of(0.1)});
}

TEST_CASE("round_to_bf16 gives the bits of the cast to bf16 and back, on every kind of value and layout",
          "[autocast][exact]") {
  // Bit patterns: ties both ways, carries into the exponent, the largest finite value (rounds to
  // infinity), subnormals, signed zeros, infinities, NaNs with payloads of either sign, and the
  // scalar rule of tensor/dtype.h as the reference.
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f7fffffu, 0x00000001u, 0x807fffffu,
                                0x00008000u, 0x80000000u, 0x00000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                0xffa00000u, 0x7f800001u, 0x3eaaaaabu, 0xc0490fdbu};
  for (uint32_t i = 0; i < 4000; ++i) bits.push_back(i * 2654435761u);
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
  const int64_t n = int64_t(values.size());
  Tensor x = Tensor::empty({n}, DType::f32);
  std::memcpy(x.data<float>(), values.data(), values.size() * sizeof(float));
  auto check_bits = [&](const Tensor& got, const std::vector<float>& src) {
    const Tensor c = got.contiguous();
    int64_t bad = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      const uint32_t want = uint32_t(float_to_bf16(src[i])) << 16;
      uint32_t have;
      std::memcpy(&have, c.data<float>() + i, 4);
      bad += have != want;
    }
    CHECK(bad == 0);
  };
  check_bits(round_to_bf16(x), values);
  const Tensor cast = x.to(DType::bf16).to(DType::f32);
  check_bits(cast, values);
  // A strided view (every other element of a [n/2, 2] transpose) takes the same rule.
  const Tensor t = x.view({n / 2, 2}).transpose(0, 1);
  std::vector<float> strided;
  for (int64_t j = 0; j < 2; ++j)
    for (int64_t i = 0; i < n / 2; ++i) strided.push_back(values[size_t(i * 2 + j)]);
  check_bits(round_to_bf16(t), strided);
  CHECK_THROWS_WITH(round_to_bf16(x.to(DType::f64)), Catch::Contains("needs a float32 tensor"));
}

TEST_CASE("linear under bf16 autocast: bf16 operands, float32 accumulation, forward and backward", "[autocast]") {
  const int64_t m = 7, k = 33, n = 5;
  Tensor x = randn({m, k}, 1), w = randn({n, k}, 2), b = randn({n}, 3);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  const Tensor dy = randn({m, n}, 4);
  Tensor y;
  {
    autograd::AutocastGuard bf16(true);
    y = ag::linear(x, w, b);
  }
  autograd::backward(y, dy);
  const auto xr = rounded(x), wr = rounded(w), gr = rounded(dy);
  // y = bf16(x)·bf16(W)ᵀ + b
  std::vector<double> want = mm_nt(xr, wr, m, n, k);
  const auto bv = b.to_vector();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) want[i * n + j] += bv[j];
  CHECK(max_abs(y.to_vector(), want) < 1e-5);
  // dx = bf16(dy)·bf16(W), dW = bf16(dy)ᵀ·bf16(x), db = Σ bf16(dy)
  std::vector<double> dx(static_cast<size_t>(m * k), 0.0), dw(static_cast<size_t>(n * k), 0.0), db(n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      db[j] += gr[i * n + j];
      for (int64_t t = 0; t < k; ++t) {
        dx[i * k + t] += gr[i * n + j] * wr[j * k + t];
        dw[j * k + t] += gr[i * n + j] * xr[i * k + t];
      }
    }
  CHECK(max_abs(x.grad().to_vector(), dx) < 1e-5);
  CHECK(max_abs(w.grad().to_vector(), dw) < 1e-5);
  CHECK(max_abs(b.grad().to_vector(), db) < 1e-5);
  // Outside the guard nothing is rounded.
  CHECK(max_abs(ag::linear(x, w, b).to_vector(), qkv::linear(x, w, b).to_vector()) == 0.0);
}

TEST_CASE("attention under bf16 autocast meets FlashAttention's rule: error at most 2x a naive bf16 attention",
          "[autocast]") {
  // One head, causal, N = 64, D = 32: exact float64 vs (a) autocast (bf16 q/k/v, float32 inside)
  // and (b) naive bf16 (every intermediate rounded: S, P and O).
  const int64_t N = 64, D = 32;
  const Tensor q = randn({1, 1, N, D}, 11), k = randn({1, 1, N, D}, 12), v = randn({1, 1, N, D}, 13);
  attn::AttentionOptions o;
  o.causal = true;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto exact_or_naive = [&](bool naive) {
    auto r = [&](double x) { return naive ? bf16_of(x) : x; };
    const auto qv = naive ? rounded(q) : q.to_vector(), kv = naive ? rounded(k) : k.to_vector(),
               vv = naive ? rounded(v) : v.to_vector();
    std::vector<double> out(static_cast<size_t>(N * D), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> s(static_cast<size_t>(i + 1));
      double mx = -1e300;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < D; ++t) acc += qv[i * D + t] * kv[j * D + t];
        s[j] = r(acc * scale);
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int64_t t = 0; t < D; ++t) {
        double acc = 0;
        for (int64_t j = 0; j <= i; ++j) acc += r(s[j] / sum) * vv[j * D + t];
        out[i * D + t] = r(acc);
      }
    }
    return out;
  };
  const auto exact = exact_or_naive(false), naive = exact_or_naive(true);
  Tensor ours;
  {
    autograd::AutocastGuard bf16(true);
    ours = attn::attention(q, k, v, o);
  }
  const double err_ours = max_abs(ours.to_vector(), exact), err_naive = max_abs(naive, exact);
  WARN("bf16 attention max error vs float64: autocast " << err_ours << ", naive bf16 " << err_naive);
  CHECK(err_ours > 0);  // the inputs really were rounded
  CHECK(err_ours <= 2 * err_naive);
}

TEST_CASE("a tiny gpt2 trained with bf16 autocast follows the float32 run", "[autocast]") {
  Config cfg;
  cfg.model.family = nn::Family::gpt2;
  cfg.model.vocab_size = 32;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.n_embd = 32;
  cfg.model.block_size = 16;
  std::vector<int64_t> ids(4 * 16), tgt(4 * 16);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + i / 5) % 32);
    tgt[i] = static_cast<int64_t>((i * 3 + 1) % 32);
  }
  auto run = [&](bool bf16) {
    auto model = train::build_model(cfg, 32);
    model->init_weights(21);
    std::vector<train::OptimParam> ps;
    for (const auto& p : model->named_parameters()) ps.push_back({p.name, p.tensor, p.decay});
    train::AdamW opt(ps, {});
    std::vector<double> losses;
    autograd::AutocastGuard autocast(bf16);
    for (int step = 0; step < 60; ++step) {
      nn::ForwardArgs a;
      a.ids = from_vector_i64(ids, {4, 16});
      Tensor loss = ag::cross_entropy(ag::reshape(model->forward(a), {-1, 32}), from_vector_i64(tgt, {64}));
      losses.push_back(loss.item());
      autograd::zero_grad(model->parameters());
      autograd::backward(loss);
      for (const auto& p : model->parameters()) REQUIRE(p.dtype() == DType::f32);  // master weights
      opt.step(3e-3);
    }
    return losses;
  };
  const auto f32 = run(false), bf16 = run(true);
  WARN("loss after 60 steps: float32 " << f32.back() << ", bf16 autocast " << bf16.back());
  CHECK(bf16[0] != f32[0]);                   // bf16 really computed something else
  CHECK(std::fabs(bf16[0] - f32[0]) < 1e-2);  // ... close to float32
  CHECK(bf16.back() < 0.5 * bf16[0]);         // and it learns
  CHECK(std::fabs(bf16.back() - f32.back()) < 0.1 * f32.back() + 0.05);
}
