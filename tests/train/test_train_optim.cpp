// AdamW against a PyTorch fixture and a hand-worked case, the LR schedule against its formula,
// and global-norm clipping against a naive float64 sum.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>

#include "compare_util.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/grad_norm.h"
#include "tensor/error.h"
#include "train/clip.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/schedule.h"

using namespace qkv;
using namespace qkv::train;
using Catch::Contains;

namespace {

Tensor make_f32(const Shape& shape, const std::vector<double>& values) {
  Tensor t = Tensor::empty(shape, DType::f32);
  REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
  float* p = t.data<float>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<float>(values[i]);
  return t;
}

// Deterministic pseudo-random values in [-1, 1) (no dependency on the tensor RNG ops).
std::vector<double> lcg_values(int64_t n, uint64_t seed) {
  std::vector<double> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(s >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
  }
  return v;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.numel() * a.element_size()) == 0;
}

nlohmann::json load_fixture() {
  std::ifstream f(std::string(QKV_SOURCE_DIR) + "/tests/reference/adamw.json");
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

}  // namespace

TEST_CASE("AdamW matches torch.optim.AdamW step by step on the recorded fixture", "[train][adamw]") {
  const nlohmann::json fx = load_fixture();
  AdamWOptions opts;
  opts.beta1 = fx["betas"][0];
  opts.beta2 = fx["betas"][1];
  opts.eps = fx["eps"];
  opts.weight_decay = fx["weight_decay"];
  std::vector<OptimParam> params;
  for (const auto& p : fx["params"])
    params.push_back(
        {p["name"], make_f32(p["shape"].get<Shape>(), p["init"].get<std::vector<double>>()), p["decay"].get<bool>()});
  AdamW opt(params, opts);

  double max_abs = 0, max_rel = 0;
  int step = 0;
  for (const auto& s : fx["steps"]) {
    for (OptimParam& p : params)
      p.param.set_grad(make_f32(p.param.shape(), s["grads"][p.name].get<std::vector<double>>()));
    opt.step(s["lr"].get<double>());
    ++step;
    for (const OptimParam& p : params) {
      const auto want = s["params"][p.name].get<std::vector<double>>();
      const auto got = p.param.to_vector();
      for (size_t i = 0; i < want.size(); ++i) {
        const double err = std::abs(got[i] - want[i]);
        max_abs = std::max(max_abs, err);
        max_rel = std::max(max_rel, err / std::max(std::abs(want[i]), 1e-3));
        INFO("step " << step << " " << p.name << "[" << i << "] got " << got[i] << " want " << want[i]);
        REQUIRE(err <= 1e-6 * std::max(std::abs(want[i]), 1e-3));
      }
    }
  }
  CHECK(opt.step_count() == 5);
  for (const OptimParam& p : params) {
    const auto& want = fx["final_state"][p.name];
    const auto m = opt.state(p.name).exp_avg.to_vector(), v = opt.state(p.name).exp_avg_sq.to_vector();
    const auto wm = want["exp_avg"].get<std::vector<double>>(), wv = want["exp_avg_sq"].get<std::vector<double>>();
    for (size_t i = 0; i < wm.size(); ++i) {
      CHECK(std::abs(m[i] - wm[i]) <= 1e-6 * std::abs(wm[i]) + 1e-12);
      CHECK(std::abs(v[i] - wv[i]) <= 1e-6 * std::abs(wv[i]) + 1e-15);
    }
  }
  std::printf("[adamw fixture] 5 steps vs torch %s: max abs err %.3g, max rel err %.3g\n",
              fx["torch_version"].get<std::string>().c_str(), max_abs, max_rel);
}

TEST_CASE("AdamW with zero gradients only decays the decayed parameters by (1 - lr*wd) per step", "[train][adamw]") {
  // m = v = 0 so the Adam term is 0 / (0 + eps) = 0; what is left is the decoupled decay.
  OptimParam w{"w", make_f32({2, 2}, {1.0, -2.0, 0.5, 4.0}), true};
  OptimParam b{"b", make_f32({2}, {3.0, -1.0}), false};
  w.param.set_grad(make_f32({2, 2}, {0, 0, 0, 0}));
  b.param.set_grad(make_f32({2}, {0, 0}));
  AdamWOptions o;
  o.weight_decay = 0.5;
  AdamW opt({w, b}, o);
  opt.step(0.1);
  opt.step(0.2);
  const double f = (1 - 0.1 * 0.5) * (1 - 0.2 * 0.5);  // 0.855
  CHECK(w.param.to_vector() == std::vector<double>{static_cast<float>(static_cast<float>(1.0 * 0.95f) * 0.9f),
                                                   static_cast<float>(static_cast<float>(-2.0 * 0.95f) * 0.9f),
                                                   static_cast<float>(static_cast<float>(0.5 * 0.95f) * 0.9f),
                                                   static_cast<float>(static_cast<float>(4.0 * 0.95f) * 0.9f)});
  CHECK(w.param.at({1, 1}) == Approx(4.0 * f).epsilon(1e-6));
  CHECK(b.param.to_vector() == std::vector<double>{3.0, -1.0});
}

TEST_CASE("AdamW's first step moves each weight by lr times the sign of its gradient", "[train][adamw]") {
  // t = 1: m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps) ~ lr * sign(g).
  OptimParam p{"p", make_f32({4}, {0.0, 0.0, 1.0, -1.0}), false};
  p.param.set_grad(make_f32({4}, {0.5, -3.0, 1e-3, -2e-2}));
  AdamWOptions o;
  o.eps = 0;
  AdamW opt({p}, o);
  opt.step(0.01);
  const auto got = p.param.to_vector();
  CHECK(got[0] == Approx(-0.01).epsilon(1e-6));
  CHECK(got[1] == Approx(0.01).epsilon(1e-6));
  CHECK(got[2] == Approx(0.99).epsilon(1e-6));
  CHECK(got[3] == Approx(-0.99).epsilon(1e-6));
}

namespace {

// Three AdamW steps on `dev` over odd-sized parameters, against a naive float64 update. On the CPU
// this exercises the split of the concatenated range across threads (slices cut inside
// parameters); on the GPU, the one-launch kernel's chunks (parameters of 1 element to many chunks).
void expect_adamw_matches_naive(Device dev) {
  const std::vector<int64_t> sizes = {1, 17, 70001, 3, 40000, 129, 4096, 4097};
  std::vector<OptimParam> params;
  std::vector<std::vector<double>> p_ref, m_ref, v_ref, grads;
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto init = lcg_values(sizes[k], 10 + k);
    params.push_back({"p" + std::to_string(k), make_f32({sizes[k]}, init).to(dev), k % 2 == 0});
    p_ref.push_back(params.back().param.to_vector());
    m_ref.emplace_back(sizes[k], 0.0);
    v_ref.emplace_back(sizes[k], 0.0);
  }
  AdamWOptions o;
  AdamW opt(params, o);
  const double lrs[3] = {1e-2, 5e-3, 2e-2};
  for (int t = 1; t <= 3; ++t) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      auto g = lcg_values(sizes[k], 100 * t + k);
      params[k].param.set_grad(make_f32({sizes[k]}, g).to(dev));
      g = params[k].param.grad().to_vector();  // the float32 values actually used
      const double wd = params[k].decay ? o.weight_decay : 0.0;
      for (int64_t i = 0; i < sizes[k]; ++i) {
        double& p = p_ref[k][i];
        double& m = m_ref[k][i];
        double& v = v_ref[k][i];
        p *= 1 - lrs[t - 1] * wd;
        m = o.beta1 * m + (1 - o.beta1) * g[i];
        v = o.beta2 * v + (1 - o.beta2) * g[i] * g[i];
        const double mh = m / (1 - std::pow(o.beta1, t)), vh = v / (1 - std::pow(o.beta2, t));
        p -= lrs[t - 1] * mh / (std::sqrt(vh) + o.eps);
      }
    }
    opt.step(lrs[t - 1]);
  }
  double max_err = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const auto got = params[k].param.to_vector();
    for (int64_t i = 0; i < sizes[k]; ++i) max_err = std::max(max_err, std::abs(got[i] - p_ref[k][i]));
  }
  CHECK(max_err < 1e-6);
}

}  // namespace

TEST_CASE("AdamW over many odd-sized parameters matches a naive float64 update on every element", "[train][adamw]") {
  expect_adamw_matches_naive(Device::cpu);
}

TEST_CASE("on the GPU, AdamW over all parameters in one launch matches a naive float64 update",
          "[train][adamw][cuda]") {
  if (!test::cuda_device_present()) return;
  expect_adamw_matches_naive(Device::cuda);
}

TEST_CASE("AdamW restored from saved moments and step continues bitwise identically", "[train][adamw][exact]") {
  auto make_params = [] {
    return std::vector<OptimParam>{{"a", make_f32({3, 5}, lcg_values(15, 1)), true},
                                   {"b", make_f32({7}, lcg_values(7, 2)), false}};
  };
  auto set_grads = [](std::vector<OptimParam>& ps, int t) {
    for (size_t k = 0; k < ps.size(); ++k)
      ps[k].param.set_grad(make_f32(ps[k].param.shape(), lcg_values(ps[k].param.numel(), 50 + 7 * t + k)));
  };
  std::vector<OptimParam> full = make_params();
  AdamW run(full, AdamWOptions{});
  for (int t = 0; t < 6; ++t) {
    set_grads(full, t);
    run.step(1e-2 * (t + 1));
    if (t == 2) {
      // "checkpoint": copy params, moments and step into a fresh optimizer
      std::vector<OptimParam> resumed = make_params();
      for (size_t k = 0; k < resumed.size(); ++k)
        std::memcpy(resumed[k].param.raw_data(), full[k].param.raw_data(), full[k].param.numel() * 4);
      AdamW again(resumed, AdamWOptions{});
      for (const OptimParam& p : full)
        again.load_state(p.name, run.state(p.name).exp_avg.clone(), run.state(p.name).exp_avg_sq.to(DType::f64));
      again.set_step_count(run.step_count());
      std::vector<OptimParam> ref = full;  // same handles: `run` keeps going below
      for (int u = 3; u < 6; ++u) {
        set_grads(resumed, u);
        again.step(1e-2 * (u + 1));
      }
      // continue the original to step 6 and compare
      for (int u = 3; u < 6; ++u) {
        set_grads(full, u);
        run.step(1e-2 * (u + 1));
      }
      for (size_t k = 0; k < full.size(); ++k) {
        CHECK(bitwise_equal(full[k].param, resumed[k].param));
        CHECK(bitwise_equal(run.state(full[k].name).exp_avg, again.state(full[k].name).exp_avg));
        CHECK(bitwise_equal(run.state(full[k].name).exp_avg_sq, again.state(full[k].name).exp_avg_sq));
      }
      CHECK(again.step_count() == 6);
      break;
    }
  }
}

TEST_CASE("AdamW leaves parameters without a gradient untouched", "[train][adamw]") {
  OptimParam a{"a", make_f32({2}, {1.0, 2.0}), true}, b{"b", make_f32({2}, {3.0, 4.0}), true};
  a.param.set_grad(make_f32({2}, {0.1, -0.1}));
  AdamW opt({a, b}, AdamWOptions{});
  opt.step(0.1);
  CHECK(a.param.at({0}) != 1.0);
  CHECK(b.param.to_vector() == std::vector<double>{3.0, 4.0});
  CHECK(opt.state("b").exp_avg.to_vector() == std::vector<double>{0.0, 0.0});
}

TEST_CASE("AdamW refuses duplicate, tied, mistyped and mismatched parameters", "[train][adamw][errors]") {
  Tensor w = make_f32({2, 2}, {1, 2, 3, 4});
  CHECK_THROWS_WITH(AdamW({{"w", w, true}, {"w", make_f32({1}, {0}), true}}, AdamWOptions{}),
                    Contains("[adamw] parameter name w appears twice"));
  CHECK_THROWS_WITH(AdamW({{"w", w, true}, {"lm_head", w, true}}, AdamWOptions{}), Contains("lm_head shares its data"));
  Tensor d = Tensor::empty({2}, DType::f64);
  CHECK_THROWS_WITH(AdamW({{"d", d, true}}, AdamWOptions{}), Contains("[adamw] parameter d is float64"));
  CHECK_THROWS_WITH(AdamW({{"t", w.transpose(0, 1), true}}, AdamWOptions{}), Contains("must be contiguous"));
  AdamW opt({{"w", w, true}}, AdamWOptions{});
  w.set_grad(make_f32({4}, {1, 1, 1, 1}));
  CHECK_THROWS_WITH(opt.step(0.1), Contains("[adamw] gradient of w has shape [4] but the parameter is [2,2]"));
  CHECK_THROWS_WITH(opt.load_state("w", make_f32({4}, {0, 0, 0, 0}), make_f32({2, 2}, {0, 0, 0, 0})),
                    Contains("w.exp_avg has shape [4] but the parameter is [2,2]"));
  CHECK_THROWS_WITH(opt.load_state("x", w, w), Contains("no parameter named x"));
  CHECK_THROWS_WITH(opt.state("x"), Contains("no parameter named x"));
}

TEST_CASE("AdamW options come from the train section", "[train][adamw]") {
  Config c = parse_config_text("[train]\nlr = 3e-4\nbeta1 = 0.8\nbeta2 = 0.99\neps = 1e-6\nweight_decay = 0.0\n", "t");
  AdamWOptions o = AdamWOptions::from(c.train);
  CHECK(o.lr == 3e-4);
  CHECK(o.beta1 == 0.8);
  CHECK(o.beta2 == 0.99);
  CHECK(o.eps == 1e-6);
  CHECK(o.weight_decay == 0.0);
}

// ---- schedule ----

TEST_CASE("cosine schedule follows nanoGPT's warmup and decay at hand-picked steps", "[train][schedule]") {
  LrSchedule s{LrScheduleKind::cosine, 1e-3, 1e-4, 10, 100};
  CHECK(s.at(0) == Approx(1e-3 / 11).epsilon(1e-12));  // (0+1)/(10+1)
  CHECK(s.at(4) == Approx(5e-3 / 11).epsilon(1e-12));
  CHECK(s.at(9) == Approx(10e-3 / 11).epsilon(1e-12));
  CHECK(s.at(10) == Approx(1e-3).epsilon(1e-12));                   // r = 0: full lr
  CHECK(s.at(28) == Approx(9.1405764746872634e-4).epsilon(1e-12));  // r = 0.2: 1e-4 + 9e-4 * 0.5 (1 + cos 0.2 pi)
  CHECK(s.at(55) == Approx(5.5e-4).epsilon(1e-12));                 // r = 0.5: halfway between lr and min_lr
  CHECK(s.at(91) == Approx(1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.9))).epsilon(1e-12));
  CHECK(s.at(100) == Approx(1e-4).epsilon(1e-12));  // r = 1: min_lr
  CHECK(s.at(500) == 1e-4);
  for (int64_t t = 11; t <= 100; ++t) CHECK(s.at(t) < s.at(t - 1));  // strictly decreasing after warmup
}

TEST_CASE("constant schedule warms up then holds lr; no warmup starts at lr", "[train][schedule]") {
  LrSchedule c{LrScheduleKind::constant, 2e-3, 1e-4, 3, 10};
  CHECK(c.at(0) == Approx(0.5e-3));
  CHECK(c.at(2) == Approx(1.5e-3));
  CHECK(c.at(3) == 2e-3);
  CHECK(c.at(1000) == 2e-3);
  LrSchedule n{LrScheduleKind::cosine, 1e-3, 1e-4, 0, 50};
  CHECK(n.at(0) == 1e-3);
  CHECK(n.at(25) == Approx(5.5e-4));
  LrSchedule degenerate{LrScheduleKind::cosine, 1e-3, 1e-4, 5, 5};  // no room to decay
  CHECK(degenerate.at(4) == Approx(1e-3 * 5 / 6));
  CHECK(degenerate.at(5) == 1e-4);
}

TEST_CASE("the schedule is built from the train section", "[train][schedule]") {
  Config c = parse_config_text(
      "[train]\nlr = 6e-4\nmin_lr = 6e-5\nwarmup_steps = 100\nmax_steps = 2000\n"
      "lr_schedule = \"constant\"\n",
      "t");
  LrSchedule s = LrSchedule::from(c.train);
  CHECK(s.kind == LrScheduleKind::constant);
  CHECK(s.lr == 6e-4);
  CHECK(s.min_lr == 6e-5);
  CHECK(s.warmup_steps == 100);
  CHECK(s.max_steps == 2000);
}

// ---- clipping ----

TEST_CASE("global norm matches a naive float64 sum over strided, float32 and float64 tensors", "[train][clip]") {
  Tensor a = make_f32({300, 70}, lcg_values(21000, 3));
  Tensor b = make_f32({5}, {3.0, -4.0, 0.0, 1e-3, 1e3});
  Tensor c = Tensor::empty({40, 300}, DType::f64);
  auto cv = lcg_values(12000, 4);
  std::memcpy(c.raw_data(), cv.data(), cv.size() * 8);
  Tensor ct = c.transpose(0, 1);  // non-contiguous
  double naive = 0;
  for (double x : a.to_vector()) naive += x * x;
  for (double x : b.to_vector()) naive += x * x;
  for (double x : cv) naive += x * x;
  naive = std::sqrt(naive);
  CHECK(global_norm({a, b, ct, Tensor()}) == Approx(naive).epsilon(1e-13));
  CHECK(global_norm({}) == 0.0);
}

TEST_CASE("on the GPU, per-tensor sums of squares match naive float64 sums, across block counts, bitwise run to run",
          "[train][clip][cuda]") {
  if (!test::cuda_device_present()) return;
  // Sizes from one element to a tensor that takes every block the kernel allows (and an empty one).
  std::vector<Tensor> host;
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{4097}, int64_t{0}, int64_t{5} << 20})
    host.push_back(make_f32({n}, lcg_values(n, static_cast<uint64_t>(n) + 7)));
  Tensor c = Tensor::empty({40, 300}, DType::f64);
  const auto cv = lcg_values(12000, 4);
  std::memcpy(c.raw_data(), cv.data(), cv.size() * 8);
  host.push_back(c.transpose(0, 1));  // float64, non-contiguous
  std::vector<Tensor> dev;
  for (const Tensor& t : host) dev.push_back(t.to(Device::cuda));
  const std::vector<double> got = cuda::sum_squares(dev), again = cuda::sum_squares(dev);
  REQUIRE(got.size() == host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    // The reference sums in long double: a float64 running sum over 5M squares drifts by a few
    // 1e-13 (found by the emulated run), more than the device's tree, which stays near 1e-15.
    long double naive = 0;
    for (double x : host[i].to_vector()) naive += static_cast<long double>(x) * x;
    INFO("tensor " << i << " of " << host[i].numel() << " elements");
    CHECK(got[i] == Approx(static_cast<double>(naive)).epsilon(1e-13));
    CHECK(got[i] == again[i]);
  }
  CHECK(global_norm(dev) == Approx(global_norm(host)).epsilon(1e-13));
}

TEST_CASE("clip_grad_norm scales gradients to max_norm only when the norm exceeds it", "[train][clip]") {
  Tensor p = make_f32({3}, {0, 0, 0}), q = make_f32({2, 2}, {0, 0, 0, 0}), r = make_f32({1}, {0});
  p.set_grad(make_f32({3}, {3.0, 0.0, 0.0}));
  q.set_grad(make_f32({2, 2}, {0.0, 4.0, 0.0, 0.0}));  // norm = 5
  // r has no gradient: skipped
  double n = clip_grad_norm({p, q, r}, 1.0);
  CHECK(n == Approx(5.0).epsilon(1e-15));
  const double coef = 1.0 / (5.0 + 1e-6);
  CHECK(p.grad().at({0}) == Approx(3.0 * coef).epsilon(1e-7));
  CHECK(q.grad().at({0, 1}) == Approx(4.0 * coef).epsilon(1e-7));
  CHECK(global_grad_norm({p, q, r}) == Approx(1.0).epsilon(1e-6));

  // below the threshold: untouched, bitwise
  Tensor before = q.grad().clone();
  CHECK(clip_grad_norm({p, q}, 10.0) == Approx(1.0).epsilon(1e-6));
  CHECK(bitwise_equal(before, q.grad()));
  // max_norm = 0 means off
  q.set_grad(make_f32({2, 2}, {100.0, 0.0, 0.0, 0.0}));
  CHECK(clip_grad_norm({q}, 0.0) == Approx(100.0));
  CHECK(q.grad().at({0, 0}) == 100.0);
}

TEST_CASE("a non-finite gradient norm is returned and nothing is scaled", "[train][clip]") {
  Tensor p = make_f32({3}, {0, 0, 0});
  p.set_grad(make_f32({3}, {1.0, INFINITY, 2.0}));
  CHECK(std::isinf(clip_grad_norm({p}, 1.0)));
  CHECK(p.grad().at({2}) == 2.0);
  p.set_grad(make_f32({3}, {1.0, NAN, 2.0}));
  CHECK(std::isnan(clip_grad_norm({p}, 1.0)));
  CHECK(p.grad().at({0}) == 1.0);
  CHECK(clip_scale(NAN, 1.0) == 1.0f);
  CHECK(clip_scale(INFINITY, 1.0) == 1.0f);
}

TEST_CASE("the gradient norm is the same bits with one thread or several", "[train][clip]") {
  Tensor a = make_f32({123457}, lcg_values(123457, 9)), b = make_f32({8191}, lcg_values(8191, 10));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_norm({a, b});
  omp_set_num_threads(std::max(2, saved));
  const double many = global_norm({a, b});
  omp_set_num_threads(saved);
  CHECK(std::memcmp(&one, &many, sizeof(double)) == 0);
}

TEST_CASE("clipping inside AdamW's step equals clipping the gradients first, bitwise", "[train][clip][adamw][exact]") {
  auto make = [] {
    std::vector<OptimParam> ps{{"a", make_f32({64, 33}, lcg_values(64 * 33, 11)), true},
                               {"b", make_f32({33}, lcg_values(33, 12)), false}};
    for (size_t k = 0; k < ps.size(); ++k) {
      auto g = lcg_values(ps[k].param.numel(), 20 + k);
      for (double& x : g) x *= 10;  // norm well above 1
      ps[k].param.set_grad(make_f32(ps[k].param.shape(), g));
    }
    return ps;
  };
  std::vector<OptimParam> x = make(), y = make();
  AdamW ox(x, AdamWOptions{}), oy(y, AdamWOptions{});
  const double nx = clip_grad_norm({x[0].param, x[1].param}, 1.0);
  ox.step(1e-2);
  const double ny = global_grad_norm({y[0].param, y[1].param});
  oy.step(1e-2, clip_scale(ny, 1.0));
  CHECK(nx == ny);
  CHECK(clip_scale(ny, 1.0) < 1.0f);
  for (size_t k = 0; k < x.size(); ++k) {
    CHECK(bitwise_equal(x[k].param, y[k].param));
    CHECK(bitwise_equal(ox.state(x[k].name).exp_avg_sq, oy.state(y[k].name).exp_avg_sq));
  }
}
