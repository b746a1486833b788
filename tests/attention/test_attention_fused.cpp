// The fused kernel against its oracles: the reference (composed) kernel in float32 over the mask
// grid and odd sizes, a naive float64 loop written here, dropout statistics, determinism, memory.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "attention/alibi.h"
#include "attention/attention.h"
#include "autograd/engine.h"
#include "compare_util.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

struct Dims {
  int64_t B, Hq, Hkv, Nq, Nk, D;
};

using test::rel_err;

Tensor bool_fn(const Shape& s, const std::function<bool(int64_t)>& f) {
  Tensor t = Tensor::empty(s, DType::boolean);
  for (int64_t e = 0; e < t.numel(); ++e) t.data<bool>()[e] = f(e);
  return t;
}

AttentionOptions mask_options(const std::string& kind, const Dims& d, DType dt) {
  AttentionOptions o;
  if (kind == "causal" || kind == "causal+padding" || kind == "fully masked rows") o.causal = true;
  if (kind == "key padding") {
    o.key_padding = bool_fn({d.B, d.Nk}, [&](int64_t e) { return (e % d.Nk) % 5 != 3; });
  } else if (kind == "window") {
    o.window = 9;
  } else if (kind == "bool mask") {
    o.allow_mask = bool_fn({d.B, 1, d.Nq, d.Nk}, [&](int64_t e) { return (e * 2654435761u >> 7) % 3 != 0; });
  } else if (kind == "bias") {
    o.bias = randn({1, d.Hq, d.Nq, d.Nk}, 99, 0, 0.0, 1.0, dt);
  } else if (kind == "causal+padding") {
    o.key_lengths = {d.Nk, d.Nk / 2};
  } else if (kind == "fully masked rows") {
    const int64_t pad = d.Nk - d.Nq + 5;  // batch 1's first 5 rows see nothing
    o.key_padding = bool_fn({d.B, d.Nk}, [&](int64_t e) { return e / d.Nk == 0 || e % d.Nk >= pad; });
  }
  return o;
}

struct Run {
  Tensor out, dq, dk, dv;
};

// Forward and backward on `dev` (inputs drawn on the host, then moved; results back on the host).
Run run(const Dims& d, const AttentionOptions& o, DType dt, uint64_t seed, Device dev = Device::cpu) {
  Tensor q = randn({d.B, d.Hq, d.Nq, d.D}, seed, 0, 0.0, 1.0, dt).to(dev).set_requires_grad(true);
  Tensor k = randn({d.B, d.Hkv, d.Nk, d.D}, seed + 1, 0, 0.0, 1.0, dt).to(dev).set_requires_grad(true);
  Tensor v = randn({d.B, d.Hkv, d.Nk, d.D}, seed + 2, 0, 0.0, 1.0, dt).to(dev).set_requires_grad(true);
  const Tensor g = randn({d.B, d.Hq, d.Nq, d.D}, seed + 3, 0, 0.0, 1.0, dt).to(dev);
  AttentionOptions od = o;
  for (Tensor* t : {&od.key_padding, &od.allow_mask, &od.bias, &od.segment_ids})
    if (t->defined()) *t = t->to(dev);
  Tensor out = attention(q, k, v, od);
  autograd::backward(out, g);
  const Device host = Device::cpu;
  return {out.to(host), q.grad().to(host), k.grad().to(host), v.grad().to(host)};
}

struct MaxErr {
  double out = 0, dq = 0, dk = 0, dv = 0;
  void add(const Run& a, const Run& b) {
    out = std::max(out, rel_err(a.out, b.out));
    dq = std::max(dq, rel_err(a.dq, b.dq));
    dk = std::max(dk, rel_err(a.dk, b.dk));
    dv = std::max(dv, rel_err(a.dv, b.dv));
  }
};

// The mask grid, 96 cases (8 masks × 3 head layouts × 2 sizes that are not
// multiples of the 64 tile × dropout off/on, float32, D 16): runs(d, o, seed) gives the pair of
// runs to compare; out within 1e-5 and the gradients within 1e-4 (relative). The worst errors.
MaxErr check_mask_grid(const std::function<std::pair<Run, Run>(const Dims&, const AttentionOptions&, uint64_t)>& runs) {
  const char* masks[] = {"no mask", "bool mask", "causal",         "key padding",
                         "window",  "bias",      "causal+padding", "fully masked rows"};
  const std::pair<int64_t, int64_t> heads[] = {{4, 4}, {4, 2}, {3, 1}};
  const std::pair<int64_t, int64_t> lengths[] = {{70, 70}, {37, 130}};
  MaxErr err;
  int cases = 0;
  for (const char* mask : masks)
    for (auto [hq, hkv] : heads)
      for (auto [nq, nk] : lengths)
        for (int drop = 0; drop < 2; ++drop) {
          const Dims d{2, hq, hkv, nq, nk, 16};
          AttentionOptions o = mask_options(mask, d, DType::f32);
          if (drop) {
            o.dropout_p = 0.2;
            o.dropout_seed = 42;
            o.dropout_offset = 7;
          }
          INFO(mask << " Hq=" << hq << " Hkv=" << hkv << " Nq=" << nq << " Nk=" << nk << " dropout=" << drop);
          const auto [a, b] = runs(d, o, 10 + cases);
          MaxErr one;
          one.add(a, b);
          CHECK(one.out <= 1e-5);
          CHECK(one.dq <= 1e-4);
          CHECK(one.dk <= 1e-4);
          CHECK(one.dv <= 1e-4);
          err.add(a, b);
          ++cases;
        }
  CHECK(cases == 96);
  return err;
}

}  // namespace

TEST_CASE("fused attention matches the reference kernel in float32 over the mask grid", "[attention]") {
  const MaxErr err = check_mask_grid([](const Dims& d, const AttentionOptions& o, uint64_t seed) {
    AttentionOptions r = o;
    r.kernel = Kernel::reference;
    return std::make_pair(run(d, o, DType::f32, seed), run(d, r, DType::f32, seed));
  });
  std::printf("[attention] fused vs reference float32, 96 cases: max rel err out %.2e dq %.2e dk %.2e dv %.2e\n",
              err.out, err.dq, err.dk, err.dv);
}

TEST_CASE("on the GPU, attention matches the CPU fused kernel over the same mask grid", "[attention][cuda]") {
  if (!test::cuda_device_present()) return;
  // The device takes its fused kernels, or the composed path for a bias or a bool mask; the
  // dropout mask is the CPU's Philox draw either way.
  const MaxErr err = check_mask_grid([](const Dims& d, const AttentionOptions& o, uint64_t seed) {
    return std::make_pair(run(d, o, DType::f32, seed, Device::cuda), run(d, o, DType::f32, seed));
  });
  std::printf("[attention] cuda vs cpu float32, 96 cases: max rel err out %.2e dq %.2e dk %.2e dv %.2e\n", err.out,
              err.dq, err.dk, err.dv);
}

TEST_CASE("fused attention matches the reference at larger odd sizes with every feature on", "[attention]") {
  const Dims d{2, 8, 2, 131, 259, 64};
  AttentionOptions o;
  o.causal = true;
  o.window = 100;
  o.key_lengths = {259, 200};
  o.alibi_slopes = alibi_slopes(8);
  o.dropout_p = 0.1;
  o.dropout_seed = 3;
  AttentionOptions r = o;
  r.kernel = Kernel::reference;
  MaxErr err;
  err.add(run(d, o, DType::f32, 500), run(d, r, DType::f32, 500));
  std::printf("[attention] fused vs reference float32 [2,8,131,64] k [2,2,259,64]: out %.2e dq %.2e dk %.2e dv %.2e\n",
              err.out, err.dq, err.dk, err.dv);
  CHECK(err.out <= 1e-5);
  CHECK(err.dq <= 1e-4);
  CHECK(err.dk <= 1e-4);
  CHECK(err.dv <= 1e-4);
}

TEST_CASE("fused attention matches a naive float64 loop, forward and backward", "[attention]") {
  const int64_t B = 2, Hq = 4, Hkv = 2, G = 2, Nq = 67, Nk = 90, D = 5;
  const double s = 1 / std::sqrt(double(D));
  Tensor q = randn({B, Hq, Nq, D}, 1, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
  Tensor k = randn({B, Hkv, Nk, D}, 2, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
  Tensor v = randn({B, Hkv, Nk, D}, 3, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
  const Tensor g = randn({B, Hq, Nq, D}, 4, 0, 0.0, 1.0, DType::f64);
  AttentionOptions o;
  o.causal = true;
  Tensor out = attention(q, k, v, o);
  autograd::backward(out, g);

  const auto Q = q.to_vector(), K = k.to_vector(), V = v.to_vector(), GO = g.to_vector();
  std::vector<double> O(B * Hq * Nq * D, 0), dQ(Q.size(), 0), dK(K.size(), 0), dV(V.size(), 0);
  auto qi = [&](int64_t b, int64_t h, int64_t i, int64_t c) { return ((b * Hq + h) * Nq + i) * D + c; };
  auto kj = [&](int64_t b, int64_t h, int64_t j, int64_t c) { return ((b * Hkv + h) * Nk + j) * D + c; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t hk = h / G, pos = Nk - Nq + i;
        std::vector<double> p(Nk, 0.0), dp(Nk, 0.0);
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += Q[qi(b, h, i, c)] * K[kj(b, hk, j, c)];
          p[j] = s * dot;
          mx = std::max(mx, p[j]);
        }
        for (int64_t j = 0; j <= pos; ++j) z += (p[j] = std::exp(p[j] - mx));
        for (int64_t j = 0; j <= pos; ++j) p[j] /= z;
        double di = 0;  // softmax Jacobian: dS_j = p_j (dP_j - Σ_l p_l dP_l)
        for (int64_t j = 0; j <= pos; ++j) {
          for (int64_t c = 0; c < D; ++c) {
            O[qi(b, h, i, c)] += p[j] * V[kj(b, hk, j, c)];
            dV[kj(b, hk, j, c)] += p[j] * GO[qi(b, h, i, c)];
            dp[j] += GO[qi(b, h, i, c)] * V[kj(b, hk, j, c)];
          }
          di += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= pos; ++j) {
          const double ds = p[j] * (dp[j] - di) * s;
          for (int64_t c = 0; c < D; ++c) {
            dQ[qi(b, h, i, c)] += ds * K[kj(b, hk, j, c)];
            dK[kj(b, hk, j, c)] += ds * Q[qi(b, h, i, c)];
          }
        }
      }
  auto max_diff = [](const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t e = 0; e < a.size(); ++e) m = std::max(m, std::fabs(a[e] - b[e]));
    return m;
  };
  CHECK(max_diff(out.to_vector(), O) < 1e-12);
  CHECK(max_diff(q.grad().to_vector(), dQ) < 1e-12);
  CHECK(max_diff(k.grad().to_vector(), dK) < 1e-12);
  CHECK(max_diff(v.grad().to_vector(), dV) < 1e-12);
}

TEST_CASE("attention dropout keeps 1-p of the weights, the same ones for the same seed", "[attention]") {
  const AttentionShape s{4, 8, 8, 128, 128};  // 524288 draws
  for (double p : {0.1, 0.5}) {
    AttentionOptions o;
    o.dropout_p = p;
    o.dropout_seed = 1234;
    const auto z = dropout_scale_mask(s, o).to_vector();
    double kept = 0;
    for (double x : z) {
      kept += x != 0;
      if (x != 0) REQUIRE(x == Approx(1 / (1 - p)).epsilon(1e-6));
    }
    const double frac = kept / z.size();
    INFO("p = " << p << ": kept " << frac);
    CHECK(std::fabs(frac - (1 - p)) < 0.02);
    CHECK(std::fabs(frac - (1 - p)) < 0.005);  // in fact much closer at this size
    CHECK(max_abs_diff(dropout_scale_mask(s, o), dropout_scale_mask(s, o)) == 0.0);
    AttentionOptions other = o;
    other.dropout_offset = 1;
    CHECK(max_abs_diff(dropout_scale_mask(s, o), dropout_scale_mask(s, other)) > 0.0);
  }
  // Through the op: same seed, same output; another seed, another output.
  const Tensor q = randn({1, 2, 40, 8}, 1), k = randn({1, 2, 40, 8}, 2), v = randn({1, 2, 40, 8}, 3);
  AttentionOptions o;
  o.causal = true;
  o.dropout_p = 0.3;
  o.dropout_seed = 9;
  CHECK(max_abs_diff(attention(q, k, v, o), attention(q, k, v, o)) == 0.0);
  AttentionOptions o2 = o;
  o2.dropout_seed = 10;
  CHECK(max_abs_diff(attention(q, k, v, o), attention(q, k, v, o2)) > 1e-3);
}

TEST_CASE("the fused backward regenerates the forward's dropout mask", "[attention]") {
  // dV = (P∘Z)ᵀ·dO, with P from the weights and Z from the documented draw.
  const int64_t N = 50, D = 8;
  Tensor q = randn({1, 2, N, D}, 1, 0, 0.0, 1.0, DType::f64);
  Tensor k = randn({1, 2, N, D}, 2, 0, 0.0, 1.0, DType::f64);
  Tensor v = randn({1, 2, N, D}, 3, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
  const Tensor g = randn({1, 2, N, D}, 4, 0, 0.0, 1.0, DType::f64);
  AttentionOptions o;
  o.causal = true;
  o.dropout_p = 0.5;
  o.dropout_seed = 77;
  autograd::backward(attention(q, k, v, o), g);
  const Tensor p = attention_with_weights(q, k, v, o).weights;
  const Tensor z = dropout_scale_mask({1, 2, 2, N, N}, o, DType::f64);
  const Tensor want = matmul(mul(p, z).transpose(2, 3), g);
  CHECK(max_abs_diff(v.grad(), want) < 1e-12);
  // A different mask would not match.
  AttentionOptions other = o;
  other.dropout_seed = 78;
  const Tensor wrong = matmul(mul(p, dropout_scale_mask({1, 2, 2, N, N}, other, DType::f64)).transpose(2, 3), g);
  CHECK(max_abs_diff(v.grad(), wrong) > 1e-3);
}

TEST_CASE("fused attention is bitwise reproducible and independent of the thread count", "[attention][exact]") {
  const Dims d{2, 4, 2, 150, 150, 32};
  AttentionOptions o;
  o.causal = true;
  o.dropout_p = 0.1;
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  const Run one = run(d, o, DType::f32, 5);
  omp_set_num_threads(std::max(2, prev));
  const Run two = run(d, o, DType::f32, 5), again = run(d, o, DType::f32, 5);
  omp_set_num_threads(prev);
  for (const Run* r : {&two, &again}) {
    CHECK(max_abs_diff(one.out, r->out) == 0.0);
    CHECK(max_abs_diff(one.dq, r->dq) == 0.0);
    CHECK(max_abs_diff(one.dk, r->dk) == 0.0);
    CHECK(max_abs_diff(one.dv, r->dv) == 0.0);
  }
}

TEST_CASE("fused attention at N=4096 allocates no N×N buffer, forward or backward", "[attention]") {
  const int64_t N = 4096, D = 64, H = 2;
  Tensor q = randn({1, H, N, D}, 1).set_requires_grad(true);
  Tensor k = randn({1, H, N, D}, 2).set_requires_grad(true);
  Tensor v = randn({1, H, N, D}, 3).set_requires_grad(true);
  const Tensor g = randn({1, H, N, D}, 4);
  AttentionOptions o;
  o.causal = true;
  const int64_t before = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  {
    Tensor out = attention(q, k, v, o);
    autograd::backward(out, g);
  }
  const int64_t extra = allocator_stats().peak_bytes - before;
  const int64_t nn = N * N * 4;
  std::printf("[attention] fused fwd+bwd N=%lld D=%lld H=%lld: peak extra %.2f MB (one N×N float32 = %.0f MB)\n",
              (long long)N, (long long)D, (long long)H, extra / 1048576.0, nn / 1048576.0);
  CHECK(extra < nn / 4);
  // O(N·D): out, dq, dk, dv and small per-row / per-thread buffers.
  CHECK(extra < 8 * H * N * D * 4);
  CHECK(all_finite(q.grad()));
}
