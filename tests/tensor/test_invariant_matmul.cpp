// The batch-invariant linear forward (tensor/cpu/invariant_matmul.h): its one reduction order is
// pinned by an independent scalar loop of std::fma in that order (bit for bit), its accuracy by a
// float64 reference, and its invariance by computing the same rows inside batches of other rows,
// at other leading dimensions, from a packed weight and on 1, 2 and 4 threads.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <latch>
#include <random>
#include <thread>
#include <vector>

#include "compare_util.h"
#include "tensor/cpu/invariant_matmul.h"
#include "tensor/cpu/parallel.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"

using namespace qkv;
using cpu::invariant_linear;

namespace {

// The shapes around the kernel's edges: 16-column panels (two 8-lane vectors), 8-wide transposes
// when packing, 6-row register blocks.
const std::vector<int64_t> kEdgeSizes = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65};

std::vector<float> random_floats(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& f : v) f = dist(gen);
  return v;
}

// The order the header states, one element at a time: acc = fma(x[m, k], W[n, k], acc) for
// k = 0..K-1 from +0, then + bias[n].
std::vector<float> sequential_fma(const float* x, int64_t ldx, const float* w, int64_t ldw, const float* bias,
                                  int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc = std::fma(x[i * ldx + kk], w[j * ldw + kk], acc);
      y[static_cast<size_t>(i * n + j)] = bias ? acc + bias[j] : acc;
    }
  return y;
}

// Bitwise equal, NaN matching any NaN (which input's payload an FMA passes on may differ).
bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// How many elements of got differ in their bits from want (with the first one reported).
int64_t count_differing(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], want[i])) {
      if (bad == 0) UNSCOPED_INFO("first differing element " << i << ": " << got[i] << " vs " << want[i]);
      ++bad;
    }
  return bad;
}

struct Problem {
  int64_t m, n, k;
  std::vector<float> x, w, bias;
  Problem(int64_t m_, int64_t n_, int64_t k_, uint32_t seed) : m(m_), n(n_), k(k_) {
    x = random_floats(m * k, seed);
    w = random_floats(n * k, seed + 1, 1.0f / std::sqrt(float(std::max<int64_t>(k, 1))));
    bias = random_floats(n, seed + 2);
  }
  std::vector<float> run(bool with_bias) const {
    std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
    invariant_linear(x.data(), k, w.data(), k, with_bias ? bias.data() : nullptr, y.data(), n, m, n, k);
    return y;
  }
};

}  // namespace

TEST_CASE("invariant_linear equals a sequential std::fma loop bit for bit", "[invariant][exact]") {
  for (const bool with_bias : {false, true})
    for (int64_t n : kEdgeSizes)
      for (int64_t k : kEdgeSizes)
        for (int64_t m : {1, 5, 7}) {
          const Problem p(m, n, k, static_cast<uint32_t>(1000 * n + 10 * k + m));
          const std::vector<float> want =
              sequential_fma(p.x.data(), k, p.w.data(), k, with_bias ? p.bias.data() : nullptr, m, n, k);
          INFO("M " << m << " N " << n << " K " << k << " bias " << with_bias);
          CHECK(count_differing(p.run(with_bias), want) == 0);
        }
  // The model's widths (GPT-2: 768 and 3072), over both orientations, on 13 rows (two full
  // register blocks and an edge).
  for (auto [n, k] : {std::pair<int64_t, int64_t>{3072, 768}, {768, 3072}, {65, 3072}}) {
    const Problem p(13, n, k, static_cast<uint32_t>(n + k));
    INFO("N " << n << " K " << k);
    CHECK(count_differing(p.run(true), sequential_fma(p.x.data(), k, p.w.data(), k, p.bias.data(), 13, n, k)) == 0);
  }
}

TEST_CASE("invariant_linear reads W and x through leading dimensions in the same order", "[invariant][exact]") {
  // W rows 1030 or 3100 floats apart: M = 1 reads W unpacked up to 1024, packs it beyond; x and y
  // rows apart too. Only the first K of each row of W and x may count.
  for (int64_t ldw : {1030, 3100})
    for (int64_t m : {1, 7})
      for (int64_t n : {5, 40, 67}) {
        const int64_t k = 1000, ldx = 1003, ldy = n + 2;
        const std::vector<float> w = random_floats(n * ldw, 41), x = random_floats(m * ldx, 42),
                                 bias = random_floats(n, 43);
        std::vector<float> y(static_cast<size_t>(m * ldy), 0.0f);
        invariant_linear(x.data(), ldx, w.data(), ldw, bias.data(), y.data(), ldy, m, n, k);
        const std::vector<float> want = sequential_fma(x.data(), ldx, w.data(), ldw, bias.data(), m, n, k);
        std::vector<float> got;
        for (int64_t i = 0; i < m; ++i) got.insert(got.end(), y.begin() + i * ldy, y.begin() + i * ldy + n);
        INFO("ldw " << ldw << " M " << m << " N " << n);
        CHECK(count_differing(got, want) == 0);
        for (int64_t i = 0; i < m; ++i)  // the gap between rows of y is left alone
          for (int64_t j = n; j < ldy; ++j) CHECK(y[static_cast<size_t>(i * ldy + j)] == 0.0f);
      }
}

TEST_CASE("invariant_linear keeps the sequential order through infinities, NaNs, zeros and subnormals",
          "[invariant][exact]") {
  const int64_t m = 7, n = 19, k = 37;
  Problem p(m, n, k, 77);
  const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -3e-39f, 3e38f, -3e38f};
  std::mt19937 gen(5);
  for (int i = 0; i < 60; ++i) {
    p.x[gen() % p.x.size()] = specials[gen() % 9];
    p.w[gen() % p.w.size()] = specials[gen() % 9];
  }
  // Sums that cancel to exactly zero, and overflow of the running sum midway.
  for (int64_t kk = 0; kk < k; ++kk) p.x[kk] = 1.0f, p.w[kk] = kk % 2 ? -1.0f : 1.0f;
  for (int64_t kk = 0; kk < k; ++kk) p.x[k + kk] = 3e38f, p.w[k + kk] = kk < 3 ? 2.0f : -1.0f;
  for (const bool with_bias : {false, true})
    CHECK(count_differing(p.run(with_bias), sequential_fma(p.x.data(), k, p.w.data(), k,
                                                           with_bias ? p.bias.data() : nullptr, m, n, k)) == 0);
}

TEST_CASE("invariant_linear is within the bound of a K-term FMA chain of the float64 product", "[invariant]") {
  // |y - exact| <= (K + 1) u (sum_k |x_k w_k| + |b|), u = 2^-24: K roundings of the chain and one
  // of the bias addition, each at most u times a partial sum bounded by that total.
  const double u = std::ldexp(1.0, -24);
  for (int64_t n : {1, 9, 17, 65, 768})
    for (int64_t k : {1, 8, 63, 768, 3072}) {
      const int64_t m = 7;
      const Problem p(m, n, k, static_cast<uint32_t>(7 * n + k));
      const std::vector<float> y = p.run(true);
      int64_t bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double exact = p.bias[j], magnitude = std::fabs(p.bias[j]);
          for (int64_t kk = 0; kk < k; ++kk) {
            const double prod = double(p.x[i * k + kk]) * double(p.w[j * k + kk]);
            exact += prod;
            magnitude += std::fabs(prod);
          }
          const double err = std::fabs(double(y[i * n + j]) - exact), bound = double(k + 1) * u * magnitude;
          worst = std::max(worst, err / bound);
          if (!(err <= bound)) ++bad;
        }
      INFO("N " << n << " K " << k << ": worst error / bound " << worst);
      CHECK(bad == 0);
      CHECK(worst > 0);  // the float32 chain does round: the comparison is not vacuous
    }
}

TEST_CASE("a row of invariant_linear is the same alone and inside batches of other rows", "[invariant][exact]") {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{65, 63}, {768, 768}, {17, 3072}}) {
    const Problem target(3, n, k, 11);  // three rows, each computed alone first
    std::vector<std::vector<float>> alone;
    for (int64_t r = 0; r < 3; ++r) {
      std::vector<float> y(static_cast<size_t>(n));
      invariant_linear(target.x.data() + r * k, k, target.w.data(), k, target.bias.data(), y.data(), n, 1, n, k);
      alone.push_back(y);
    }
    for (int64_t m : {2, 3, 7, 64, 65}) {
      // Other random rows around the targets, which sit at the start, the end and in between
      // (another register block, and another 384-row task when M is large).
      for (int64_t r = 0; r < 3; ++r) {
        const int64_t at = r == 0 ? 0 : r == 1 ? m - 1 : m / 2;
        const int64_t ldx = k + 5, ldy = n + 3;  // rows apart in memory, as in a strided view
        std::vector<float> x = random_floats(m * ldx, static_cast<uint32_t>(m * 31 + r));
        std::memcpy(x.data() + at * ldx, target.x.data() + r * k, static_cast<size_t>(k) * 4);
        std::vector<float> y(static_cast<size_t>(m * ldy));
        invariant_linear(x.data(), ldx, target.w.data(), k, target.bias.data(), y.data(), ldy, m, n, k);
        const std::vector<float> row(y.begin() + at * ldy, y.begin() + at * ldy + n);
        INFO("N " << n << " K " << k << ": row " << at << " of M = " << m);
        CHECK(count_differing(row, alone[static_cast<size_t>(r)]) == 0);
      }
    }
  }
}

TEST_CASE("invariant_linear rows beyond one task and the packed weight give the same bits", "[invariant][exact]") {
  // 800 rows: three 384-row tasks; the unpacked call packs its panels per task, the packed one
  // reads pack_weight's copy; both must equal the rows computed one at a time.
  const int64_t m = 800, n = 40, k = 33;
  const Problem p(m, n, k, 21);
  const std::vector<float> batched = p.run(true);
  const cpu::PackedWeight packed = cpu::pack_weight(p.w.data(), k, n, k);
  std::vector<float> from_packed(static_cast<size_t>(m * n));
  invariant_linear(p.x.data(), k, packed, p.bias.data(), from_packed.data(), n, m);
  std::vector<float> one_by_one(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    invariant_linear(p.x.data() + i * k, k, packed, p.bias.data(), one_by_one.data() + i * n, n, 1);
  CHECK(count_differing(batched, one_by_one) == 0);
  CHECK(count_differing(from_packed, one_by_one) == 0);
  CHECK(count_differing(batched, sequential_fma(p.x.data(), k, p.w.data(), k, p.bias.data(), m, n, k)) == 0);
}

TEST_CASE("invariant_linear gives the same bits on 1, 2 and 4 threads", "[invariant][exact]") {
  // Big enough to be split: 3072 x 768 weights (9 MB) at M = 1 (decode) and at M = 65.
  for (int64_t m : {1, 65}) {
    const Problem p(m, 3072, 768, 31);
    const std::vector<float> one = test::with_threads(1, [&] { return p.run(true); });
    for (int threads : {2, 4}) {
      const std::vector<float> many = test::with_threads(threads, [&] { return p.run(true); });
      INFO("M " << m << ", " << threads << " threads");
      CHECK(cpu::last_split_trace().threads == threads);  // the work was offered to that many threads
      CHECK(count_differing(many, one) == 0);
    }
  }
}

TEST_CASE("invariant_linear on tensors: shapes, views, bias and refusals", "[invariant]") {
  const Tensor x = randn({2, 3, 20}, 3), w = randn({9, 20}, 4), b = randn({9}, 5);
  const Tensor y = invariant_linear(x, w, b);
  REQUIRE(y.shape() == Shape{2, 3, 9});
  const std::vector<float> xv(x.data<float>(), x.data<float>() + 120), wv(w.data<float>(), w.data<float>() + 180);
  CHECK(count_differing(std::vector<float>(y.data<float>(), y.data<float>() + 54),
                        sequential_fma(xv.data(), 20, wv.data(), 20, b.data<float>(), 6, 9, 20)) == 0);
  // Without bias; and a weight given as a transposed view is read through a contiguous copy.
  const Tensor y0 = invariant_linear(x, w, Tensor());
  CHECK(count_differing(std::vector<float>(y0.data<float>(), y0.data<float>() + 54),
                        sequential_fma(xv.data(), 20, wv.data(), 20, nullptr, 6, 9, 20)) == 0);
  const Tensor wt = w.transpose(0, 1).contiguous().transpose(0, 1);
  CHECK(max_abs_diff(invariant_linear(x, wt, b), y) == 0.0);
  // Close to qkv::linear (BLAS, another order).
  CHECK(max_abs_diff(invariant_linear(x, w, b), linear(x, w, b)) < 1e-5);

  // Empty sums: K = 0 gives the bias (or +0); no rows or no columns give an empty result.
  const Tensor y_k0 = invariant_linear(Tensor::empty({4, 0}), Tensor::empty({9, 0}), b);
  REQUIRE(y_k0.shape() == Shape{4, 9});
  for (int64_t i = 0; i < 36; ++i) CHECK(same_bits(y_k0.data<float>()[i], b.data<float>()[i % 9]));
  const Tensor y_k0_nobias = invariant_linear(Tensor::empty({2, 0}), Tensor::empty({3, 0}), Tensor());
  for (int64_t i = 0; i < 6; ++i) CHECK(same_bits(y_k0_nobias.data<float>()[i], 0.0f));
  CHECK(invariant_linear(Tensor::empty({0, 20}), w, b).shape() == Shape{0, 9});
  CHECK(invariant_linear(x, Tensor::empty({0, 20}), Tensor()).shape() == Shape{2, 3, 0});

  CHECK_THROWS_WITH(invariant_linear(x, randn({9, 21}, 1), b), Catch::Contains("weight [out, in]"));
  CHECK_THROWS_WITH(invariant_linear(x, w, randn({8}, 1)), Catch::Contains("need float32 [9]"));
  CHECK_THROWS_WITH(invariant_linear(x.to(DType::f64), w, b), Catch::Contains("must be float32"));
  std::vector<float> buf(100);
  CHECK_THROWS_WITH(invariant_linear(buf.data(), 3, buf.data(), 4, nullptr, buf.data(), 4, 2, 4, 4),
                    Catch::Contains("leading dimensions"));
}

TEST_CASE("inside a PackedWeightScope small-M products use cached panels with the same bits", "[invariant][exact]") {
  // K = 3072 and K = 100: a row stride past the unpacked M = 1 path's reach and a ragged one.
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{200, 3072}, {37, 100}}) {
    const Tensor w = randn({n, k}, 21, 0, 0.0, 0.1, DType::f32), b = randn({n}, 22, 0, 0.0, 0.1, DType::f32);
    for (int64_t m : {int64_t{1}, int64_t{3}, cpu::kPackedRows, cpu::kPackedRows + 1}) {
      const Tensor x = randn({m, k}, 23 + m, 0, 0.0, 1.0, DType::f32);
      const Tensor plain = invariant_linear(x, w, b);
      Tensor scoped, again;
      {
        const cpu::PackedWeightScope scope;
        scoped = invariant_linear(x, w, b);
        again = invariant_linear(x, w, b);
      }
      INFO("N " << n << " K " << k << " M " << m);
      CHECK(std::memcmp(plain.data<float>(), scoped.data<float>(), plain.numel() * sizeof(float)) == 0);
      CHECK(std::memcmp(plain.data<float>(), again.data<float>(), plain.numel() * sizeof(float)) == 0);
    }
  }
}

// bf16 autocast rounds each weight into a new tensor per call; once it is freed, the next one may
// take its address with other values. The cache must pack that one again, not reuse the panels.
TEST_CASE("inside a PackedWeightScope a new weight at a freed weight's address is packed again", "[invariant][exact]") {
  const cpu::PackedWeightScope scope;
  const Tensor x = randn({2, 64}, 31, 0, 0.0, 1.0, DType::f32);
  const void* previous = nullptr;
  int reused = 0;
  for (uint64_t seed = 40; seed < 48; ++seed) {
    const Tensor w = randn({24, 64}, seed, 0, 0.0, 0.1, DType::f32);  // the last pass's w is freed
    if (w.data<float>() == previous) ++reused;
    previous = w.data<float>();
    const Tensor got = invariant_linear(x, w, Tensor());
    // Against the float64 sum, which the panels of another weight would miss by far.
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 24; ++j) {
        double want = 0;
        for (int64_t q = 0; q < 64; ++q)
          want += double(x.data<float>()[i * 64 + q]) * double(w.data<float>()[j * 64 + q]);
        REQUIRE(std::fabs(got.data<float>()[i * 24 + j] - want) < 1e-4);
      }
  }
  REQUIRE(reused > 0);  // the allocator gave a freed weight's address to a new one: the case above
}

// Scopes are per thread: another thread's generation (a second Python model) must not pack this
// thread's weights, which may change between calls (Model.parameters() writes through).
TEST_CASE("a PackedWeightScope on one thread leaves another thread's products unpacked", "[invariant][exact]") {
  std::latch scoped(1), done(1);
  std::thread holder([&] {
    const cpu::PackedWeightScope scope;
    scoped.count_down();
    done.wait();
  });
  scoped.wait();
  const Tensor x = randn({2, 64}, 51, 0, 0.0, 1.0, DType::f32);
  Tensor w = randn({24, 64}, 52, 0, 0.0, 0.1, DType::f32);
  const Tensor before = invariant_linear(x, w, Tensor());
  for (int64_t e = 0; e < w.numel(); ++e) w.data<float>()[e] *= 2.0f;  // in place: same storage
  const Tensor after = invariant_linear(x, w, Tensor()), fresh = invariant_linear(x, w.clone(), Tensor());
  done.count_down();
  holder.join();
  CHECK(std::memcmp(after.data<float>(), fresh.data<float>(), after.numel() * sizeof(float)) == 0);
  CHECK(std::memcmp(after.data<float>(), before.data<float>(), after.numel() * sizeof(float)) != 0);
}

// bf16 inference: the panels hold W rounded to bf16 and the kernel widens them back, so the product
// is bitwise the float32 kernel's on W rounded first, at every M a decode loop packs for.
TEST_CASE("bf16 panels give the bits of the float32 kernel on W rounded to bf16", "[invariant][bf16][exact]") {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{200, 3072}, {37, 100}, {16, 1}}) {
    const Tensor w = randn({n, k}, 51, 0, 0.0, 0.1, DType::f32), b = randn({n}, 52, 0, 0.0, 0.1, DType::f32);
    const Tensor rounded = w.to(DType::bf16).to(DType::f32);
    const cpu::PackedWeight panels = cpu::pack_weight_bf16(w.data<float>(), k, n, k);
    REQUIRE(panels.bf16);
    REQUIRE(panels.half.size() == size_t((n + 15) / 16 * 16 * k));  // 2 bytes a value
    for (int64_t m : {int64_t{1}, int64_t{3}, cpu::kPackedRows}) {
      INFO("N " << n << " K " << k << " M " << m);
      const Tensor x = randn({m, k}, 53 + m, 0, 0.0, 1.0, DType::f32).to(DType::bf16).to(DType::f32);
      const Tensor want = invariant_linear(x, rounded, b);
      Tensor got = Tensor::empty({m, n});
      cpu::invariant_linear(x.data<float>(), k, panels, b.data<float>(), got.data<float>(), n, m);
      CHECK(std::memcmp(want.data<float>(), got.data<float>(), want.numel() * sizeof(float)) == 0);
      // The Tensor form: W rounded by the op, inside a scope (bf16 panels) and outside (a copy).
      const Tensor outside = cpu::invariant_linear(x, w, b, cpu::InvariantBf16::round_weight);
      CHECK(std::memcmp(want.data<float>(), outside.data<float>(), want.numel() * sizeof(float)) == 0);
      const cpu::PackedWeightScope scope;
      const Tensor inside = cpu::invariant_linear(x, w, b, cpu::InvariantBf16::round_weight);
      CHECK(std::memcmp(want.data<float>(), inside.data<float>(), want.numel() * sizeof(float)) == 0);
      // And not the float32 weights' product: the rounding is really applied.
      const Tensor unrounded = invariant_linear(x, w, b);
      CHECK(std::memcmp(unrounded.data<float>(), inside.data<float>(), want.numel() * sizeof(float)) != 0);
    }
  }
}

TEST_CASE("linear_bf16_weight equals linear on W rounded to bf16 in both numerics modes", "[invariant][bf16][exact]") {
  const Tensor w = randn({40, 70}, 61, 0, 0.0, 0.1, DType::f32), b = randn({40}, 62, 0, 0.0, 0.1, DType::f32);
  const Tensor rounded = w.to(DType::bf16).to(DType::f32);
  const Tensor x = randn({5, 70}, 63, 0, 0.0, 1.0, DType::f32).to(DType::bf16).to(DType::f32);
  for (Numerics mode : {Numerics::invariant, Numerics::standard}) {
    const NumericsGuard guard(mode);
    const Tensor want = linear(x, rounded, b, /*bf16_operands=*/true), got = linear_bf16_weight(x, w, b);
    CHECK(std::memcmp(want.data<float>(), got.data<float>(), want.numel() * sizeof(float)) == 0);
  }
}
