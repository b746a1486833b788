// The bf16 GEMM (tensor/cpu/gemm/bf16_gemm.h): the kernels on the CPU's bf16 units and the same
// blocks with the instructions written out as their definitions (these run on any AVX2 CPU):
// - the definitions' kernels give, bit for bit, a scalar loop of the definitions' order (pairs of
//   k, odd then even for VDPBF16PS, even then odd for TDPBF16PS, each step one rounding, blocks of
//   the kernel's depth), across every blocking edge and layout: the packing and blocking are right;
// - every kernel agrees with float64 on the bf16-rounded operands, alpha, beta, NaN in C (beta 0);
// - bits independent of threads and of the other rows;
// - where the units exist, each unit's kernel against its definition (any difference reported);
// - the dispatch: names, refusals, and what runs on this CPU;
// - the invariant product (invariant_sbgemm_nt) on the dot-pair kernels: the float32 chain's bits
//   at every edge, where the unit would flush or overflow, for any thread count and row.
#include <omp.h>

#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/gemm/bf16_kernel_table.h"
#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

using namespace qkv;
using namespace qkv::cpu;

namespace {

using gemm_detail::Bf16KernelTable;

struct Named {
  std::string name;
  const Bf16KernelTable* table;
};

// The definitions run where AVX2 + FMA do (their file's target); the units where the CPU has them.
std::vector<Named> runnable_tables() {
  std::vector<Named> out;
  const CpuFeatures& f = cpu_features();
  if (gemm_detail::kAvx512Bf16Emulated.name && f.avx2 && f.fma) {
    out.push_back({"avx512_bf16-definition", &gemm_detail::kAvx512Bf16Emulated});
    out.push_back({"amx-definition", &gemm_detail::kAmxEmulated});
  }
  if (bf16_kernel_supported(Bf16Kernel::avx512_bf16)) out.push_back({"avx512_bf16", &gemm_detail::kAvx512Bf16Kernel});
  if (bf16_kernel_supported(Bf16Kernel::amx)) out.push_back({"amx", &gemm_detail::kAmxKernel});
  return out;
}

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// Values in [-1, 1] rounded to bf16.
std::vector<float> bf16_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = round_bf16(u(rng));
  return v;
}

struct Problem {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c0;
  Problem(bool ta_, bool tb_, int64_t m_, int64_t n_, int64_t k_, int64_t pad, uint32_t seed)
      : ta(ta_), tb(tb_), m(m_), n(n_), k(k_) {
    lda = (ta ? m : k) + pad;
    ldb = (tb ? k : n) + pad;
    ldc = n + pad;
    a = bf16_values(size_t((ta ? k : m) * lda), seed);
    b = bf16_values(size_t((tb ? n : k) * ldb), seed + 1);
    c0 = bf16_values(size_t(m * ldc), seed + 2);
  }
  float A(int64_t i, int64_t q) const { return ta ? a[size_t(q * lda + i)] : a[size_t(i * lda + q)]; }
  float B(int64_t q, int64_t j) const { return tb ? b[size_t(j * ldb + q)] : b[size_t(q * ldb + j)]; }
  std::vector<float> run(const Bf16KernelTable& kt, float alpha, float beta) const {
    std::vector<float> c = c0;
    gemm_detail::packed_sbgemm(kt, ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
    return c;
  }
};

float flush(float x) { return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x; }

// C = op(A) op(B) (alpha 1, beta 0) as the definition of `kt` sums it, one element at a time:
// k in blocks of kt.kc; in a block, pairs (2p, 2p + 1) in turn, VDPBF16PS odd then even,
// TDPBF16PS even then odd, each step acc = acc + x * y rounded once (the product is exact); each
// block's sum added to C.
float definition_element(const Problem& p, const Bf16KernelTable& kt, int64_t i, int64_t j) {
  const bool odd_first = kt.k_step == 1;
  float c = 0.0f;
  for (int64_t p0 = 0; p0 < p.k; p0 += kt.kc) {
    const int64_t kb = std::min(kt.kc, p.k - p0);
    float acc = 0.0f;
    for (int64_t q = 0; q < kb; q += 2) {
      const float even = p.A(i, p0 + q) * p.B(p0 + q, j);
      const float odd = q + 1 < kb ? p.A(i, p0 + q + 1) * p.B(p0 + q + 1, j) : 0.0f;
      acc = flush(acc + (odd_first ? odd : even));
      acc = flush(acc + (odd_first ? even : odd));
    }
    c = p0 == 0 ? acc : c + acc;
  }
  return c;
}

void check_against_float64(const Problem& p, const std::vector<float>& c, float alpha, float beta,
                           const std::string& what) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double prod = double(p.A(i, q)) * double(p.B(q, j));
        sum += prod;
        magnitude += std::fabs(prod);
      }
      const double c0 = p.c0[size_t(i * p.ldc + j)];
      const double ref = double(alpha) * sum + (beta == 0.0f ? 0.0 : double(beta) * c0);
      const double bound = 2.0 * double(p.k + 2) * std::numeric_limits<float>::epsilon() *
                               (std::fabs(alpha) * magnitude + (beta == 0.0f ? 0.0 : std::fabs(beta * c0))) +
                           1e-30;
      const double err = std::fabs(double(c[size_t(i * p.ldc + j)]) - ref);
      if (!(err <= bound))
        FAIL(what << ": C[" << i << "," << j << "] = " << c[size_t(i * p.ldc + j)] << ", float64 " << ref << ", error "
                  << err << " above " << bound);
    }
    for (int64_t j = p.n; j < p.ldc; ++j) REQUIRE(c[size_t(i * p.ldc + j)] == p.c0[size_t(i * p.ldc + j)]);
  }
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }

}  // namespace

TEST_CASE("the bf16 kernels' definitions give a scalar loop's bits across blocking edges and layouts",
          "[gemm][bf16][exact]") {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma)) {
    WARN("no AVX2 + FMA on this CPU: the definitions' kernels are compiled for it; skipped");
    return;
  }
  for (const Bf16KernelTable* kt : {&gemm_detail::kAvx512Bf16Emulated, &gemm_detail::kAmxEmulated}) {
    // Shapes around the block (mr, nr), an odd k, k across kc, rows across mc.
    const int64_t ms[] = {1, kt->mr - 1, kt->mr + 3, kt->mc + 5};
    const int64_t ns[] = {1, kt->nr + 1, 2 * kt->nr - 3};
    const int64_t ks[] = {1, 7, 2 * kt->k_step * 2 + 3, kt->kc + 33};
    uint32_t seed = 10;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t m : ms)
          for (int64_t n : ns)
            for (int64_t k : ks) {
              if (m * n * k > 400000) continue;
              const Problem p(ta, tb, m, n, k, 3, seed++);
              const std::vector<float> c = p.run(*kt, 1.0f, 0.0f);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  const float want = definition_element(p, *kt, i, j), got = c[size_t(i * p.ldc + j)];
                  if (!same_bits(got, want))
                    FAIL(kt->name << " ta " << ta << " tb " << tb << " " << m << "x" << n << "x" << k << ": C[" << i
                                  << "," << j << "] = " << got << ", the definition's loop " << want);
                }
            }
  }
}

TEST_CASE("every bf16 kernel agrees with float64 on bf16 operands, with alpha, beta and NaN in C",
          "[gemm][bf16][exact]") {
  const std::vector<Named> tables = runnable_tables();
  if (tables.empty()) {
    WARN("no bf16 kernel this CPU can run (the definitions need AVX2 + FMA); skipped");
    return;
  }
  for (const Named& t : tables) {
    const Bf16KernelTable& kt = *t.table;
    uint32_t seed = 100;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const auto& [m, n, k] :
             {std::array<int64_t, 3>{kt.mr + 5, kt.nr + 7, kt.kc + 17}, std::array<int64_t, 3>{3, 2 * kt.nr + 1, 45}}) {
          const Problem p(ta, tb, m, n, k, 2, seed++);
          check_against_float64(p, p.run(kt, 1.0f, 0.0f), 1.0f, 0.0f, t.name);
          check_against_float64(p, p.run(kt, -0.5f, 1.5f), -0.5f, 1.5f, t.name + " alpha -0.5 beta 1.5");
          Problem nan_c = p;
          for (float& x : nan_c.c0) x = std::numeric_limits<float>::quiet_NaN();
          std::vector<float> c = nan_c.run(kt, 2.0f, 0.0f);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) REQUIRE(std::isfinite(c[size_t(i * p.ldc + j)]));
        }
  }
}

TEST_CASE("bf16 kernels: bits independent of threads and of the other rows", "[gemm][bf16][exact]") {
  const std::vector<Named> tables = runnable_tables();
  if (tables.empty()) {
    WARN("no bf16 kernel this CPU can run; skipped");
    return;
  }
  const int threads_before = omp_get_max_threads();
  for (const Named& t : tables) {
    const Bf16KernelTable& kt = *t.table;
    const Problem p(false, true, 8 * kt.mr + 5, 2 * kt.nr + 9, kt.kc + 41, 0, 7);  // big enough to split
    omp_set_num_threads(1);
    const std::vector<float> one = p.run(kt, 1.0f, 0.0f);
    omp_set_num_threads(2);
    const std::vector<float> two = p.run(kt, 1.0f, 0.0f);
    omp_set_num_threads(threads_before);
    REQUIRE(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)) == 0);
    // Row 17 alone: a 1-row product (the block's padding rows are zeros instead of other rows).
    Problem row = p;
    row.m = 1;
    row.a.assign(p.a.begin() + 17 * p.lda, p.a.begin() + 18 * p.lda);
    row.c0.assign(p.c0.begin() + 17 * p.ldc, p.c0.begin() + 18 * p.ldc);
    const std::vector<float> alone = row.run(kt, 1.0f, 0.0f);
    INFO(t.name);
    REQUIRE(std::memcmp(alone.data(), one.data() + 17 * p.ldc, size_t(p.n) * sizeof(float)) == 0);
  }
}

TEST_CASE("the units' bf16 kernels against their definitions", "[gemm][bf16]") {
  const CpuFeatures& f = cpu_features();
  bool ran = false;
  for (const auto& [kernel, unit, definition] :
       {std::tuple{Bf16Kernel::avx512_bf16, &gemm_detail::kAvx512Bf16Kernel, &gemm_detail::kAvx512Bf16Emulated},
        std::tuple{Bf16Kernel::amx, &gemm_detail::kAmxKernel, &gemm_detail::kAmxEmulated}}) {
    if (!bf16_kernel_supported(kernel) || !(f.avx2 && f.fma)) continue;
    ran = true;
    const Problem p(false, true, unit->mr + 3, unit->nr + 5, unit->kc + 19, 0, 3);
    const std::vector<float> u = p.run(*unit, 1.0f, 0.0f), d = p.run(*definition, 1.0f, 0.0f);
    size_t differ = 0;
    for (size_t i = 0; i < u.size(); ++i) differ += !same_bits(u[i], d[i]);
    // Both are checked against float64 above; equal bits confirm the definition's order.
    if (differ) WARN(unit->name << ": " << differ << " of " << u.size() << " elements differ from the definition");
    else SUCCEED(unit->name << " gives its definition's bits");
  }
  if (!ran) WARN("this CPU has no AVX512-BF16 or AMX-BF16 (or the OS refused AMX): the units' kernels are not run");
}

TEST_CASE("the bf16 GEMM dispatch: names, refusals and what runs here", "[gemm][bf16][exact]") {
  for (Bf16Kernel k : {Bf16Kernel::automatic, Bf16Kernel::emulated, Bf16Kernel::avx512_bf16, Bf16Kernel::amx})
    REQUIRE(parse_bf16_kernel(bf16_kernel_name(k), "x") == k);
  REQUIRE_THROWS_WITH(parse_bf16_kernel("bf16", "QKV_GEMM_BF16"),
                      Catch::Contains("QKV_GEMM_BF16") && Catch::Contains("'bf16'"));
  const CpuFeatures& f = cpu_features();
  const Bf16Kernel active = active_bf16_kernel();
  if (requested_bf16_kernel() == Bf16Kernel::automatic) {
    if (bf16_kernel_supported(Bf16Kernel::amx)) REQUIRE(active == Bf16Kernel::amx);
    else if (f.avx512_bf16) REQUIRE(active == Bf16Kernel::avx512_bf16);
    else REQUIRE(active == Bf16Kernel::emulated);
  }
  REQUIRE(bf16_kernel_reason().rfind(bf16_kernel_name(active), 0) == 0);
  if (!f.avx512_bf16) {
    REQUIRE_FALSE(bf16_kernel_supported(Bf16Kernel::avx512_bf16));
    REQUIRE_THROWS_WITH(set_bf16_kernel(Bf16Kernel::avx512_bf16), Catch::Contains("cannot run on this CPU"));
  }
  if (!f.amx_bf16) REQUIRE_THROWS_WITH(set_bf16_kernel(Bf16Kernel::amx), Catch::Contains("amx"));
  // emulated is the float32 GEMM itself: bits equal to sgemm on the same operands.
  const Problem p(false, true, 13, 21, 70, 0, 5);
  std::vector<float> want = p.c0, got = p.c0;
  sgemm(false, true, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f, want.data(), p.ldc);
  sbgemm_with(Bf16Kernel::emulated, false, true, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f,
              got.data(), p.ldc);
  REQUIRE(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
  {
    Bf16KernelGuard guard(Bf16Kernel::emulated);
    REQUIRE(active_bf16_kernel() == Bf16Kernel::emulated);
  }
  REQUIRE((requested_bf16_kernel() != Bf16Kernel::emulated || active == Bf16Kernel::emulated));
}

TEST_CASE("bf16 packing reads values below bf16's normal range as zero, as the units do", "[gemm][bf16][exact]") {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma)) {
    WARN("no AVX2 + FMA: skipped");
    return;
  }
  Problem p(false, false, 4, 5, 6, 0, 9);
  Problem zeroed = p;
  p.a[3] = 1e-39f;  // a float32 denormal: bf16 keeps it as a denormal, the units read zero
  zeroed.a[3] = 0.0f;
  for (const Bf16KernelTable* kt : {&gemm_detail::kAvx512Bf16Emulated, &gemm_detail::kAmxEmulated}) {
    const std::vector<float> x = p.run(*kt, 1.0f, 0.0f), y = zeroed.run(*kt, 1.0f, 0.0f);
    REQUIRE(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
}

// ---- the invariant bf16 product (invariant_sbgemm_nt): the float32 chain's bits on the units ----

namespace {

// The chain of tensor/cpu/invariant_matmul.h written out: y = fma over k = 0..K-1 from +0, then + bias.
std::vector<float> chain_reference(const std::vector<float>& x, int64_t ldx, const std::vector<float>& w, int64_t ldw,
                                   const float* bias, int64_t m, int64_t n, int64_t k, int64_t ldy) {
  std::vector<float> y(size_t(m * ldy), -7.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t q = 0; q < k; ++q) acc = std::fma(x[size_t(i * ldx + q)], w[size_t(j * ldw + q)], acc);
      y[size_t(i * ldy + j)] = bias ? acc + bias[j] : acc;
    }
  return y;
}

std::vector<float> pair_product(const Bf16KernelTable& kt, const std::vector<float>& x, int64_t ldx,
                                const std::vector<float>& w, int64_t ldw, const float* bias, int64_t m, int64_t n,
                                int64_t k, int64_t ldy) {
  std::vector<float> y(size_t(m * ldy), -7.0f);
  gemm_detail::invariant_pair_product(kt, x.data(), ldx, w.data(), ldw, bias, y.data(), ldy, m, n, k);
  return y;
}

// The dot-pair tables that run here: the unit's definition (AVX2), the unit where the CPU has it.
std::vector<Named> pair_tables() {
  std::vector<Named> out;
  for (const Named& t : runnable_tables())
    if (t.table->k_step == 1) out.push_back(t);
  return out;
}

// Counts the elements whose bits differ (NaN equal to NaN).
int64_t differing(const std::vector<float>& got, const std::vector<float>& want) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], want[i]) && !(std::isnan(got[i]) && std::isnan(want[i]))) ++bad;
  return bad;
}

}  // namespace

TEST_CASE("the invariant bf16 product gives the float32 chain's bits across edges and blocks",
          "[gemm][bf16][invariant][exact]") {
  const auto tables = pair_tables();
  if (tables.empty()) {
    WARN("no dot-pair kernel runs here (the definitions need AVX2 + FMA); skipped");
    return;
  }
  for (const Named& t : tables) {
    const int mr = t.table->mr, nr = t.table->nr;
    for (const int64_t m : {int64_t(1), int64_t(mr - 1), int64_t(mr), int64_t(mr + 1), int64_t(3 * mr + 5)})
      for (const int64_t n : {int64_t(1), int64_t(nr - 1), int64_t(nr + 1), int64_t(2 * nr + 7)})
        for (const int64_t k : {0, 1, 2, 15, 16, 17, 31, 33, 100}) {
          const int64_t ldx = k + 3, ldw = k + 1, ldy = n + 2;
          const uint32_t seed = uint32_t(m * 1000003 + n * 1009 + k);
          // Values of several binades (the chain rounds at many points), bf16 throughout.
          std::vector<float> x = bf16_values(size_t(m * ldx), seed), w = bf16_values(size_t(n * ldw), seed + 1);
          for (size_t i = 0; i < x.size(); i += 3) x[i] = round_bf16(x[i] * 37.0f);
          for (size_t i = 0; i < w.size(); i += 5) w[i] = round_bf16(w[i] * 1e-3f);
          const std::vector<float> bias = bf16_values(size_t(n), seed + 2);
          for (const bool with_bias : {false, true}) {
            const float* b = with_bias ? bias.data() : nullptr;
            CAPTURE(t.name, m, n, k, with_bias);
            const auto want = chain_reference(x, ldx, w, ldw, b, m, n, k, ldy);
            CHECK(differing(pair_product(*t.table, x, ldx, w, ldw, b, m, n, k, ldy), want) == 0);
          }
        }
  }
}

TEST_CASE("the invariant bf16 product keeps the chain's bits where the unit would flush or overflow, and rounds",
          "[gemm][bf16][invariant][exact]") {
  const auto tables = pair_tables();
  if (tables.empty()) {
    WARN("no dot-pair kernel runs here (the definitions need AVX2 + FMA); skipped");
    return;
  }
  const int64_t m = 30, n = 70, k = 40;
  std::vector<float> x = bf16_values(size_t(m * k), 11), w = bf16_values(size_t(n * k), 12);
  // Row 13 and column 40: products of 2^-70 x 2^-70 = 2^-140, below float32's normal range: the
  // chain keeps them (subnormal results), the unit would flush them to zero.
  for (int64_t q = 0; q < k; ++q) {
    x[size_t(13 * k + q)] = std::ldexp(1.0f + float(q % 4) / 8, -70) * (q % 2 ? -1.0f : 1.0f);
    w[size_t(40 * k + q)] = std::ldexp(1.0f + float(q % 3) / 4, -70);
  }
  x[size_t(27 * k + 3)] = std::ldexp(1.0f, -130);  // a subnormal input (the unit reads it as zero)
  w[size_t(5 * k + 7)] = std::ldexp(1.5f, 100);    // with x[2] = 2^40, a product past float32's range
  x[size_t(2 * k + 7)] = std::ldexp(1.0f, 40);
  x[size_t(20 * k + 1)] = std::numeric_limits<float>::infinity();
  w[size_t(60 * k + 2)] = std::numeric_limits<float>::quiet_NaN();
  x[size_t(25 * k + 9)] = 0.1f;  // not a bf16 value: read rounded to bf16
  std::vector<float> xr(x), wr(w);
  for (float& v : xr) v = round_bf16(v);
  for (float& v : wr) v = round_bf16(v);
  CHECK(xr[size_t(25 * k + 9)] != 0.1f);
  const auto want = chain_reference(xr, k, wr, k, nullptr, m, n, k, n);
  // The regime is reached: the chain leaves subnormal results, which a flushing sum cannot.
  CHECK(std::fpclassify(want[size_t(13 * n + 40)]) == FP_SUBNORMAL);
  CHECK(std::isinf(want[size_t(2 * n + 5)]));
  for (const Named& t : tables) {
    CAPTURE(t.name);
    CHECK(differing(pair_product(*t.table, x, k, w, k, nullptr, m, n, k, n), want) == 0);
  }
}

TEST_CASE("invariant_sbgemm_nt: bits independent of threads and of the other rows", "[gemm][bf16][invariant][exact]") {
  if (!invariant_bf16_on_units()) {
    WARN("the invariant bf16 product runs on the units only (" << bf16_kernel_reason() << "); skipped");
    return;
  }
  const int64_t m = 77, n = 300, k = 384;
  const std::vector<float> x = bf16_values(size_t(m * k), 21), w = bf16_values(size_t(n * k), 22),
                           bias = bf16_values(size_t(n), 23);
  const auto want = chain_reference(x, k, w, k, bias.data(), m, n, k, n);
  for (const int threads : {1, 2, 3}) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> all(size_t(m * n));
    std::vector<float> one(static_cast<size_t>(n));
    invariant_sbgemm_nt(x.data(), k, w.data(), k, bias.data(), all.data(), n, m, n, k);
    CHECK(differing(all, want) == 0);
    for (const int64_t r : {int64_t(0), int64_t(40), m - 1}) {
      invariant_sbgemm_nt(x.data() + r * k, k, w.data(), k, bias.data(), one.data(), n, 1, n, k);
      CHECK(differing(one, std::vector<float>(want.begin() + r * n, want.begin() + (r + 1) * n)) == 0);
    }
    omp_set_num_threads(saved);
  }
}
