// embedding, layer/RMS norm, cross-entropy and dropout against naive float64 loops; errors;
// thread-count independence; gradchecks of every registered nn case.
#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "compare_util.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

Tensor rnd(const Shape& s, uint64_t seed, DType t, double std = 1.0) { return randn(s, seed, 0, 0.0, std, t); }
double tol_of(DType t) { return t == DType::f32 ? 2e-5 : 1e-12; }

using test::check_mixed_close;
using test::with_threads;

// Naive layer norm / rms norm rows in float64: returns y.
std::vector<double> naive_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms) {
  const int64_t c = x.size(-1), r = x.numel() / c;
  const std::vector<double> xv = x.to_vector();
  const std::vector<double> wv = w.defined() ? w.to_vector() : std::vector<double>(c, 1.0);
  const std::vector<double> bv = b.defined() ? b.to_vector() : std::vector<double>(c, 0.0);
  std::vector<double> y(xv.size());
  for (int64_t i = 0; i < r; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) mean += xv[i * c + j] / c;
    if (rms) mean = 0;
    for (int64_t j = 0; j < c; ++j) var += (xv[i * c + j] - mean) * (xv[i * c + j] - mean) / c;
    const double rstd = 1 / std::sqrt(var + eps);
    for (int64_t j = 0; j < c; ++j) y[i * c + j] = (xv[i * c + j] - mean) * rstd * wv[j] + (rms ? 0 : bv[j]);
  }
  return y;
}

}  // namespace

TEST_CASE("embedding gathers weight rows for ids of any shape", "[ops][nn][embedding]") {
  for (DType t : {DType::f32, DType::f64}) {
    for (DType it : {DType::i32, DType::i64}) {
      INFO(dtype_name(t) << " ids " << dtype_name(it));
      const Tensor w = rnd({6, 5}, 1, t);
      const Tensor ids = from_vector_i64({5, 0, 3, 3, 1, 5}, {2, 3}, it);
      const Tensor out = embedding(w, ids);
      REQUIRE(out.shape() == Shape{2, 3, 5});
      const std::vector<int64_t> idv = {5, 0, 3, 3, 1, 5};
      for (int i = 0; i < 6; ++i)
        for (int c = 0; c < 5; ++c) CHECK(out.at({i / 3, i % 3, c}) == w.at({idv[i], c}));
      // A transposed weight (unit stride along rows, not columns) gathers the same values.
      const Tensor wt = w.transpose(0, 1).contiguous().transpose(0, 1);
      CHECK(max_abs_diff(embedding(wt, ids), out) == 0.0);
      // Row-strided weight (a narrow of a wider table) needs no copy and gives the same rows.
      const Tensor wide = rnd({6, 9}, 2, t), wn = wide.narrow(1, 2, 5);
      const Tensor on = embedding(wn, ids);
      for (int i = 0; i < 6; ++i)
        for (int c = 0; c < 5; ++c) CHECK(on.at({i / 3, i % 3, c}) == wide.at({idv[i], c + 2}));
    }
  }
}

TEST_CASE("embedding refuses ids out of range, naming the id and the table size", "[ops][nn][embedding][errors]") {
  const Tensor w = Tensor::empty({5, 3});
  CHECK_THROWS_WITH(embedding(w, from_vector_i64({1, 9, 2}, {3})),
                    Catch::Contains("[embedding] id 9") && Catch::Contains("out of range for 5 embeddings"));
  CHECK_THROWS_WITH(embedding(w, from_vector_i64({-1}, {1}, DType::i32)), Catch::Contains("id -1"));
  CHECK_THROWS_WITH(embedding(w, from_vector({1.0}, {1})), Catch::Contains("ids must be int32 or int64"));
  CHECK_THROWS_WITH(embedding_backward(from_vector_i64({7}, {1}), Tensor::empty({1, 3}), 5),
                    Catch::Contains("[embedding_backward] id 7"));
}

TEST_CASE("embedding backward scatter-adds repeated ids, the same on any thread count", "[ops][nn][embedding]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const int64_t n = 600, c = 230, v = 37;  // n * c large enough to run threaded (nn_kernels.cpp kGrain)
    std::vector<int64_t> idv(n);
    for (int64_t i = 0; i < n; ++i) idv[i] = (i * 7 + i / 5) % v;
    const Tensor ids = from_vector_i64(idv, {20, 30});
    const Tensor dy = rnd({20, 30, c}, 3, t);
    const Tensor many = embedding_backward(ids, dy, v);
    const Tensor one = with_threads(1, [&] { return embedding_backward(ids, dy, v); });
    CHECK(max_abs_diff(many, one) == 0.0);
    std::vector<double> want(v * c, 0.0);
    const std::vector<double> dyv = dy.to_vector();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) want[idv[i] * c + j] += dyv[i * c + j];
    check_mixed_close(many.to_vector(), want, tol_of(t) * 10);
  }
}

TEST_CASE("layer_norm and rms_norm match naive float64 rows", "[ops][nn][norm]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor x = rnd({3, 4, 33}, 4, t, 3.0), w = rnd({33}, 5, t), b = rnd({33}, 6, t);
    const Tensor shifted = add(x, 100.0);  // a large mean: the variance must not cancel catastrophically
    for (const Tensor& in : {x, shifted}) {
      const NormResult ln = layer_norm(in, w, b, 1e-5);
      check_mixed_close(ln.y.to_vector(), naive_norm(in, w, b, 1e-5, false), tol_of(t) * 5);
      CHECK(ln.mean.shape() == Shape{3, 4});
      CHECK(ln.rstd.shape() == Shape{3, 4});
      const NormResult rn = rms_norm(in, w, 1e-6);
      check_mixed_close(rn.y.to_vector(), naive_norm(in, w, Tensor(), 1e-6, true), tol_of(t) * 5);
    }
    CHECK(std::fabs(layer_norm(x, w, b, 1e-5).mean.at({1, 2}) - mean(x.select(0, 1).select(0, 2)).item()) < 1e-5);
    // Strided input (a transposed view) and no affine parameters.
    const Tensor xt = rnd({17, 6}, 7, t).transpose(0, 1);
    check_mixed_close(layer_norm(xt, Tensor(), Tensor(), 1e-5).y.to_vector(),
                      naive_norm(xt, Tensor(), Tensor(), 1e-5, false), tol_of(t) * 5);
    check_mixed_close(rms_norm(xt, Tensor(), 1e-6).y.to_vector(), naive_norm(xt, Tensor(), Tensor(), 1e-6, true),
                      tol_of(t) * 5);
  }
}

TEST_CASE("norm backward in float32 agrees with float64 and is thread-count independent", "[ops][nn][norm]") {
  // 64·24·96 elements: above norm.cpp's threading grain, so the threaded path is compared with one thread.
  const Tensor x = rnd({64, 24, 96}, 8, DType::f64, 2.0), w = rnd({96}, 9, DType::f64), b = rnd({96}, 10, DType::f64);
  const Tensor dy = rnd({64, 24, 96}, 11, DType::f64);
  const NormResult ln64 = layer_norm(x, w, b, 1e-5);
  const NormGrads g64 = layer_norm_backward(dy, x, w, ln64.mean, ln64.rstd);
  const Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32), dy32 = dy.to(DType::f32);
  const NormResult ln32 = layer_norm(x32, w32, b.to(DType::f32), 1e-5);
  const NormGrads g32 = layer_norm_backward(dy32, x32, w32, ln32.mean, ln32.rstd);
  check_mixed_close(g32.dx.to_vector(), g64.dx.to_vector(), 1e-4);
  check_mixed_close(g32.dweight.to_vector(), g64.dweight.to_vector(), 1e-4);
  check_mixed_close(g32.dbias.to_vector(), g64.dbias.to_vector(), 1e-4);
  const NormGrads g1 = with_threads(1, [&] { return layer_norm_backward(dy32, x32, w32, ln32.mean, ln32.rstd); });
  CHECK(max_abs_diff(g1.dweight, g32.dweight) == 0.0);
  CHECK(max_abs_diff(g1.dbias, g32.dbias) == 0.0);
  CHECK(max_abs_diff(g1.dx, g32.dx) == 0.0);

  const NormResult rn64 = rms_norm(x, w, 1e-6);
  const NormGrads r64 = rms_norm_backward(dy, x, w, rn64.rstd);
  const NormResult rn32 = rms_norm(x32, w32, 1e-6);
  const NormGrads r32 = rms_norm_backward(dy32, x32, w32, rn32.rstd);
  check_mixed_close(r32.dx.to_vector(), r64.dx.to_vector(), 1e-4);
  check_mixed_close(r32.dweight.to_vector(), r64.dweight.to_vector(), 1e-4);
  const NormGrads r1 = with_threads(1, [&] { return rms_norm_backward(dy32, x32, w32, rn32.rstd); });
  CHECK(max_abs_diff(r1.dweight, r32.dweight) == 0.0);
}

TEST_CASE("cross_entropy with ignore_index matches a naive log-softmax loss and its gradient",
          "[ops][nn][cross_entropy]") {
  for (DType t : {DType::f32, DType::f64}) {
    for (bool transposed : {false, true}) {
      INFO(dtype_name(t) << (transposed ? " transposed logits" : ""));
      const int64_t n = 9, v = 1001;
      const Tensor logits = transposed ? rnd({v, n}, 12, t, 4.0).transpose(0, 1) : rnd({n, v}, 12, t, 4.0);
      const std::vector<int64_t> tv = {3, -100, 1000, 0, 7, -100, 500, 999, 1};
      const Tensor targets = from_vector_i64(tv, {n}, DType::i32);
      const CrossEntropyResult r = cross_entropy(logits, targets, -100);
      CHECK(r.count == 7);
      CHECK(r.loss.shape() == Shape{});
      // Naive: lse per row in float64, mean of lse - z[target] over counted rows.
      const Tensor z = logits.to(DType::f64).contiguous();
      const std::vector<double> zv = z.to_vector();
      double loss = 0;
      std::vector<double> lse(n), grad(n * v, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, zv[i * v + j]);
        for (int64_t j = 0; j < v; ++j) s += std::exp(zv[i * v + j] - m);
        lse[i] = m + std::log(s);
        if (tv[i] == -100) continue;
        loss += lse[i] - zv[i * v + tv[i]];
        for (int64_t j = 0; j < v; ++j) grad[i * v + j] = (std::exp(zv[i * v + j] - lse[i]) - (j == tv[i])) * 0.5 / 7;
      }
      loss /= 7;
      check_mixed_close({r.loss.item()}, {loss}, tol_of(t));
      check_mixed_close(r.lse.to_vector(), lse, tol_of(t));
      const Tensor d = cross_entropy_backward(logits, targets, r.lse, 0.5, r.count, -100);
      check_mixed_close(d.to_vector(), grad, tol_of(t));
    }
  }
}

TEST_CASE("cross_entropy with every target ignored is 0 with zero gradients", "[ops][nn][cross_entropy]") {
  Tensor logits = rnd({3, 5}, 13, DType::f64);
  logits.set_requires_grad(true);
  const Tensor targets = from_vector_i64({-1, -1, -1}, {3});
  const Tensor loss = ag::cross_entropy(logits, targets, -1);
  CHECK(loss.item() == 0.0);
  autograd::backward(loss);
  for (double g : logits.grad().to_vector()) CHECK(g == 0.0);
}

TEST_CASE("cross_entropy refuses targets out of range, naming the target and V", "[ops][nn][cross_entropy][errors]") {
  const Tensor logits = Tensor::empty({2, 4});
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector_i64({1, 4}, {2})),
                    Catch::Contains("[cross_entropy] target 4 at row 1 is out of range for 4 classes"));
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector_i64({-3, 0}, {2})), Catch::Contains("target -3"));
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector_i64({1, 2, 3}, {3})),
                    Catch::Contains("[cross_entropy] logits are [2,4] but targets are [3]"));
}

TEST_CASE("dropout keeps a 1-p fraction, scales by 1/(1-p) and repeats for the same seed", "[ops][nn][dropout]") {
  const int64_t n = 1 << 20;
  const Tensor ones_ = ones({n});
  for (double p : {0.1, 0.5}) {
    INFO("p = " << p);
    const Tensor d = dropout(ones_, p, 1234, 0);
    const std::vector<double> dv = d.to_vector();
    int64_t kept = 0;
    bool values_ok = true;
    for (double x : dv) {
      if (x != 0) ++kept;
      if (x != 0 && std::fabs(x - 1 / (1 - p)) > 1e-6) values_ok = false;
    }
    const double frac = static_cast<double>(kept) / n;
    CHECK(std::fabs(frac - (1 - p)) <= 0.02 * (1 - p));
    CHECK(values_ok);
    CHECK(max_abs_diff(dropout(ones_, p, 1234, 0), d) == 0.0);  // same seed, same mask
    CHECK(max_abs_diff(dropout(ones_, p, 1235, 0), d) > 0.0);   // another seed, another mask
    CHECK(with_threads(1, [&] { return max_abs_diff(dropout(ones_, p, 1234, 0), d); }) == 0.0);
  }
  // Element i uses counter offset + i: the second half of a draw equals a draw at offset n/2.
  const Tensor a = rnd({1000}, 14, DType::f32);
  const Tensor whole = dropout(a, 0.3, 9, 0);
  const Tensor tail = dropout(a.narrow(0, 500, 500), 0.3, 9, 500);
  CHECK(max_abs_diff(whole.narrow(0, 500, 500), tail) == 0.0);
  // A transposed input is masked by its logical row-major index.
  const Tensor m = rnd({8, 6}, 15, DType::f64).transpose(0, 1);
  CHECK(max_abs_diff(dropout(m, 0.4, 3, 0), dropout(m.contiguous(), 0.4, 3, 0)) == 0.0);
  CHECK(dropout(a, 0.0, 1, 0).same(a));
  CHECK_THROWS_WITH(dropout(a, 1.0, 1, 0), Catch::Contains("[dropout] p must be in [0, 1)"));
  CHECK_THROWS_WITH(dropout(a, -0.1, 1, 0), Catch::Contains("[dropout] p must be in [0, 1)"));
}

TEST_CASE("dropout backward regenerates the forward mask", "[autograd][nn][dropout]") {
  Tensor x = rnd({300}, 16, DType::f64);
  x.set_requires_grad(true);
  const Tensor y = ag::dropout(x, 0.25, 77, 5);
  autograd::backward(ag::sum(y));
  const std::vector<double> g = x.grad().to_vector(), yv = y.to_vector(), xv = x.to_vector();
  for (size_t i = 0; i < g.size(); ++i) {
    const bool kept = yv[i] != 0 || xv[i] == 0;
    CHECK(g[i] == (kept ? 1 / 0.75 : 0.0));
  }
}

// ---- the in-place / preallocated forms the autograd rules call (one dispatch point per kernel) ----

TEST_CASE("sum_rows gives the column sums of [R, C]; sum_rows_into writes a preallocated [C]", "[ops][nn][sum_rows]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor x = rnd({300, 70}, 21, t);
    const Tensor s = sum_rows(x);
    REQUIRE(s.shape() == Shape{70});
    const std::vector<double> xv = x.to_vector();
    std::vector<double> want(70, 0.0);
    for (int64_t i = 0; i < 300; ++i)
      for (int64_t j = 0; j < 70; ++j) want[j] += xv[i * 70 + j];
    check_mixed_close(s.to_vector(), want, tol_of(t) * 10);
    const Tensor out = full({70}, 7.0, t);
    sum_rows_into(x, out);
    CHECK(max_abs_diff(out, s) == 0.0);
    // A transposed view is summed as its values, not its storage.
    const Tensor xt = rnd({70, 300}, 22, t).transpose(0, 1);
    check_mixed_close(sum_rows(xt).to_vector(), sum(xt, {0}).to_vector(), tol_of(t) * 10);
  }
  CHECK_THROWS_WITH(sum_rows(zeros({2, 3, 4})), Catch::Contains("[sum_rows] x must be [R, C], got [2,3,4]"));
  CHECK_THROWS_WITH(sum_rows_into(zeros({2, 3}), zeros({4})), Catch::Contains("[sum_rows] out is [4], not [3]"));
  CHECK_THROWS_WITH(sum_rows_into(zeros({2, 3}), zeros({3}, DType::f64)), Catch::Contains("out is float64"));
  CHECK_THROWS_WITH(sum_rows(zeros({2, 3}, DType::i64)), Catch::Contains("must be float32 or float64"));
}

TEST_CASE("embedding_backward_into adds the scatter into an existing gradient", "[ops][nn][embedding]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const int64_t v = 11, c = 9;
    const Tensor ids = from_vector_i64({3, 0, 3, 10, 5, 3}, {2, 3});
    const Tensor dy = rnd({2, 3, c}, 23, t);
    const Tensor before = rnd({v, c}, 24, t);
    const Tensor g = before.clone();
    embedding_backward_into(ids, dy, g);
    check_mixed_close(g.to_vector(), add(before, embedding_backward(ids, dy, v)).to_vector(), tol_of(t) * 10);
    // Into zeros it is embedding_backward itself, bit for bit.
    const Tensor z = zeros({v, c}, t);
    embedding_backward_into(ids, dy, z);
    CHECK(max_abs_diff(z, embedding_backward(ids, dy, v)) == 0.0);
  }
  const Tensor dy = zeros({2, 4});
  CHECK_THROWS_WITH(embedding_backward_into(from_vector_i64({1, 7}, {2}), dy, zeros({5, 4})),
                    Catch::Contains("id 7 at flat position 1 is out of range for 5"));
  CHECK_THROWS_WITH(embedding_backward_into(from_vector_i64({1, 2}, {2}), dy, zeros({5, 3})),
                    Catch::Contains("[embedding_backward_into] dweight is [5,3], not [5,4]"));
  CHECK_THROWS_WITH(embedding_backward_into(from_vector_i64({1, 2}, {2}), dy, zeros({4, 5}).transpose(0, 1)),
                    Catch::Contains("must be contiguous"));
}

TEST_CASE("layer_norm_backward_into writes or adds dx and skips unwanted parameter grads", "[ops][nn][norm]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor x = rnd({5, 6, 40}, 25, t, 2.0), w = rnd({40}, 26, t), b = rnd({40}, 27, t);
    const Tensor dy = rnd({5, 6, 40}, 28, t);
    const NormResult ln = layer_norm(x, w, b, 1e-5);
    const NormGrads g = layer_norm_backward(dy, x, w, ln.mean, ln.rstd);
    const Tensor dx = Tensor::empty(x.shape(), t), dw = Tensor::empty({40}, t), db = Tensor::empty({40}, t);
    layer_norm_backward_into(dy, x, w, ln.mean, ln.rstd, dx, dw, db, false);
    CHECK(max_abs_diff(dx, g.dx) == 0.0);
    CHECK(max_abs_diff(dw, g.dweight) == 0.0);
    CHECK(max_abs_diff(db, g.dbias) == 0.0);
    // Accumulating into a pending gradient, no parameter grads wanted.
    const Tensor pending = rnd({5, 6, 40}, 29, t);
    const Tensor acc = pending.clone();
    layer_norm_backward_into(dy, x, w, ln.mean, ln.rstd, acc, Tensor(), Tensor(), true);
    check_mixed_close(acc.to_vector(), add(pending, g.dx).to_vector(), tol_of(t) * 10);
  }
  const Tensor x = zeros({3, 4}), m = zeros({3}), r = ones({3});
  CHECK_THROWS_WITH(layer_norm_backward_into(x, x, Tensor(), m, r, zeros({3, 5}), Tensor(), Tensor(), false),
                    Catch::Contains("[layer_norm_backward] dx is [3,5], not [3,4]"));
  CHECK_THROWS_WITH(layer_norm_backward_into(x, x, Tensor(), m, r, zeros({3, 4}), zeros({4}), Tensor(), false),
                    Catch::Contains("dweight is wanted but there is no weight"));
  CHECK_THROWS_WITH(
      layer_norm_backward_into(x, x, Tensor(), m, r, zeros({3, 4}), Tensor(), zeros({4}, DType::f64), false),
      Catch::Contains("dbias is float64"));
}

TEST_CASE("cross_entropy_backward_ overwrites the logits with cross_entropy_backward's gradient",
          "[ops][nn][cross_entropy]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor logits = rnd({6, 13}, 30, t, 3.0);
    const Tensor targets = from_vector_i64({2, -100, 12, 0, 7, -100}, {6});
    const CrossEntropyResult ce = cross_entropy(logits, targets);
    const Tensor want = cross_entropy_backward(logits, targets, ce.lse, 0.75, ce.count);
    const Tensor in_place = logits.clone();
    cross_entropy_backward_(in_place, targets, ce.lse, 0.75, ce.count);
    CHECK(max_abs_diff(in_place, want) == 0.0);
    CHECK(in_place.at({1, 4}) == 0.0);  // an ignored row
  }
  const Tensor lt = zeros({13, 6}).transpose(0, 1);
  CHECK_THROWS_WITH(cross_entropy_backward_(lt, from_vector_i64({1, 2, 3, 4, 5, 6}, {6}), zeros({6}), 1.0, 6),
                    Catch::Contains("[cross_entropy_backward_] logits [6,13] must be contiguous"));
  CHECK_THROWS_WITH(cross_entropy_backward_(zeros({2, 3}), from_vector_i64({1, 3}, {2}), zeros({2}), 1.0, 2),
                    Catch::Contains("target 3 at row 1 is out of range for 3"));
}
