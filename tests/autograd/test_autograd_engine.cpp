// The backward engine (accumulation, shared inputs, grad mode, zero_grad, errors) and every
// gradcheck case registered by the elementwise, reduce and shape rule files.
#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"

using namespace qkv;

namespace {
Tensor leaf(const Shape& s, uint64_t seed) {
  Tensor t = randn(s, seed, 0, 0.0, 1.0, DType::f64);
  t.set_requires_grad(true);
  return t;
}
}  // namespace

TEST_CASE("gradients accumulate with += across two backward calls", "[autograd][engine]") {
  Tensor x = leaf({2, 3}, 1);
  const auto xv = x.to_vector();
  for (int round = 1; round <= 2; ++round) {
    Tensor y = ag::sum(ag::mul(x, x));  // dy/dx = 2x
    autograd::backward(y);
    const auto g = x.grad().to_vector();
    for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(2.0 * round * xv[i]));
  }
}

TEST_CASE("a tensor used twice gets the sum of both gradients", "[autograd][engine]") {
  Tensor x = leaf({4}, 2);
  Tensor w = leaf({4}, 3);
  // y = sum(x * w + x * 3): dy/dx = w + 3, dy/dw = x
  Tensor y = ag::sum(ag::add(ag::mul(x, w), ag::mul(x, 3.0)));
  autograd::backward(y);
  const auto xv = x.to_vector(), wv = w.to_vector(), gx = x.grad().to_vector(), gw = w.grad().to_vector();
  for (size_t i = 0; i < 4; ++i) {
    CHECK(gx[i] == Approx(wv[i] + 3));
    CHECK(gw[i] == Approx(xv[i]));
  }
  // Diamond: z = a * a with a = exp(x); dz/dx = 2 e^(2x)
  Tensor x2 = leaf({3}, 4);
  Tensor a = ag::exp(x2);
  autograd::backward(ag::sum(ag::mul(a, a)));
  const auto v = x2.to_vector(), g = x2.grad().to_vector();
  for (size_t i = 0; i < 3; ++i) CHECK(g[i] == Approx(2 * std::exp(2 * v[i])));
}

TEST_CASE("NoGradGuard records nothing and restores grad mode", "[autograd][engine]") {
  Tensor x = leaf({3}, 5);
  {
    autograd::NoGradGuard guard;
    CHECK_FALSE(autograd::grad_enabled());
    Tensor y = ag::mul(ag::exp(x), 2.0);
    CHECK_FALSE(y.grad_fn());
    CHECK_FALSE(y.requires_grad());
    CHECK_THROWS_WITH(autograd::backward(ag::sum(y)), Catch::Contains("does not require grad"));
  }
  CHECK(autograd::grad_enabled());
  Tensor y = ag::mul(x, 2.0);
  REQUIRE(y.grad_fn());
  CHECK(std::string(y.grad_fn()->name()) == "MulScalarBackward");
}

TEST_CASE("zero_grad clears gradients so the next backward starts fresh", "[autograd][engine]") {
  Tensor x = leaf({2}, 6);
  autograd::backward(ag::sum(ag::mul(x, 5.0)));
  CHECK(x.grad().to_vector() == std::vector<double>{5, 5});
  autograd::zero_grad({x});
  CHECK_FALSE(x.grad().defined());
  autograd::backward(ag::sum(ag::mul(x, 2.0)));
  CHECK(x.grad().to_vector() == std::vector<double>{2, 2});
}

TEST_CASE("backward on a non-scalar without a gradient is an error", "[autograd][engine][errors]") {
  Tensor x = leaf({2, 2}, 7);
  Tensor y = ag::mul(x, 3.0);
  CHECK_THROWS_WITH(autograd::backward(y), Catch::Contains("[backward] root of shape [2,2] is not a scalar"));
  autograd::backward(y, ones({2, 2}, DType::f64));
  CHECK(x.grad().to_vector() == std::vector<double>{3, 3, 3, 3});
  CHECK_THROWS_WITH(autograd::backward(y, ones({4}, DType::f64)), Catch::Contains("[backward] gradient [4]"));
}

TEST_CASE("inputs that do not require grad get no gradient and record no node", "[autograd][engine]") {
  Tensor x = leaf({3}, 8);
  Tensor c = randn({3}, 9, 0, 0.0, 1.0, DType::f64);
  Tensor y = ag::mul(c, c);
  CHECK_FALSE(y.grad_fn());
  autograd::backward(ag::sum(ag::div(x, ag::add(y, 1.0))));
  CHECK_FALSE(c.grad().defined());
  const auto cv = c.to_vector(), g = x.grad().to_vector();
  for (size_t i = 0; i < 3; ++i) CHECK(g[i] == Approx(1 / (cv[i] * cv[i] + 1)));
}

TEST_CASE("gradcheck catches a wrong gradient", "[autograd][gradcheck]") {
  // A case whose function is not what its rule differentiates: y = x * stop(x) looks like x^2 to
  // finite differences, but only one factor is tracked, so the analytic gradient is x, not 2x.
  autograd::GradcheckCase c{"wrong", "x * detached x",
                            [] { return std::vector<Tensor>{randn({3}, 1, 0, 0.0, 1.0, DType::f64)}; },
                            [](const std::vector<Tensor>& x) {
                              Tensor stop = x[0].clone();
                              return ag::mul(x[0], stop);
                            }};
  CHECK_FALSE(autograd::run_gradcheck(c).pass);
}
