// Incremental decoding with the KV cache, and the positional schemes that act inside attention
// (RoPE, ALiBi).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "attention/alibi.h"
#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "attention/rope.h"
#include "compare_util.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

using test::rel_err;

struct DecodeCase {
  int64_t window = 0;
  bool rope = false;
  Kernel kernel = Kernel::fused;
};

// Full causal forward over N tokens vs. feeding them through a cache in `chunks`.
double decode_error(const DecodeCase& dc, const std::vector<int64_t>& chunks) {
  const int64_t B = 2, Hq = 4, Hkv = 2, N = 23, D = 16;
  const Tensor q = randn({B, Hq, N, D}, 1), k = randn({B, Hkv, N, D}, 2), v = randn({B, Hkv, N, D}, 3);
  AttentionOptions o;
  o.causal = true;
  o.window = dc.window;
  o.kernel = dc.kernel;
  const Tensor qf = dc.rope ? apply_rope(q, 0, 500.0) : q, kf = dc.rope ? apply_rope(k, 0, 500.0) : k;
  const Tensor full = attention(qf, kf, v, o);

  KVCache cache(B, Hkv, N, D);
  std::vector<Tensor> outs;
  int64_t t = 0;
  for (int64_t n : chunks) {
    Tensor qc = q.narrow(2, t, n), kc = k.narrow(2, t, n);
    if (dc.rope) {  // rotate the new tokens at their absolute positions before caching
      qc = apply_rope(qc, cache.next_position(), 500.0);
      kc = apply_rope(kc, cache.next_position(), 500.0);
    }
    outs.push_back(cache.attend(qc, kc, v.narrow(2, t, n), o));
    t += n;
  }
  REQUIRE(t == N);
  REQUIRE(cache.length() == N);
  return rel_err(cat(outs, 2), full);
}

}  // namespace

TEST_CASE("KV-cache decoding token by token and in chunks reproduces the full causal forward", "[attention][exact]") {
  const std::vector<int64_t> tokens(23, 1), chunks = {5, 1, 7, 2, 8};
  for (Kernel kern : {Kernel::fused, Kernel::reference})
    for (int64_t window : {0, 6})
      for (bool rope : {false, true}) {
        INFO("kernel " << (kern == Kernel::fused ? "fused" : "reference") << " window " << window << " rope " << rope);
        const DecodeCase dc{window, rope, kern};
        CHECK(decode_error(dc, tokens) <= 1e-5);
        CHECK(decode_error(dc, chunks) <= 1e-5);
      }
}

TEST_CASE("fused KV-cache decoding gives the full forward's bits past several key steps and query blocks",
          "[attention][exact]") {
  // The fused forward cuts a row's keys into steps fixed by position (128 keys without a layout)
  // and reads Kᵀ transposed once per call where a call has several query blocks, else transposes
  // per tile: one token at a time, and chunks of 37, 1, 64 (two blocks), 48 and 150 must all give
  // the bits of one 300-token call. D = 64 and N = 300 reach both paths and three key steps. A
  // window wider than a step (its first key moves with the row, so a block's first row and its
  // other rows start at different keys) under numerics = invariant: under standard numerics a
  // causal window takes the regrouped walk, whose tiles follow the call's rows (fused.h).
  const int64_t B = 1, Hq = 4, Hkv = 2, N = 300, D = 64;
  const Tensor q = randn({B, Hq, N, D}, 4), k = randn({B, Hkv, N, D}, 5), v = randn({B, Hkv, N, D}, 6);
  for (int64_t window : {0, 200}) {
    NumericsGuard mode(window ? Numerics::invariant : Numerics::standard);
    AttentionOptions o;
    o.causal = true;
    o.window = window;
    o.kernel = Kernel::fused;
    const std::vector<double> full = attention(q, k, v, o).to_vector();  // float32 values, exactly
    for (const std::vector<int64_t>& chunks : {std::vector<int64_t>(N, 1), std::vector<int64_t>{37, 1, 64, 48, 150}}) {
      KVCache cache(B, Hkv, N, D);
      std::vector<Tensor> outs;
      int64_t t = 0;
      for (int64_t n : chunks) {
        outs.push_back(cache.attend(q.narrow(2, t, n), k.narrow(2, t, n), v.narrow(2, t, n), o));
        t += n;
      }
      const std::vector<double> got = cat(outs, 2).to_vector();
      REQUIRE(got.size() == full.size());
      int64_t differ = 0;
      for (size_t e = 0; e < got.size(); ++e) differ += std::memcmp(&got[e], &full[e], sizeof(double)) != 0 ? 1 : 0;
      INFO("window " << window << ", " << chunks.size() << " chunks");
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("KV-cache views share the cache buffers and errors are clear", "[attention]") {
  KVCache cache(1, 2, 4, 3);
  auto [k, v] = cache.append(randn({1, 2, 3, 3}, 1), randn({1, 2, 3, 3}, 2));
  CHECK(k.shape() == Shape{1, 2, 3, 3});
  CHECK(cache.length() == 3);
  CHECK_THROWS_WITH(cache.append(randn({1, 2, 2, 3}, 3), randn({1, 2, 2, 3}, 4)),
                    Catch::Contains("exceeds the capacity 4"));
  CHECK(cache.length() == 3);  // a refused append changes nothing
  CHECK_THROWS_WITH(cache.append(randn({1, 1, 1, 3}, 5), randn({1, 1, 1, 3}, 6)),
                    Catch::Contains("k_new is [1,1,1,3]") && Catch::Contains("[1,2,1,3]"));
  auto [k2, v2] = cache.append(randn({1, 2, 1, 3}, 7), randn({1, 2, 1, 3}, 8));
  CHECK(k2.storage() == k.storage());  // views, not copies
  CHECK(max_abs_diff(k2.narrow(2, 0, 3), k) == 0.0);
  cache.truncate(1);
  CHECK(cache.view().first.size(2) == 1);
  cache.clear();
  CHECK(cache.length() == 0);
}

TEST_CASE("RoPE rotates rotate-half pairs by absolute position", "[attention]") {
  const int64_t B = 2, H = 3, N = 5, D = 8;
  const double theta = 10000.0;
  const Tensor x = randn({B, H, N, D}, 1, 0, 0.0, 1.0, DType::f64);
  const Tensor y = apply_rope(x, 3, theta);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t f = 0; f < D / 2; ++f) {
          const double a = (3 + n) * std::pow(theta, -2.0 * f / D);
          const double x1 = x.at({b, h, n, f}), x2 = x.at({b, h, n, f + D / 2});
          CHECK(y.at({b, h, n, f}) == Approx(x1 * std::cos(a) - x2 * std::sin(a)).margin(1e-12));
          CHECK(y.at({b, h, n, f + D / 2}) == Approx(x2 * std::cos(a) + x1 * std::sin(a)).margin(1e-12));
        }
  // A positions tensor [B, N] (left padding shifts batch 1 by 2) agrees with start positions.
  const Tensor pos = from_vector_i64({3, 4, 5, 6, 7, 1, 2, 3, 4, 5}, {B, N});
  const Tensor yp = apply_rope(x, pos, theta);
  CHECK(max_abs_diff(yp.narrow(0, 0, 1), y.narrow(0, 0, 1)) < 1e-15);
  CHECK(max_abs_diff(yp.narrow(0, 1, 1), apply_rope(x, 1, theta).narrow(0, 1, 1)) < 1e-15);
  CHECK_THROWS_WITH(apply_rope(randn({1, 1, 2, 3}, 2), 0), Catch::Contains("even"));
  CHECK_THROWS_WITH(apply_rope(x, from_vector_i64({0, 1}, {2})), Catch::Contains("positions are [2]"));
}

TEST_CASE("RoPE makes query-key scores depend only on the relative position", "[attention]") {
  const Tensor q = randn({1, 1, 1, 16}, 1, 0, 0.0, 1.0, DType::f64),
               k = randn({1, 1, 1, 16}, 2, 0, 0.0, 1.0, DType::f64);
  auto score = [&](int64_t i, int64_t j) { return matmul(apply_rope(q, i), apply_rope(k, j).transpose(2, 3)).item(); };
  CHECK(score(7, 3) == Approx(score(104, 100)).margin(1e-10));
  CHECK(score(0, 0) == Approx(matmul(q, k.transpose(2, 3)).item()).margin(1e-12));
  CHECK(std::fabs(score(7, 3) - score(7, 4)) > 1e-6);
}

TEST_CASE("ALiBi slopes follow the geometric rule, also for head counts that are not powers of two", "[attention]") {
  const auto s8 = alibi_slopes(8);
  REQUIRE(s8.size() == 8);
  for (int h = 0; h < 8; ++h) CHECK(s8[h] == Approx(std::pow(2.0, -(h + 1))));
  // 6 heads: the 4 slopes of 4 heads (2^-2, 2^-4, 2^-6, 2^-8), then 2^-1 and 2^-3 from 8 heads.
  const auto s6 = alibi_slopes(6);
  const std::vector<double> want6 = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  REQUIRE(s6.size() == 6);
  for (int h = 0; h < 6; ++h) CHECK(s6[h] == Approx(want6[h]));
  CHECK(alibi_slopes(12).size() == 12);
  CHECK(alibi_slopes(12)[8] == Approx(std::pow(2.0, -0.5)));  // 16-head sequence, first of the extras
}

TEST_CASE("ALiBi on the fly equals the explicit bias, under GQA, in both kernels", "[attention]") {
  const int64_t Hq = 6, Hkv = 2, Nq = 9, Nk = 13;
  const Tensor q = randn({2, Hq, Nq, 8}, 1), k = randn({2, Hkv, Nk, 8}, 2), v = randn({2, Hkv, Nk, 8}, 3);
  const auto slopes = alibi_slopes(Hq);
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    AttentionOptions a, b;
    a.causal = b.causal = true;
    a.kernel = b.kernel = kern;
    a.alibi_slopes = slopes;
    b.bias = alibi_bias(slopes, Nq, Nk);
    const Tensor with = attention(q, k, v, a);
    CHECK(rel_err(with, attention(q, k, v, b)) < 1e-6);
    CHECK(rel_err(with, attention(q, k, v)) > 1e-3);  // and it does change the output
  }
}
