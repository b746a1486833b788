// The fast paths of the training step (docs/perf.md) give the same numbers as the plain ones:
// in-place gradient accumulation in the engine and AccumulateGrad's hand-over of the buffer (never
// aliasing two gradients), narrow pieces adding into one pending gradient, the tied embedding
// scattering into the LM head's dW, LinearBackward's dx ‖ dW on two threads, and
// attention_packed against attention on the split views (bitwise, one and two threads); and the
// MFU denominator `qkv bench` divides by on a GPU.
#include <catch2/catch.hpp>
#include <cmath>

#include "attention/attention.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "compare_util.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/device_info.h"

using namespace qkv;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, DType t = DType::f64) {
  Tensor x = randn(s, seed, 0, 0.0, 1.0, t);
  x.set_requires_grad(true);
  return x;
}

using test::with_threads;

}  // namespace

TEST_CASE("gradients handed over without a copy never alias each other or the caller's seed",
          "[autograd][engine][perf]") {
  // z = x + y: AddBackward passes the same dy to both leaves; each .grad must be its own buffer.
  Tensor x = leaf({3, 4}, 1), y = leaf({3, 4}, 2);
  const Tensor seed = randn({3, 4}, 3, 0, 0.0, 1.0, DType::f64);
  const auto seed_v = seed.to_vector();
  autograd::backward(ag::add(x, y), seed);
  CHECK(max_abs_diff(x.grad(), seed) == 0.0);
  CHECK(max_abs_diff(y.grad(), seed) == 0.0);
  fill_(x.grad(), 0.0);
  CHECK(max_abs_diff(y.grad(), seed) == 0.0);  // y.grad is not x.grad's buffer
  CHECK(seed.to_vector() == seed_v);           // nor the caller's seed

  // z = x + x: both gradients reach one leaf and are summed (the seed stays untouched).
  Tensor w = leaf({5}, 4);
  const Tensor g = randn({5}, 5, 0, 0.0, 1.0, DType::f64);
  const auto gv = g.to_vector();
  autograd::backward(ag::add(w, w), g);
  const auto wg = w.grad().to_vector();
  for (size_t i = 0; i < gv.size(); ++i) CHECK(wg[i] == 2 * gv[i]);
  CHECK(g.to_vector() == gv);

  // A second backward still accumulates into the buffer taken over the first time.
  autograd::backward(ag::add(w, w), g);
  const auto wg2 = w.grad().to_vector();
  for (size_t i = 0; i < gv.size(); ++i) CHECK(wg2[i] == 4 * gv[i]);
}

TEST_CASE("narrow pieces of one tensor add their gradients into one buffer, overlaps and other uses included",
          "[autograd][engine][perf]") {
  Tensor x = leaf({4, 6}, 10);
  const Tensor a = randn({4, 2}, 11, 0, 0.0, 1.0, DType::f64), b = randn({4, 3}, 12, 0, 0.0, 1.0, DType::f64),
               c = randn({4, 2}, 13, 0, 0.0, 1.0, DType::f64), d = randn({4, 6}, 14, 0, 0.0, 1.0, DType::f64);
  // Columns [0,2), [2,5) and [4,6) (overlapping at column 4), plus x itself times d.
  Tensor loss =
      ag::add(ag::add(ag::sum(ag::mul(ag::narrow(x, 1, 0, 2), a)), ag::sum(ag::mul(ag::narrow(x, 1, 2, 3), b))),
              ag::add(ag::sum(ag::mul(ag::narrow(x, 1, 4, 2), c)), ag::sum(ag::mul(x, d))));
  autograd::backward(loss);
  const auto got = x.grad().to_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      double want = d.at({i, j});
      if (j < 2) want += a.at({i, j});
      if (j >= 2 && j < 5) want += b.at({i, j - 2});
      if (j >= 4) want += c.at({i, j - 4});
      CHECK(got[static_cast<size_t>(i * 6 + j)] == Approx(want).margin(1e-12));
    }
}

TEST_CASE("a tied embedding scatters its rows into the LM head's weight gradient", "[autograd][engine][perf]") {
  const int64_t V = 7, C = 5;
  const Tensor ids = from_vector_i64({3, 0, 3, 6, 1, 3}, {2, 3});
  const Tensor w0 = randn({V, C}, 20, 0, 0.0, 1.0, DType::f64);
  const Tensor targets = from_vector_i64({1, 2, 0, 6, 3, 3}, {6});
  auto loss_of = [&](const Tensor& w_emb, const Tensor& w_head) {
    Tensor h = ag::tanh(ag::embedding(w_emb, ids));  // [2, 3, C]
    return ag::cross_entropy(ag::reshape(ag::linear(h, w_head, Tensor()), {6, V}), targets);
  };
  Tensor tied = w0.clone();
  tied.set_requires_grad(true);
  autograd::backward(loss_of(tied, tied));
  Tensor we = w0.clone(), wh = w0.clone();
  we.set_requires_grad(true);
  wh.set_requires_grad(true);
  autograd::backward(loss_of(we, wh));
  CHECK(max_abs_diff(tied.grad(), add(we.grad(), wh.grad())) < 1e-14);
  CHECK(max_abs_diff(we.grad(), zeros({V, C}, DType::f64)) > 0.1);  // both parts are really there
}

TEST_CASE("linear backward on two threads (dx and dW side by side) equals one thread and a float64 reference",
          "[autograd][linear][perf]") {
  // rows·in·out = 128·128·96 is above the side-by-side threshold.
  const Tensor x64 = randn({2, 64, 128}, 30, 0, 0.0, 1.0, DType::f64),
               w64 = randn({96, 128}, 31, 0, 0.0, 0.1, DType::f64), b64 = randn({96}, 32, 0, 0.0, 1.0, DType::f64),
               dy64 = randn({2, 64, 96}, 33, 0, 0.0, 1.0, DType::f64);
  struct Grads {
    Tensor dx, dw, db;
  };
  auto run = [&](DType t) {
    Tensor x = x64.to(t), w = w64.to(t), b = b64.to(t);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    autograd::backward(ag::linear(x, w, b), dy64.to(t));
    return Grads{x.grad(), w.grad(), b.grad()};
  };
  const Grads two = with_threads(2, [&] { return run(DType::f32); });
  const Grads one = with_threads(1, [&] { return run(DType::f32); });
  CHECK(max_abs_diff(two.dx, one.dx) == 0.0);
  CHECK(max_abs_diff(two.dw, one.dw) == 0.0);
  CHECK(max_abs_diff(two.db, one.db) == 0.0);
  // Naive float64: dx = dy W, dW = dyᵀ x, db = Σ dy.
  const auto xv = x64.to_vector(), wv = w64.to_vector(), dyv = dy64.to_vector();
  const auto gx = two.dx.to_vector(), gw = two.dw.to_vector(), gb = two.db.to_vector();
  double worst = 0;
  for (int64_t r = 0; r < 128; ++r)
    for (int64_t i = 0; i < 128; ++i) {
      double s = 0;
      for (int64_t o = 0; o < 96; ++o) s += dyv[r * 96 + o] * wv[o * 128 + i];
      worst = std::max(worst, std::fabs(gx[r * 128 + i] - s) / (1 + std::fabs(s)));
    }
  for (int64_t o = 0; o < 96; ++o) {
    double sb = 0;
    for (int64_t r = 0; r < 128; ++r) sb += dyv[r * 96 + o];
    worst = std::max(worst, std::fabs(gb[o] - sb) / (1 + std::fabs(sb)));
    for (int64_t i = 0; i < 128; ++i) {
      double s = 0;
      for (int64_t r = 0; r < 128; ++r) s += dyv[r * 96 + o] * xv[r * 128 + i];
      worst = std::max(worst, std::fabs(gw[o * 128 + i] - s) / (1 + std::fabs(s)));
    }
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("attention_packed equals attention on the split views, forward and backward, bitwise",
          "[attention][perf][exact]") {
  struct Case {
    int64_t hq, hkv;
    double dropout;
  };
  for (const Case c : {Case{4, 4, 0.0}, Case{4, 2, 0.0}, Case{6, 2, 0.2}}) {
    INFO("Hq=" << c.hq << " Hkv=" << c.hkv << " dropout " << c.dropout);
    const int64_t B = 2, N = 80, D = 16, H = c.hq + 2 * c.hkv;  // N spans two key tiles
    const Tensor qkv0 = randn({B, N, H, D}, 40 + c.hq, 0, 0.0, 1.0);
    const Tensor dout = randn({B, N, c.hq, D}, 50 + c.hq, 0, 0.0, 1.0);
    attn::AttentionOptions o;
    o.causal = true;
    o.dropout_p = c.dropout;
    o.dropout_seed = 3;
    o.dropout_offset = 9;
    auto packed = [&] {
      Tensor qkv = qkv0.clone();
      qkv.set_requires_grad(true);
      Tensor out = attn::attention_packed(qkv, c.hq, c.hkv, o);
      CHECK(out.is_contiguous());
      autograd::backward(out, dout);
      return std::make_pair(out, qkv.grad());
    };
    auto split = [&] {
      Tensor qkv = qkv0.clone();
      qkv.set_requires_grad(true);
      auto heads = [&](int64_t s, int64_t n) { return ag::transpose(ag::narrow(qkv, 2, s, n), 1, 2); };
      Tensor out =
          ag::transpose(attn::attention(heads(0, c.hq), heads(c.hq, c.hkv), heads(c.hq + c.hkv, c.hkv), o), 1, 2);
      autograd::backward(out, dout);
      return std::make_pair(out, qkv.grad());
    };
    const auto [p_out, p_grad] = with_threads(2, packed);
    const auto [s_out, s_grad] = with_threads(2, split);
    const auto [p1_out, p1_grad] = with_threads(1, packed);
    CHECK(max_abs_diff(p_out, s_out) == 0.0);
    CHECK(max_abs_diff(p_grad, s_grad) == 0.0);
    CHECK(max_abs_diff(p_out, p1_out) == 0.0);
    CHECK(max_abs_diff(p_grad, p1_grad) == 0.0);
    CHECK(max_abs_diff(p_grad, zeros(p_grad.shape())) > 0.1);
  }
}

TEST_CASE("cross-entropy backward writes dlogits over the logits only when nothing else holds them",
          "[autograd][cross_entropy][perf]") {
  const Tensor x0 = randn({6, 4}, 60, 0, 0.0, 1.0), w0 = randn({9, 4}, 61, 0, 0.0, 1.0);
  const Tensor targets = from_vector_i64({1, 8, 0, -100, 4, 4}, {6});
  auto grads = [&](bool hold_logits) {
    Tensor x = x0.clone(), w = w0.clone();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor logits = ag::linear(x, w, Tensor());
    const std::vector<double> before = logits.to_vector();
    Tensor loss = ag::cross_entropy(logits, targets);
    if (!hold_logits) logits = Tensor();
    autograd::backward(loss);
    if (hold_logits) CHECK(logits.to_vector() == before);  // the caller's logits are untouched
    return std::make_pair(x.grad(), w.grad());
  };
  const auto [gx_reused, gw_reused] = grads(false);
  const auto [gx_held, gw_held] = grads(true);
  CHECK(max_abs_diff(gx_reused, gx_held) == 0.0);
  CHECK(max_abs_diff(gw_reused, gw_held) == 0.0);
  CHECK(max_abs_diff(gw_held, zeros({9, 4})) > 1e-3);
}

TEST_CASE("the MFU denominator: dense bf16 datasheet peaks by card, unknown cards 0", "[bench]") {
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA H200", 9, 0) == 989);
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA H100 80GB HBM3", 9, 0) == 989);
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA H100 PCIe", 9, 0) == 756);
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA A100-SXM4-80GB", 8, 0) == 312);
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA A100-SXM4-80GB", 8, 6) == 0);  // name and capability must agree
  CHECK(cuda::dense_bf16_peak_tflops("NVIDIA GeForce RTX 4090", 8, 9) == 0);
  if (cuda::device_count() > 0) {  // [cuda] part: the running card describes itself
    const cuda::DeviceInfo d = cuda::device_info();
    INFO(d.name << " sm_" << d.major << d.minor);
    CHECK(!d.name.empty());
    CHECK(d.major >= 8);  // the build targets sm_80 and sm_90
    // The card this project is lent is an H200: its datasheet's dense bf16 peak, through device_info.
    if (d.name.find("H200") != std::string::npos) CHECK(d.peak_bf16_tflops == 989);
  }
}
