// Elementwise, comparison, selection and factory ops against naive float64 loops over the logical
// (row-major) values, in float32 and float64, on contiguous, non-contiguous and broadcast inputs.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "compare_util.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

const DType kFloatTypes[] = {DType::f32, DType::f64};

// Tolerances for a float kernel against a float64 reference computed from the same inputs.
double rtol_for(DType t) { return t == DType::f32 ? 2e-6 : 1e-13; }

// A tensor with logical shape s whose memory layout is not contiguous (a transpose for >= 2-d,
// every other element for 1-d).
Tensor strided(const Shape& s, uint64_t seed, DType t, double lo = -2, double hi = 2) {
  if (s.size() >= 2) {
    Shape sw = s;
    std::swap(sw.front(), sw.back());
    Tensor x = rand(sw, seed, 0, lo, hi, t).transpose(0, static_cast<int>(s.size()) - 1);
    return x;
  }
  Shape wide = s;
  wide.push_back(2);
  return rand(wide, seed, 0, lo, hi, t).select(-1, 0);
}

Tensor input(const Shape& s, uint64_t seed, DType t, bool noncontig, double lo = -2, double hi = 2) {
  return noncontig ? strided(s, seed, t, lo, hi) : rand(s, seed, 0, lo, hi, t);
}

// Row-major flat index into `in` (broadcast to `out`) of the out element with flat index i.
int64_t bcast_index(int64_t i, const Shape& out, const Shape& in) {
  int64_t idx = 0, mul = 1;
  const size_t lead = out.size() - in.size();
  for (int d = static_cast<int>(out.size()) - 1; d >= 0; --d) {
    const int64_t c = i % out[d];
    i /= out[d];
    if (d >= static_cast<int>(lead)) {
      const int64_t n = in[d - lead];
      idx += (n == 1 ? 0 : c) * mul;
      mul *= n;
    }
  }
  return idx;
}

// Op outputs are fresh contiguous tensors, with every value within test::check_close's tolerance.
void check_contiguous_close(const Tensor& got, const std::vector<double>& want, double rtol, double atol = 0) {
  REQUIRE(got.is_contiguous());
  test::check_close(got, want, rtol, atol);
}

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;
using Ref2 = std::function<double(double, double)>;

void check_binary(const Binary& op, const Ref2& ref, bool positive_b = false) {
  struct Layout {
    Shape a, b;
    bool noncontig;
  };
  const Layout layouts[] = {
      {{3, 5}, {3, 5}, false},         // contiguous, same shape
      {{4, 7}, {4, 7}, true},          // both transposed
      {{2, 3, 5}, {3, 1}, false},      // broadcast row/col
      {{3, 1, 5}, {4, 1}, true},       // both sides broadcast, non-contiguous
      {{6}, {}, false},                // scalar 0-d operand
      {{200, 400}, {400}, false},      // large enough for the OpenMP path, row broadcast
      {{300, 300}, {300, 300}, true},  // large, transposed
  };
  for (DType t : kFloatTypes) {
    for (const auto& l : layouts) {
      const Tensor a = input(l.a, 11, t, l.noncontig);
      const Tensor b = positive_b ? input(l.b, 12, t, l.noncontig, 0.5, 2) : input(l.b, 12, t, l.noncontig);
      const Tensor out = op(a, b);
      const Shape os = broadcast_shapes(l.a, l.b, "test");
      REQUIRE(out.shape() == os);
      REQUIRE(out.dtype() == t);
      const auto av = a.to_vector(), bv = b.to_vector();
      std::vector<double> want(static_cast<size_t>(checked_numel(os)));
      for (size_t i = 0; i < want.size(); ++i) want[i] = ref(av[bcast_index(i, os, l.a)], bv[bcast_index(i, os, l.b)]);
      INFO(dtype_name(t) << " " << shape_str(l.a) << " op " << shape_str(l.b) << (l.noncontig ? " strided" : ""));
      check_contiguous_close(out, want, rtol_for(t));
    }
  }
}

using Unary = std::function<Tensor(const Tensor&)>;
using Ref1 = std::function<double(double)>;

void check_unary(const Unary& op, const Ref1& ref, double lo = -3, double hi = 3, double rtol32 = 2e-6) {
  const Shape shapes[] = {{7}, {3, 5}, {2, 1, 4}, {130, 513}};
  for (DType t : kFloatTypes) {
    for (const Shape& s : shapes) {
      for (bool nc : {false, true}) {
        // The large (OpenMP) shape runs once per dtype: contiguous in float32, strided in float64.
        if (s[0] == 130 && nc != (t == DType::f64)) continue;
        const Tensor a = input(s, 21, t, nc, lo, hi);
        const Tensor out = op(a);
        REQUIRE(out.shape() == s);
        std::vector<double> want = a.to_vector();
        for (double& v : want) v = ref(v);
        INFO(dtype_name(t) << " " << shape_str(s) << (nc ? " strided" : ""));
        check_contiguous_close(out, want, t == DType::f32 ? rtol32 : 1e-13, t == DType::f32 ? 1e-7 : 1e-15);
      }
    }
  }
}

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST_CASE("binary arithmetic matches a float64 loop on every layout", "[ops][elementwise]") {
  check_binary([](auto& a, auto& b) { return add(a, b); }, [](double x, double y) { return x + y; });
  check_binary([](auto& a, auto& b) { return sub(a, b); }, [](double x, double y) { return x - y; });
  check_binary([](auto& a, auto& b) { return mul(a, b); }, [](double x, double y) { return x * y; });
  check_binary([](auto& a, auto& b) { return div(a, b); }, [](double x, double y) { return x / y; }, true);
  check_binary([](auto& a, auto& b) { return maximum(a, b); }, [](double x, double y) { return std::max(x, y); });
}

TEST_CASE("unary math matches a float64 loop", "[ops][elementwise]") {
  check_unary([](auto& a) { return neg(a); }, [](double x) { return -x; });
  check_unary([](auto& a) { return exp(a); }, [](double x) { return std::exp(x); });
  check_unary([](auto& a) { return log(a); }, [](double x) { return std::log(x); }, 0.1, 5);
  check_unary([](auto& a) { return sqrt(a); }, [](double x) { return std::sqrt(x); }, 0.1, 5);
  check_unary([](auto& a) { return rsqrt(a); }, [](double x) { return 1 / std::sqrt(x); }, 0.1, 5);
  check_unary([](auto& a) { return tanh(a); }, [](double x) { return std::tanh(x); });
  check_unary([](auto& a) { return sigmoid(a); }, sigmoid_ref, -30, 30);
  check_unary([](auto& a) { return relu(a); }, [](double x) { return x > 0 ? x : 0; });
  check_unary([](auto& a) { return abs(a); }, [](double x) { return std::fabs(x); });
  check_unary([](auto& a) { return gelu(a, GeluApprox::tanh); }, gelu_tanh_ref, -6, 6, 1e-5);
  check_unary([](auto& a) { return gelu(a, GeluApprox::none); }, gelu_erf_ref, -6, 6, 1e-5);
  check_unary([](auto& a) { return silu(a); }, [](double x) { return x * sigmoid_ref(x); }, -20, 20, 1e-5);
}

TEST_CASE("scalar variants and pow match a float64 loop", "[ops][elementwise]") {
  check_unary([](auto& a) { return add(a, 1.25); }, [](double x) { return x + 1.25; });
  check_unary([](auto& a) { return mul(a, -3.0); }, [](double x) { return x * -3.0; });
  check_unary([](auto& a) { return rsub(a, 2.0); }, [](double x) { return 2.0 - x; });
  check_unary([](auto& a) { return rdiv(a, 2.0); }, [](double x) { return 2.0 / x; }, 0.5, 3);
  for (double p : {2.0, 3.0, 1.0, 0.5, -1.0, -0.5, 1.7, -2.3})
    check_unary([p](auto& a) { return pow(a, p); }, [p](double x) { return std::pow(x, p); }, 0.5, 3, 4e-6);
}

TEST_CASE("fused activation derivatives match finite differences of the activation", "[ops][elementwise]") {
  // Reference derivative: central difference of the float64 formula (error ~1e-10).
  auto numeric = [](double (*f)(double), double x) {
    const double h = 1e-5;
    return (f(x + h) - f(x - h)) / (2 * h);
  };
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> op;
    double (*f)(double);
  };
  static double (*silu_ref)(double) = [](double x) { return x * sigmoid_ref(x); };
  static double (*relu_ref)(double) = [](double x) { return x > 0 ? x : 0.0; };
  const Case cases[] = {
      {"gelu tanh", [](auto& x, auto& g) { return gelu_backward(x, g, GeluApprox::tanh); }, gelu_tanh_ref},
      {"gelu erf", [](auto& x, auto& g) { return gelu_backward(x, g, GeluApprox::none); }, gelu_erf_ref},
      {"silu", [](auto& x, auto& g) { return silu_backward(x, g); }, silu_ref},
      {"relu", [](auto& x, auto& g) { return relu_backward(x, g); }, relu_ref},
  };
  for (const auto& c : cases) {
    for (DType t : kFloatTypes) {
      const Tensor x = strided({9, 13}, 31, t, -5, 5);
      const Tensor g = rand({9, 13}, 32, 0, -1, 1, t);
      const Tensor dx = c.op(x, g);
      const auto xv = x.to_vector(), gv = g.to_vector();
      std::vector<double> want(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) want[i] = gv[i] * numeric(c.f, xv[i]);
      INFO(c.name << " " << dtype_name(t));
      check_contiguous_close(dx, want, t == DType::f32 ? 1e-5 : 1e-8, t == DType::f32 ? 1e-6 : 1e-9);
    }
  }
}

TEST_CASE("bias_gelu and its backward match gelu of the float64 sum, on strided inputs", "[ops][elementwise]") {
  const auto numeric = [](double (*f)(double), double x) {
    const double h = 1e-5;
    return (f(x + h) - f(x - h)) / (2 * h);
  };
  for (DType t : kFloatTypes) {
    for (GeluApprox approx : {GeluApprox::tanh, GeluApprox::none}) {
      double (*f)(double) = approx == GeluApprox::tanh ? gelu_tanh_ref : gelu_erf_ref;
      const Tensor a = strided({9, 13}, 33, t, -5, 5);  // a transposed view: rows are strided
      const Tensor bias = rand({13}, 34, 0, -2, 2, t), dy = rand({9, 13}, 35, 0, -1, 1, t);
      const Tensor y = bias_gelu(a, bias, approx), da = bias_gelu_backward(a, bias, dy, approx);
      const auto av = a.to_vector(), bv = bias.to_vector(), gv = dy.to_vector();
      std::vector<double> want_y(av.size()), want_da(av.size());
      for (size_t i = 0; i < av.size(); ++i) {
        // The sum rounded to the dtype first, as the separate add it replaces would round it.
        const double z = t == DType::f32 ? static_cast<float>(av[i] + bv[i % 13]) : av[i] + bv[i % 13];
        want_y[i] = f(z);
        want_da[i] = gv[i] * numeric(f, z);
      }
      INFO(dtype_name(t) << (approx == GeluApprox::tanh ? " tanh" : " erf"));
      check_contiguous_close(y, want_y, t == DType::f32 ? 1e-5 : 1e-12, t == DType::f32 ? 1e-6 : 1e-13);
      check_contiguous_close(da, want_da, t == DType::f32 ? 1e-5 : 1e-8, t == DType::f32 ? 1e-6 : 1e-9);
      // The fused op is the composition it replaces, to the last bit.
      CHECK(max_abs_diff(y, gelu(add(a, bias), approx)) == 0.0);
      CHECK(max_abs_diff(da, gelu_backward(add(a, bias), dy, approx)) == 0.0);
    }
  }
  CHECK_THROWS_WITH(bias_gelu(ones({2, 3}), ones({2})),
                    Catch::Contains("[bias_gelu] bias [2]") && Catch::Contains("[2,3]"));
  CHECK_THROWS_WITH(bias_gelu(ones({2, 3}), ones({3}, DType::f64)), Catch::Contains("[bias_gelu]"));
  CHECK_THROWS_WITH(bias_gelu_backward(ones({2, 3}), ones({3}), ones({3, 2}), GeluApprox::tanh),
                    Catch::Contains("[bias_gelu_backward] a is [2,3] but dy is [3,2]"));
}

TEST_CASE("integer arithmetic, comparisons and logic follow their definitions", "[ops][elementwise]") {
  const Tensor a = from_vector_i64({1, -2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector_i64({10, 20, 30}, {3});
  CHECK(add(a, b).to_vector() == std::vector<double>{11, 18, 33, 14, 25, 36});
  CHECK(add(a, b).dtype() == DType::i64);
  CHECK(mul(a.to(DType::i32), b.to(DType::i32)).to_vector() == std::vector<double>{10, -40, 90, 40, 100, 180});
  CHECK_THROWS_WITH(div(a, b), Catch::Contains("[div]") && Catch::Contains("int64"));

  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, t).transpose(0, 1);  // [3,2]: 1 4 / 2 5 / 3 6
    const Tensor y = from_vector({2, 5}, {2}, t);
    INFO(dtype_name(t));
    CHECK(eq(x, y).dtype() == DType::boolean);
    CHECK(eq(x, y).to_vector() == std::vector<double>{0, 0, 1, 1, 0, 0});
    CHECK(gt(x, y).to_vector() == std::vector<double>{0, 0, 0, 0, 1, 1});
    CHECK(lt(x, y).to_vector() == std::vector<double>{1, 1, 0, 0, 0, 0});
  }
  const Tensor p = gt(from_vector({1, 0, 1, 0}, {4}), zeros({}));
  const Tensor q = gt(from_vector({1, 1, 0, 0}, {4}), zeros({}));
  CHECK(logical_and(p, q).to_vector() == std::vector<double>{1, 0, 0, 0});
  CHECK(logical_not(p).to_vector() == std::vector<double>{0, 1, 0, 1});
  CHECK_THROWS_WITH(logical_not(from_vector({1}, {1})), Catch::Contains("[logical_not]"));
}

TEST_CASE("where and masked_fill select elementwise with broadcasting", "[ops][elementwise]") {
  for (DType t : kFloatTypes) {
    const Tensor cond = gt(rand({4, 1, 6}, 41), full({}, 0.5));  // [4,1,6]
    const Tensor a = input({3, 6}, 42, t, true);                 // [3,6] strided
    const Tensor b = input({4, 1, 1}, 43, t, false);             // [4,1,1]
    const Tensor out = where(cond, a, b);
    const Shape os{4, 3, 6};
    REQUIRE(out.shape() == os);
    const auto cv = cond.to_vector(), av = a.to_vector(), bv = b.to_vector();
    std::vector<double> want(72);
    for (size_t i = 0; i < want.size(); ++i)
      want[i] = cv[bcast_index(i, os, {4, 1, 6})] ? av[bcast_index(i, os, {3, 6})] : bv[bcast_index(i, os, {4, 1, 1})];
    check_contiguous_close(out, want, 0);

    const Tensor mask = gt(rand({6}, 44), full({}, 0.3));
    const Tensor m = masked_fill(a, mask, -1e9);
    const auto mv = mask.to_vector();
    std::vector<double> want2(18);
    for (size_t i = 0; i < 18; ++i) want2[i] = mv[i % 6] ? -1e9 : av[i];
    check_contiguous_close(m, want2, t == DType::f32 ? 1e-7 : 0);
  }
  const Tensor ids = from_vector_i64({1, 2, 3}, {3});
  CHECK(where(gt(ids, full({}, 1, DType::i64)), ids, zeros({}, DType::i64)).to_vector() ==
        std::vector<double>{0, 2, 3});
  CHECK_THROWS_WITH(where(ones({3}), ones({3}), ones({3})), Catch::Contains("[where] cond must be bool"));
  CHECK_THROWS_WITH(masked_fill(ones({3}), gt(ones({4}), zeros({})), 0.0), Catch::Contains("[masked_fill]"));
}

TEST_CASE("in-place add_ and mul_ accumulate into the destination", "[ops][elementwise]") {
  for (DType t : kFloatTypes) {
    Tensor a = rand({5, 4}, 51, 0, -1, 1, t);
    const auto a0 = a.to_vector();
    const Tensor b = rand({4}, 52, 0, -1, 1, t);
    const auto bv = b.to_vector();
    add_(a, b, -0.5);
    std::vector<double> want(20);
    for (size_t i = 0; i < 20; ++i) want[i] = a0[i] + -0.5 * bv[i % 4];
    check_contiguous_close(a, want, rtol_for(t), 1e-7);
    mul_(a, 3.0);
    for (double& w : want) w *= 3;
    check_contiguous_close(a, want, rtol_for(t), 1e-6);
    // A strided destination: only the viewed elements change.
    Tensor base = zeros({4, 5}, t);
    add_(base.transpose(0, 1), ones({5, 4}, t));
    CHECK(sum(base).item() == 20);
  }
  Tensor wide = zeros({1, 3}).expand({4, 3});
  CHECK_THROWS_WITH(add_(wide, ones({4, 3})), Catch::Contains("broadcast view"));
  CHECK_THROWS_WITH(add_(zeros({3}), ones({4, 3})), Catch::Contains("[add_]"));
}

TEST_CASE("elementwise ops refuse mismatched dtypes and shapes with a clear message", "[ops][elementwise][errors]") {
  CHECK_THROWS_WITH(add(ones({2, 3}), ones({2, 3}, DType::f64)),
                    Catch::Contains("[add] a is float32 [2,3] but b is float64 [2,3]"));
  CHECK_THROWS_WITH(mul(ones({2, 3}), ones({4})), Catch::Contains("[mul] shapes [2,3] and [4] do not broadcast"));
  CHECK_THROWS_WITH(exp(ones({2}, DType::i64)), Catch::Contains("[exp] input must be float32 or float64, not int64"));
  CHECK_THROWS_WITH(gelu_backward(ones({2}), ones({3}), GeluApprox::tanh), Catch::Contains("[gelu_backward]"));
  CHECK_THROWS_WITH(add(Tensor(), ones({1})), Catch::Contains("[add] a is an undefined tensor"));
}

TEST_CASE("all_finite spots NaN and infinities anywhere", "[ops][elementwise]") {
  for (DType t : kFloatTypes) {
    Tensor a = rand({300, 301}, 61, 0, -1, 1, t);
    CHECK(all_finite(a));
    CHECK(all_finite(a.transpose(0, 1)));
    fill_(a.narrow(0, 299, 1).narrow(1, 300, 1), NAN);
    CHECK_FALSE(all_finite(a));
    fill_(a.narrow(0, 299, 1).narrow(1, 300, 1), -INFINITY);
    CHECK_FALSE(all_finite(a));
  }
  CHECK(all_finite(ones({3}, DType::i64)));
}

TEST_CASE("factories fill the values they promise", "[ops][factory]") {
  CHECK(zeros({2, 3}).to_vector() == std::vector<double>(6, 0.0));
  CHECK(ones({2}, DType::i32).to_vector() == std::vector<double>{1, 1});
  CHECK(full({3}, 2.5, DType::f64).to_vector() == std::vector<double>{2.5, 2.5, 2.5});
  CHECK(full({2}, 1.0, DType::boolean).to_vector() == std::vector<double>{1, 1});
  CHECK(arange(-2, 3).to_vector() == std::vector<double>{-2, -1, 0, 1, 2});
  CHECK(arange(0, 4, DType::f32).dtype() == DType::f32);
  CHECK(arange(3, 3).numel() == 0);
  CHECK(from_vector({1, 2, 3, 4}, {2, 2}, DType::f64).at({1, 0}) == 3);
  CHECK(from_vector_i64({7, 8}, {2}, DType::i32).dtype() == DType::i32);
  CHECK_THROWS_WITH(from_vector({1, 2, 3}, {2, 2}), Catch::Contains("[from_vector] 3 values for shape [2,2]"));
  const Tensor t = rand({2, 3}, 1, 0, 0, 1, DType::f64);
  CHECK(zeros_like(t).dtype() == DType::f64);
  CHECK(zeros_like(t).to_vector() == std::vector<double>(6, 0.0));
  CHECK(empty_like(t).shape() == Shape{2, 3});

  // fill_ and copy_ act through views; copy_ broadcasts and converts.
  Tensor m = zeros({3, 4}, DType::f64);
  fill_(m.narrow(1, 1, 2), 5);
  CHECK(sum(m).item() == 30);
  copy_(m.transpose(0, 1), from_vector({1, 2, 3}, {3}, DType::f32));  // every row of m^T gets 1,2,3
  CHECK(m.to_vector() == std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK_THROWS_WITH(copy_(m, ones({5})), Catch::Contains("[copy_]"));
}

TEST_CASE("rand and randn are Philox draws keyed by seed and element counter", "[ops][factory][random]") {
  for (DType t : kFloatTypes) {
    const Tensor u = rand({100000}, 7, 0, -1, 3, t);
    const auto v = u.to_vector();
    double mean = 0, lo = 1e9, hi = -1e9;
    for (double x : v) {
      mean += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    mean /= static_cast<double>(v.size());
    CHECK(lo >= -1);
    CHECK(hi < 3);
    CHECK(mean == Approx(1.0).margin(0.02));

    const Tensor z = randn({200000}, 8, 0, 0.5, 2.0, t);
    const auto zv = z.to_vector();
    double m1 = 0, m2 = 0;
    for (double x : zv) m1 += x;
    m1 /= static_cast<double>(zv.size());
    for (double x : zv) m2 += (x - m1) * (x - m1);
    m2 /= static_cast<double>(zv.size());
    CHECK(m1 == Approx(0.5).margin(0.02));
    CHECK(std::sqrt(m2) == Approx(2.0).margin(0.02));
    CHECK(all_finite(z));

    // Element i depends on (seed, offset + i) only: a later window equals the tail of a longer draw,
    // another seed differs, the same call repeats.
    const auto whole = randn({50}, 9, 0, 0, 1, t).to_vector();
    const auto tail = randn({30}, 9, 20, 0, 1, t).to_vector();
    CHECK(std::vector<double>(whole.begin() + 20, whole.end()) == tail);
    CHECK(randn({50}, 9, 0, 0, 1, t).to_vector() == whole);
    CHECK(randn({50}, 10, 0, 0, 1, t).to_vector() != whole);
  }
  // Independent of the thread count (large enough for the parallel path).
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = randn({100000}, 11).to_vector();
  omp_set_num_threads(std::max(2, threads));
  const auto many = randn({100000}, 11).to_vector();
  omp_set_num_threads(threads);
  CHECK(one == many);
  // float64 draws carry more than float32's 24 bits.
  const auto d = rand({64}, 12, 0, 0, 1, DType::f64).to_vector();
  int beyond_float = 0;
  for (double x : d) beyond_float += static_cast<double>(static_cast<float>(x)) != x;
  CHECK(beyond_float > 50);
  CHECK_THROWS_WITH(rand({2}, 1, 0, 0, 1, DType::i64), Catch::Contains("[rand] dtype"));
}

TEST_CASE("max_abs_diff and allclose compare values elementwise", "[ops][compare]") {
  const Tensor a = from_vector({1, 2, 3}, {3});
  const Tensor b = from_vector({1, 2.5, 2}, {3}, DType::f64);
  CHECK(max_abs_diff(a, b) == 1.0);
  CHECK(max_abs_diff(a, a) == 0.0);
  CHECK(std::isnan(max_abs_diff(a, from_vector({1, NAN, 3}, {3}))));
  CHECK(allclose(a, add(a, 1e-9)));
  CHECK_FALSE(allclose(a, b));
  CHECK(allclose(a, b, 0.0, 1.0));
  CHECK_THROWS_WITH(max_abs_diff(a, ones({4})), Catch::Contains("[max_abs_diff] a is [3] but b is [4]"));
}
