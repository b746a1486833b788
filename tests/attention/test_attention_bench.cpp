// The attention benchmark's rows (bench/attention_bench.h, `qkv bench --what attention`): the figures
// scripts read from them, checked against counts written out here (B·H·N(N+1)/2 causal pairs).
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "bench/attention_bench.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

// A small strided benchmark (B 1, H 2, Hkv 2, D 16, fused, one timed step, one thread).
AttentionBenchOptions small_strided_bench(std::vector<int64_t> ns) {
  AttentionBenchOptions o;
  o.ns = std::move(ns);
  o.hkvs = {2};
  o.heads = 2;
  o.head_dims = {16};
  o.kernels = {Kernel::fused};
  o.repeats = 1;
  o.threads = 1;
  o.pattern.kind = Pattern::strided;  // s = l = ceil(sqrt(N))
  return o;
}

// Causal strided pairs of one head counted pair by pair: key j <= i kept when i - j < l or s | i - j.
int64_t strided_pairs_by_hand(int64_t n) {
  const int64_t s = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))), l = s;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) kept += (i - j < l || (i - j) % s == 0) ? 1 : 0;
  return kept;
}

}  // namespace

TEST_CASE("attention bench: --versus-full times full causal attention alongside the pattern", "[attention][sparse]") {
  AttentionBenchOptions o = small_strided_bench({256});
  const auto plain = bench_attention(o);
  REQUIRE(plain.size() == 1);
  CHECK(plain[0].rounds == 0);
  CHECK(plain[0].ratio_vs_full == 0);
  o.versus_full = true;
  o.rounds = 2;
  const auto rows = bench_attention(o);
  REQUIRE(rows.size() == 1);
  const AttentionBenchResult& r = rows[0];
  CHECK(r.rounds == 2);
  REQUIRE(r.full_ms > 0);
  const double full_kept = 2.0 * 256 * 257 / 2;  // B 1, H 2, causal
  CHECK(r.full_ns_per_kept_pair == Approx(r.full_ms * 1e6 / full_kept).epsilon(1e-12));
  CHECK(std::isfinite(r.ratio_vs_full));
  CHECK(r.ratio_vs_full > 0);
  CHECK(r.kept_pairs < static_cast<int64_t>(full_kept));
}

TEST_CASE("attention bench: --interleave-n times every N round-robin with the same figures as in turn",
          "[attention][sparse]") {
  AttentionBenchOptions o = small_strided_bench({64, 200});
  const auto in_turn = bench_attention(o);
  o.interleave_n = true;
  o.rounds = 3;
  const auto rows = bench_attention(o);
  REQUIRE(rows.size() == 2);
  REQUIRE(in_turn.size() == 2);
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("N = " << rows[i].n);
    CHECK(rows[i].n == o.ns[i]);
    CHECK(rows[i].interleaved);
    CHECK_FALSE(in_turn[i].interleaved);
    CHECK(rows[i].rounds == 3);
    CHECK(rows[i].ms > 0);
    CHECK(rows[i].forward_ms > 0);
    CHECK(rows[i].forward_ms < rows[i].ms);
    CHECK(rows[i].peak_bytes > 0);
    // Counted from the pattern, not timed: the same in either order, and pair by pair.
    CHECK(rows[i].kept_pairs == 2 * strided_pairs_by_hand(rows[i].n));
    CHECK(rows[i].kept_pairs == in_turn[i].kept_pairs);
    CHECK(rows[i].visited_tiles == in_turn[i].visited_tiles);
    CHECK(rows[i].ns_per_kept_pair == Approx(rows[i].ms * 1e6 / rows[i].kept_pairs).epsilon(1e-12));
  }
  o.versus_full = true;
  CHECK_THROWS_WITH(bench_attention(o), Catch::Contains("--interleave-n and --versus-full"));
}
