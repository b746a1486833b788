// matmul, matmul_into and linear against naive float64 loops; no-copy claims through the
// allocator's counters; error messages; gradchecks of every registered matmul/linear case.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "compare_util.h"
#include "tensor/cpu/matmul.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

// Naive batched matmul in float64 by element access: a [..., M, K], b [..., K, N] (>= 2-d each),
// batch dims broadcast right-aligned. Returns the values of [batch..., M, N] in row-major order.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, Shape* out_shape = nullptr) {
  const int na = a.dim() - 2, nb = b.dim() - 2, nd = std::max(na, nb);
  Shape batch(nd);
  for (int i = 0; i < nd; ++i) {
    const int64_t sa = i - (nd - na) >= 0 ? a.shape()[i - (nd - na)] : 1;
    const int64_t sb = i - (nd - nb) >= 0 ? b.shape()[i - (nd - nb)] : 1;
    batch[i] = std::max(sa, sb);
  }
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  int64_t count = 1;
  for (int64_t s : batch) count *= s;
  std::vector<double> out;
  std::vector<int64_t> bi(nd);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rem = flat;
    for (int d = nd - 1; d >= 0; --d) {
      bi[d] = rem % batch[d];
      rem /= batch[d];
    }
    std::vector<int64_t> ia(a.dim()), ib(b.dim());
    for (int d = 0; d < na; ++d) ia[d] = a.shape()[d] == 1 ? 0 : bi[d + (nd - na)];
    for (int d = 0; d < nb; ++d) ib[d] = b.shape()[d] == 1 ? 0 : bi[d + (nd - nb)];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          ia[na] = i, ia[na + 1] = p, ib[nb] = p, ib[nb + 1] = j;
          s += a.at(ia) * b.at(ib);
        }
        out.push_back(s);
      }
  }
  if (out_shape) {
    *out_shape = batch;
    out_shape->push_back(m);
    out_shape->push_back(n);
  }
  return out;
}

using test::check_mixed_close;

double tol_of(DType t) { return t == DType::f32 ? 2e-5 : 1e-12; }

Tensor rnd(const Shape& s, uint64_t seed, DType t) { return randn(s, seed, 0, 0.0, 1.0, t); }

void check_matmul(const Tensor& a, const Tensor& b) {
  Shape want_shape;
  const std::vector<double> want = naive_matmul(a, b, &want_shape);
  const Tensor c = matmul(a, b);
  CHECK(c.shape() == want_shape);
  CHECK(c.is_contiguous());
  check_mixed_close(c.to_vector(), want, tol_of(a.dtype()));
}

}  // namespace

TEST_CASE("matmul matches a naive float64 loop on contiguous, transposed and strided operands", "[ops][matmul]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor a = rnd({7, 13}, 1, t), b = rnd({13, 11}, 2, t);
    check_matmul(a, b);
    check_matmul(rnd({13, 7}, 3, t).transpose(0, 1), b);                                      // a Trans
    check_matmul(a, rnd({11, 13}, 4, t).transpose(0, 1));                                     // b Trans
    check_matmul(rnd({13, 7}, 5, t).transpose(0, 1), rnd({11, 13}, 6, t).transpose(0, 1));    // both
    check_matmul(rnd({7, 20}, 7, t).narrow(1, 3, 13), rnd({15, 11}, 8, t).narrow(0, 1, 13));  // lda 20
    // Strides BLAS cannot read (neither dim has stride 1): one contiguous copy, same values.
    check_matmul(rnd({7, 13, 2}, 9, t).select(2, 1), rnd({13, 11, 3}, 10, t).select(2, 2));
  }
}

TEST_CASE("matmul broadcasts batch dims and handles degenerate sizes", "[ops][matmul]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    check_matmul(rnd({2, 3, 5, 4}, 11, t), rnd({4, 6}, 12, t));                    // folds into one GEMM
    check_matmul(rnd({2, 6, 4}, 13, t).transpose(0, 1), rnd({4, 5}, 14, t));       // batch dims that cannot fold
    check_matmul(rnd({2, 1, 5, 4}, 15, t), rnd({3, 4, 6}, 16, t));                 // both broadcast
    check_matmul(rnd({5, 4}, 17, t), rnd({3, 4, 6}, 18, t));                       // a shared
    check_matmul(rnd({1, 5, 4}, 19, t).expand({3, 5, 4}), rnd({4, 2}, 20, t));     // stride-0 batch
    check_matmul(rnd({16, 8, 9}, 21, t), rnd({16, 7, 9}, 22, t).transpose(1, 2));  // OpenMP over batches
    check_matmul(rnd({3, 1, 9}, 23, t), rnd({3, 9, 5}, 24, t));                    // M = 1 (GEMV)
    check_matmul(rnd({3, 6, 9}, 25, t), rnd({3, 9, 1}, 26, t));                    // N = 1 (GEMV)
    check_matmul(rnd({9, 1}, 27, t).transpose(0, 1), rnd({5, 9}, 28, t).transpose(0, 1));  // M = 1, both Trans
    check_matmul(rnd({6, 9}, 29, t), rnd({9, 2}, 30, t).narrow(1, 1, 1));                  // N = 1 with row stride 2
    check_matmul(rnd({6, 1}, 31, t), rnd({1, 4}, 32, t));                                  // K = 1
    check_matmul(rnd({1, 1}, 33, t), rnd({1, 1}, 34, t));
  }
  // K = 0: the empty sum is zero, whatever the output buffer held.
  const Tensor z = matmul(Tensor::empty({3, 0}), Tensor::empty({0, 4}));
  CHECK(z.shape() == Shape{3, 4});
  for (double v : z.to_vector()) CHECK(v == 0.0);
  CHECK(matmul(Tensor::empty({0, 3}), Tensor::empty({3, 4})).shape() == Shape{0, 4});
}

TEST_CASE("matmul takes vector operands as NumPy does", "[ops][matmul]") {
  const Tensor v = from_vector({1, 2, 3}, {3}, DType::f64);
  const Tensor m = from_vector({1, 0, 2, 1, -1, 3}, {3, 2}, DType::f64);  // [[1,0],[2,1],[-1,3]]
  const Tensor vm = matmul(v, m);                                         // [1+4-3, 0+2+9]
  CHECK(vm.shape() == Shape{2});
  CHECK(vm.to_vector() == std::vector<double>{2, 11});
  const Tensor mv = matmul(m.transpose(0, 1), v);  // [2,3] @ [3]
  CHECK(mv.shape() == Shape{2});
  CHECK(mv.to_vector() == std::vector<double>{2, 11});
  const Tensor vv = matmul(v, v);
  CHECK(vv.shape() == Shape{});
  CHECK(vv.item() == 14);
  const Tensor bm = matmul(rnd({2, 4, 3}, 40, DType::f64), v);  // batched matrix @ vector
  CHECK(bm.shape() == Shape{2, 4});
}

TEST_CASE("matmul of transposed views allocates only its output", "[ops][matmul][memory]") {
  const Tensor a = rnd({16, 8}, 41, DType::f32), b = rnd({16, 16}, 42, DType::f32);
  const Tensor at = a.transpose(0, 1), bt = b.transpose(0, 1);  // [8,16] and [16,16], row stride 1
  const int64_t out_bytes = 8 * 16 * 4;                         // a multiple of the 64-byte granule
  matmul(at, bt);                                               // prime the allocator's free list
  const int64_t before = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  const Tensor c = matmul(at, bt);
  CHECK(allocator_stats().peak_bytes - before == out_bytes);
  CHECK(allocator_stats().bytes_in_use - before == out_bytes);
  check_mixed_close(c.to_vector(), naive_matmul(at, bt), 2e-5);
  // Batched attention-shaped q @ k^T: no copy of k either.
  const Tensor q = rnd({2, 4, 8, 16}, 43, DType::f32), k = rnd({2, 4, 8, 16}, 44, DType::f32);
  matmul(q, k.transpose(-1, -2));
  const int64_t before2 = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  const Tensor s = matmul(q, k.transpose(-1, -2));
  CHECK(allocator_stats().peak_bytes - before2 == 2 * 4 * 8 * 8 * 4);
}

TEST_CASE("matmul_into scales and accumulates into the output in place", "[ops][matmul]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor a = rnd({2, 5, 4}, 45, t), b = rnd({4, 3}, 46, t).transpose(0, 1).contiguous().transpose(0, 1);
    const Tensor out = rnd({2, 5, 3}, 47, t);
    const std::vector<double> before = out.to_vector(), ab = naive_matmul(a, b);
    matmul_into(a, b, out, 2.0, 0.5);
    std::vector<double> want(ab.size());
    for (size_t i = 0; i < ab.size(); ++i) want[i] = 2.0 * ab[i] + 0.5 * before[i];
    check_mixed_close(out.to_vector(), want, tol_of(t));
    // beta = 0 ignores what the buffer held, NaN included (GEMM and both GEMV paths).
    for (Shape bs : {Shape{4, 3}, Shape{4, 1}}) {
      const Tensor o = full({2, 5, bs[1]}, std::numeric_limits<double>::quiet_NaN(), t);
      const Tensor bb = rnd(bs, 48, t);
      matmul_into(a, bb, o, 1.0, 0.0);
      check_mixed_close(o.to_vector(), naive_matmul(a, bb), tol_of(t));
    }
    const Tensor row = full({1, 3}, std::numeric_limits<double>::quiet_NaN(), t);
    const Tensor a1 = rnd({1, 4}, 49, t), b1 = rnd({4, 3}, 50, t);
    matmul_into(a1, b1, row, 1.0, 0.0);
    check_mixed_close(row.to_vector(), naive_matmul(a1, b1), tol_of(t));
  }
}

TEST_CASE("matmul names the op and shapes on bad input", "[ops][matmul][errors]") {
  const Tensor a = Tensor::empty({2, 3}), b = Tensor::empty({4, 5});
  CHECK_THROWS_WITH(matmul(a, b), Catch::Contains("[matmul] a is [2,3] but b is [4,5]"));
  CHECK_THROWS_WITH(matmul(Tensor::empty({2, 2, 3}), Tensor::empty({3, 3, 4})),
                    Catch::Contains("[matmul] a is [2,2,3] but b is [3,3,4]: batch dims do not broadcast"));
  CHECK_THROWS_WITH(matmul(a, Tensor::empty({3, 4}, DType::f64)), Catch::Contains("[matmul] a is float32"));
  CHECK_THROWS_WITH(matmul(Tensor::empty({2, 3}, DType::i64), Tensor::empty({3, 4}, DType::i64)),
                    Catch::Contains("[matmul] a must be float32 or float64"));
  CHECK_THROWS_WITH(matmul_into(a, Tensor::empty({3, 4}), Tensor::empty({2, 5})),
                    Catch::Contains("[matmul_into] a is [2,3] and b is [3,4] but out is [2,5], not [2,4]"));
  CHECK_THROWS_WITH(matmul_into(a, Tensor::empty({3, 4}), Tensor::empty({4, 2}).transpose(0, 1)),
                    Catch::Contains("unit stride"));
  CHECK_THROWS_WITH(linear(Tensor::empty({5, 3}), Tensor::empty({4, 2}), Tensor()),
                    Catch::Contains("[linear] x is [5,3] but weight is [4,2]"));
  CHECK_THROWS_WITH(linear(Tensor::empty({5, 3}), Tensor::empty({4, 3}), Tensor::empty({3})),
                    Catch::Contains("[linear] weight is [4,3] but bias is [3], not [4]"));
}

TEST_CASE("linear is x W^T + b on 3-d and transposed inputs without copying W", "[ops][matmul][linear]") {
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const Tensor x = rnd({2, 3, 4}, 51, t), w = rnd({5, 4}, 52, t), bias = rnd({5}, 53, t);
    const std::vector<double> xw = naive_matmul(x, w.transpose(0, 1)), bv = bias.to_vector();
    std::vector<double> want = xw;
    for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 5];
    const Tensor y = linear(x, w, bias);
    CHECK(y.shape() == Shape{2, 3, 5});
    check_mixed_close(y.to_vector(), want, tol_of(t));
    check_mixed_close(linear(x, w, Tensor()).to_vector(), xw, tol_of(t));
    const Tensor xt = rnd({4, 6}, 54, t).transpose(0, 1);  // [6,4] with row stride 1
    check_mixed_close(linear(xt, w, Tensor()).to_vector(), naive_matmul(xt, w.transpose(0, 1)), tol_of(t));
  }
  // Memory: only the output [16,16] float32 (1 KiB) is allocated, W is read transposed in place.
  const Tensor x = rnd({4, 4, 32}, 55, DType::f32), w = rnd({16, 32}, 56, DType::f32), b = rnd({16}, 57, DType::f32);
  linear(x, w, b);
  const int64_t before = allocator_stats().bytes_in_use;
  reset_peak_bytes();
  const Tensor y = linear(x, w, b);
  CHECK(allocator_stats().peak_bytes - before == 16 * 16 * 4);
}

TEST_CASE("linear backward gives dx = dy W, dW = dy^T x, db = row sums", "[autograd][matmul][linear]") {
  Tensor x = rnd({3, 2, 4}, 58, DType::f64), w = rnd({5, 4}, 59, DType::f64), b = rnd({5}, 60, DType::f64);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor dy = rnd({3, 2, 5}, 61, DType::f64);
  autograd::backward(ag::linear(x, w, b), dy);
  const Tensor dy2 = dy.reshape({6, 5}), x2 = x.reshape({6, 4});
  check_mixed_close(x.grad().to_vector(), naive_matmul(dy2, w), 1e-12);
  check_mixed_close(w.grad().to_vector(), naive_matmul(dy2.transpose(0, 1), x2), 1e-12);
  std::vector<double> db(5, 0.0);
  const std::vector<double> dyv = dy.to_vector();
  for (size_t i = 0; i < dyv.size(); ++i) db[i % 5] += dyv[i];
  check_mixed_close(b.grad().to_vector(), db, 1e-12);
}

TEST_CASE("batched matmul gives the same values on one thread and on all", "[ops][matmul][exact]") {
  const Tensor a = rnd({24, 16, 12}, 62, DType::f32), b = rnd({24, 12, 10}, 63, DType::f32);
  const int threads = omp_get_max_threads();
  const Tensor many = matmul(a, b);
  omp_set_num_threads(1);
  const Tensor one = matmul(a, b);
  omp_set_num_threads(threads);
  CHECK(max_abs_diff(many, one) == 0.0);
}

// scripts/test.sh runs the [exact] cases once per OpenBLAS kernel the CPU can run, with
// OPENBLAS_CORETYPE and QKV_EXPECT_BLAS_KERNEL set to the kernel's name: this case proves that the
// kernel asked for is the one those runs used (an unknown name would silently fall back).
TEST_CASE("the BLAS kernel asked for by OPENBLAS_CORETYPE is the one in use", "[ops][matmul][exact]") {
  const std::string name = cpu::blas_kernel_name();
  WARN("BLAS GEMM kernel: " << name);
  const char* expected = std::getenv("QKV_EXPECT_BLAS_KERNEL");
  if (expected == nullptr || *expected == '\0') return;
  const auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  CHECK(lower(name) == lower(expected));
}
