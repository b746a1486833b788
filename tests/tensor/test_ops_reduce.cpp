// Reductions and softmax against naive float64 loops over logical indices, float32 and float64,
// contiguous and transposed inputs, small and large (OpenMP) sizes.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "compare_util.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

const DType kFloatTypes[] = {DType::f32, DType::f64};

Tensor input(const Shape& s, uint64_t seed, DType t, bool noncontig, double lo = -2, double hi = 2) {
  if (!noncontig || s.size() < 2) return rand(s, seed, 0, lo, hi, t);
  Shape sw = s;
  std::swap(sw.front(), sw.back());
  return rand(sw, seed, 0, lo, hi, t).transpose(0, static_cast<int>(s.size()) - 1);
}

// Multi-index <-> flat row-major index.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

using test::check_close;

// Naive sum over the dims in `red` (keepdim layout), in float64.
std::vector<double> naive_sum(const Tensor& a, const std::vector<bool>& red, Shape& kshape) {
  kshape = a.shape();
  for (size_t d = 0; d < kshape.size(); ++d)
    if (red[d]) kshape[d] = 1;
  std::vector<double> out(static_cast<size_t>(checked_numel(kshape)), 0.0);
  const auto v = a.to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    auto idx = unravel(static_cast<int64_t>(i), a.shape());
    for (size_t d = 0; d < idx.size(); ++d)
      if (red[d]) idx[d] = 0;
    out[ravel(idx, kshape)] += v[i];
  }
  return out;
}

// Naive softmax along dim, float64: one pass per line of elements along dim.
std::vector<double> naive_softmax(const Tensor& a, int dim, bool log) {
  const Shape s = a.shape();
  const auto v = a.to_vector();
  std::vector<double> out(v.size());
  Shape lines = s;
  lines[dim] = 1;
  for (int64_t l = 0; l < checked_numel(lines); ++l) {
    auto idx = unravel(l, lines);
    std::vector<int64_t> at(static_cast<size_t>(s[dim]));
    for (idx[dim] = 0; idx[dim] < s[dim]; ++idx[dim]) at[idx[dim]] = ravel(idx, s);
    double m = -INFINITY, z = 0;
    for (int64_t j : at) m = std::max(m, v[j]);
    for (int64_t j : at) z += std::exp(v[j] - m);
    for (int64_t j : at) out[j] = log ? v[j] - m - std::log(z) : std::exp(v[j] - m) / z;
  }
  return out;
}

}  // namespace

TEST_CASE("sum and mean over any set of dims match a float64 loop", "[ops][reduce]") {
  struct Case {
    Shape shape;
    std::vector<int> dims;
    bool noncontig;
  };
  const Case cases[] = {
      {{3, 4}, {1}, false},          {{3, 4}, {0}, false},          {{3, 4}, {0}, true},
      {{2, 3, 5}, {0, 2}, false},    {{2, 3, 5}, {1}, true},        {{2, 3, 5}, {-1, -3}, true},
      {{1, 7, 1}, {0}, false},       {{4, 1, 3}, {1}, false},       {{5}, {0}, false},
      {{300, 257}, {0}, false},      {{257, 300}, {1}, false},      {{300, 257}, {0}, true},
      {{64, 40, 33}, {0, 1}, false}, {{2, 3, 4}, {0, 1, 2}, false},
  };
  for (DType t : kFloatTypes) {
    for (const auto& c : cases) {
      const Tensor a = input(c.shape, 101, t, c.noncontig);
      std::vector<bool> red(c.shape.size(), false);
      for (int d : c.dims) red[normalize_dim(d, static_cast<int>(c.shape.size()), "test")] = true;
      Shape kshape;
      const auto want = naive_sum(a, red, kshape);
      const int64_t count = a.numel() / checked_numel(kshape);
      INFO(dtype_name(t) << " " << shape_str(c.shape) << (c.noncontig ? " strided" : ""));
      const double rtol = t == DType::f32 ? 1e-6 : 1e-12, atol = t == DType::f32 ? 1e-5 : 1e-12;
      const Tensor s_keep = sum(a, c.dims, true);
      REQUIRE(s_keep.shape() == kshape);
      check_close(s_keep, want, rtol, atol);
      Shape dropped;
      for (size_t d = 0; d < kshape.size(); ++d)
        if (!red[d]) dropped.push_back(kshape[d]);
      const Tensor s = sum(a, c.dims);
      CHECK(s.shape() == dropped);
      std::vector<double> want_mean = want;
      for (double& w : want_mean) w /= static_cast<double>(count);
      check_close(mean(a, c.dims), want_mean, rtol, atol);
    }
    const Tensor a = input({17, 9}, 102, t, true);
    double total = 0;
    for (double v : a.to_vector()) total += v;
    CHECK(sum(a).shape() == Shape{});
    CHECK(sum(a).item() == Approx(total).epsilon(1e-6));
    CHECK(mean(a).item() == Approx(total / 153).epsilon(1e-6));
  }
}

TEST_CASE("float32 sums keep their digits over a million elements", "[ops][reduce]") {
  // 0.1f summed 2^20 times: a float32 running sum drifts by ~1%, float64 accumulation does not.
  const Tensor a = full({1 << 20}, 0.1);
  const double want = static_cast<double>(0.1f) * (1 << 20);
  CHECK(sum(a).item() == Approx(want).epsilon(1e-6));
  CHECK(sum(a.view({1024, 1024}), {0}).at({3}) == Approx(static_cast<double>(0.1f) * 1024).epsilon(1e-6));
}

TEST_CASE("max and argmax pick the first maximum along a dim", "[ops][reduce]") {
  for (DType t : kFloatTypes) {
    const Tensor a = from_vector({1, 5, 5, 2, 7, 7, 7, 0, -1, -3, -1, -2}, {3, 4}, t);
    CHECK(max(a, 1).to_vector() == std::vector<double>{5, 7, -1});
    CHECK(argmax(a, 1).to_vector() == std::vector<double>{1, 0, 0});
    CHECK(argmax(a, 1).dtype() == DType::i64);
    CHECK(argmax(a, 0).to_vector() == std::vector<double>{1, 1, 1, 0});
    CHECK(max(a, 0, true).shape() == Shape{1, 4});
    CHECK(argmax(a.transpose(0, 1), 0).to_vector() == std::vector<double>{1, 0, 0});
    CHECK(std::isnan(max(from_vector({1, NAN, 3}, {3}, t), 0).item()));

    for (bool nc : {false, true}) {
      const Tensor r = input({6, 5, 7}, 111, t, nc);
      for (int dim : {0, 1, 2}) {
        const Tensor mv = max(r, dim), mi = argmax(r, dim);
        const auto v = r.to_vector(), gv = mv.to_vector(), gi = mi.to_vector();
        Shape rs = r.shape();
        rs[dim] = 1;
        for (int64_t o = 0; o < checked_numel(rs); ++o) {
          auto idx = unravel(o, rs);
          double best = -INFINITY;
          int64_t bi = -1;
          for (idx[dim] = 0; idx[dim] < r.size(dim); ++idx[dim]) {
            const double x = v[ravel(idx, r.shape())];
            if (x > best) {
              best = x;
              bi = idx[dim];
            }
          }
          CHECK(gv[o] == best);
          CHECK(gi[o] == bi);
        }
      }
    }
  }
  CHECK_THROWS_WITH(max(ones({3, 0}), 1), Catch::Contains("[max] dim 1 of [3,0] is empty"));
}

TEST_CASE("sum_to undoes broadcasting", "[ops][reduce]") {
  for (DType t : kFloatTypes) {
    const Tensor g = input({2, 3, 4}, 121, t, true);
    const auto v = g.to_vector();
    const Tensor s = sum_to(g, {3, 1});
    REQUIRE(s.shape() == Shape{3, 1});
    for (int j = 0; j < 3; ++j) {
      double w = 0;
      for (int i = 0; i < 2; ++i)
        for (int k = 0; k < 4; ++k) w += v[i * 12 + j * 4 + k];
      CHECK(s.at({j, 0}) == Approx(w).epsilon(1e-6));
    }
    CHECK(sum_to(g, {4}).shape() == Shape{4});
    CHECK(sum_to(g, {}).item() == Approx(sum(g).item()).epsilon(1e-12));
    CHECK(sum_to(g, {2, 3, 4}).same(g));
    CHECK(sum_to(g, {1, 1, 4}).shape() == Shape{1, 1, 4});
  }
  CHECK_THROWS_WITH(sum_to(ones({2, 3}), {4}), Catch::Contains("[sum_to]"));
  CHECK_THROWS_WITH(sum_to(ones({3}), {2, 3}), Catch::Contains("[sum_to] [3] is not a broadcast of [2,3]"));
}

TEST_CASE("softmax and log_softmax match a float64 loop along any dim", "[ops][reduce][softmax]") {
  struct Case {
    Shape shape;
    int dim;
    bool noncontig;
  };
  const Case cases[] = {{{3, 5}, -1, false},     {{3, 5}, 0, false},     {{4, 6}, 1, true},
                        {{2, 3, 4}, 1, false},   {{2, 3, 4}, 0, true},   {{5, 1}, -1, false},
                        {{70, 1000}, -1, false}, {{300, 200}, 0, false}, {{7, 33}, -1, true}};
  for (DType t : kFloatTypes) {
    for (const auto& c : cases) {
      const Tensor a = input(c.shape, 131, t, c.noncontig, -8, 8);
      INFO(dtype_name(t) << " " << shape_str(c.shape) << " dim " << c.dim << (c.noncontig ? " strided" : ""));
      const int d = normalize_dim(c.dim, a.dim(), "test");
      const double rtol = t == DType::f32 ? 2e-5 : 1e-12;
      check_close(softmax(a, c.dim), naive_softmax(a, d, false), rtol, t == DType::f32 ? 1e-8 : 1e-15);
      check_close(log_softmax(a, c.dim), naive_softmax(a, d, true), rtol, t == DType::f32 ? 2e-5 : 1e-12);
    }
  }
}

TEST_CASE("softmax is stable for huge logits and zero where the input is -inf", "[ops][reduce][softmax]") {
  for (DType t : kFloatTypes) {
    const Tensor a = from_vector({1000, 1001, -INFINITY, 999}, {1, 4}, t);
    const auto y = softmax(a, -1).to_vector();
    const double z = 1 + std::exp(1.0) + std::exp(-1.0);
    CHECK(y[0] == Approx(1 / z).epsilon(1e-5));
    CHECK(y[1] == Approx(std::exp(1.0) / z).epsilon(1e-5));
    CHECK(y[2] == 0.0);
    CHECK(y[3] == Approx(std::exp(-1.0) / z).epsilon(1e-5));
    const auto ly = log_softmax(a, -1).to_vector();
    CHECK(ly[1] == Approx(1 - std::log(z)).epsilon(1e-5));
    CHECK(ly[2] == -INFINITY);
    // the same along a non-last dim
    CHECK(softmax(a.transpose(0, 1), 0).to_vector()[2] == 0.0);
  }
}

TEST_CASE("softmax backward kernels match the closed-form vjp", "[ops][reduce][softmax]") {
  for (DType t : kFloatTypes) {
    for (int dim : {-1, 0}) {
      const Tensor x = input({6, 9}, 141, t, dim == 0);
      const Tensor dy = input({6, 9}, 142, t, false);
      const int d = normalize_dim(dim, 2, "test");
      const auto y = naive_softmax(x, d, false), ly = naive_softmax(x, d, true), g = dy.to_vector();
      std::vector<double> want(y.size()), want_log(y.size());
      for (size_t i = 0; i < y.size(); ++i) {
        auto idx = unravel(static_cast<int64_t>(i), {6, 9});
        double dot = 0, gs = 0;
        for (idx[d] = 0; idx[d] < (d == 0 ? 6 : 9); ++idx[d]) {
          const int64_t j = ravel(idx, {6, 9});
          dot += g[j] * y[j];
          gs += g[j];
        }
        want[i] = y[i] * (g[i] - dot);
        want_log[i] = g[i] - std::exp(ly[i]) * gs;
      }
      INFO(dtype_name(t) << " dim " << dim);
      const double rtol = t == DType::f32 ? 1e-4 : 1e-11, atol = t == DType::f32 ? 1e-6 : 1e-14;
      check_close(softmax_backward(softmax(x, dim), dy, dim), want, rtol, atol);
      check_close(log_softmax_backward(log_softmax(x, dim), dy, dim), want_log, rtol, atol);
    }
  }
}

TEST_CASE("reductions refuse bad dims and dtypes by name", "[ops][reduce][errors]") {
  CHECK_THROWS_WITH(sum(ones({2, 3}), {2}), Catch::Contains("[sum] dim 2 out of range"));
  CHECK_THROWS_WITH(sum(ones({2, 3}), {1, -1}), Catch::Contains("[sum] dim -1 listed twice"));
  CHECK_THROWS_WITH(mean(ones({2}, DType::i64)), Catch::Contains("[mean] input must be float32 or float64, not int64"));
  CHECK_THROWS_WITH(softmax(ones({2, 3}), 3), Catch::Contains("[softmax] dim 3 out of range"));
  CHECK_THROWS_WITH(softmax_backward(ones({2, 3}), ones({3, 2}), -1), Catch::Contains("[softmax_backward]"));
  CHECK_THROWS_WITH(mean(ones({0, 3}), {0}), Catch::Contains("[mean] mean over an empty set"));
}
