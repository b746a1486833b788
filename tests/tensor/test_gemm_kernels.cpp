// The GEMM room (tensor/cpu/gemm/): every kernel this CPU can execute against a float64 loop, on
// shapes that cross each blocking edge (register tile, kc, mc, nc, thread chunks) in every layout;
// the order claim of gemm.h (bits independent of threads and of the other rows and columns); the
// features read by cpuid against the kernel's /proc/cpuinfo; the dispatch's refusals.
#include <omp.h>

#include <catch2/catch.hpp>
#include <array>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cpu/gemm/kernel_table.h"
#include "tensor/error.h"

using namespace qkv;
using namespace qkv::cpu;

namespace {

struct NamedKernel {
  std::string name;
  const gemm_detail::KernelTable* table;  // nullptr: the BLAS
};

// The kernels this CPU runs: every GemmKernel it supports, and the avx512 tile compiled for AVX2.
std::vector<NamedKernel> runnable_kernels() {
  std::vector<NamedKernel> out = {{"blas", nullptr}, {"sse", &gemm_detail::kSseKernel}};
  if (gemm_kernel_supported(GemmKernel::avx2)) {
    out.push_back({"avx2", &gemm_detail::kAvx2Kernel});
    out.push_back({"avx512-layout", &gemm_detail::kAvx512LayoutOnAvx2});
  }
  if (gemm_kernel_supported(GemmKernel::avx512)) out.push_back({"avx512", &gemm_detail::kAvx512Kernel});
  return out;
}

void run(const NamedKernel& k, bool ta, bool tb, int64_t m, int64_t n, int64_t kk, float alpha, const float* a,
         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (k.table) gemm_detail::packed_sgemm(*k.table, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc);
  else sgemm_with(GemmKernel::blas, ta, tb, m, n, kk, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
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
    a = random_values(size_t((ta ? k : m) * lda), seed);
    b = random_values(size_t((tb ? n : k) * ldb), seed + 1);
    c0 = random_values(size_t(m * ldc), seed + 2);
  }
  float at(bool t, const std::vector<float>& x, int64_t ld, int64_t r, int64_t col) const {
    return t ? x[size_t(col * ld + r)] : x[size_t(r * ld + col)];
  }
};

// Checks c against alpha * op(A) op(B) + beta * c0 in float64, within float32's rounding of a
// k-term sum (the bound grows with k and with the magnitudes summed), and the padding between
// rows of C untouched.
void check_against_float64(const Problem& p, const std::vector<float>& c, float alpha, float beta,
                           const std::string& what) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t q = 0; q < p.k; ++q) {
        const double prod = double(p.at(p.ta, p.a, p.lda, i, q)) * double(p.at(p.tb, p.b, p.ldb, q, j));
        sum += prod;
        magnitude += std::fabs(prod);
      }
      const double c0 = p.c0[size_t(i * p.ldc + j)];
      const double ref = double(alpha) * sum + (beta == 0.0f ? 0.0 : double(beta) * c0);
      const double bound = 2.0 * double(p.k + 2) * std::numeric_limits<float>::epsilon() *
                               (std::fabs(alpha) * magnitude + (beta == 0.0f ? 0.0 : std::fabs(beta * c0))) +
                           1e-30;
      const double err = std::fabs(double(c[size_t(i * p.ldc + j)]) - ref);
      if (!(err <= bound)) {
        FAIL(what << ": C[" << i << "," << j << "] = " << c[size_t(i * p.ldc + j)] << ", float64 " << ref << ", error "
                  << err << " above " << bound);
      }
    }
    for (int64_t j = p.n; j < p.ldc; ++j)
      REQUIRE(c[size_t(i * p.ldc + j)] == p.c0[size_t(i * p.ldc + j)]);  // padding untouched
  }
}

}  // namespace

TEST_CASE("every GEMM kernel agrees with float64 across blocking edges and layouts", "[gemm][exact]") {
  // Shapes: below one tile; tile edges (mr 6/12, nr 8/16/32); k past kc (256) with a ragged last
  // block; m past mc (96..192); n past nc is in the [slow] case below.
  const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {13, 37, 300}, {67, 45, 513}, {200, 33, 17}, {7, 130, 260}};
  for (const NamedKernel& kernel : runnable_kernels()) {
    int problem = 0;
    for (const auto& s : shapes)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t pad = (problem % 3) * 5;
        Problem p(ta, tb, s[0], s[1], s[2], pad, uint32_t(100 + problem++));
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, -0.75f}}) {
          std::vector<float> c = p.c0;
          if (beta == 0.0f)  // beta == 0 must not read C: NaN there must not come out
            for (int64_t i = 0; i < p.m; ++i)
              for (int64_t j = 0; j < p.n; ++j) c[size_t(i * p.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
          run(kernel, ta, tb, p.m, p.n, p.k, alpha, p.a.data(), p.lda, p.b.data(), p.ldb, beta, c.data(), p.ldc);
          std::ostringstream what;
          what << kernel.name << " ta=" << ta << " tb=" << tb << " m=" << p.m << " n=" << p.n << " k=" << p.k
               << " alpha=" << alpha << " beta=" << beta;
          check_against_float64(p, c, alpha, beta, what.str());
        }
      }
  }
}

TEST_CASE("GEMM kernels across the nc block and thread chunks", "[gemm][slow]") {
  for (const NamedKernel& kernel : runnable_kernels()) {
    if (!kernel.table) continue;
    Problem p(false, true, 20, 3100, 40, 3, 7);  // n past every kernel's nc (3072)
    std::vector<float> c = p.c0;
    run(kernel, p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f, c.data(), p.ldc);
    check_against_float64(p, c, 1.0f, 0.0f, kernel.name + " n past nc");
  }
}

// gemm.h: each element's sum runs k in one order fixed by k and the kernel, so an element is the
// same bits whatever the thread count, and whatever other rows and columns share the product.
TEST_CASE("qkv's GEMM kernels: bits independent of threads and of the other rows and columns", "[gemm][exact]") {
  const int saved = omp_get_max_threads();
  for (const NamedKernel& kernel : runnable_kernels()) {
    if (!kernel.table) continue;
    for (const auto& s : {std::array<int64_t, 3>{300, 90, 270}, std::array<int64_t, 3>{70, 400, 300}}) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        Problem p(ta, tb, s[0], s[1], s[2], 0, 11);  // above the split threshold: 2 threads take a chunk each
        auto product = [&](int threads) {
          omp_set_num_threads(threads);
          std::vector<float> c(p.c0.size());
          run(kernel, ta, tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f, c.data(), p.ldc);
          return c;
        };
        const std::vector<float> one = product(1), two = product(2);
        CHECK(one == two);
        // Row 37 alone (m = 1) and columns 19..19+n' alone (a B that holds only them).
        std::vector<float> row(size_t(p.n));
        const float* a_row = ta ? p.a.data() + 37 : p.a.data() + 37 * p.lda;
        run(kernel, ta, tb, 1, p.n, p.k, 1.0f, a_row, p.lda, p.b.data(), p.ldb, 0.0f, row.data(), p.n);
        for (int64_t j = 0; j < p.n; ++j) REQUIRE(row[size_t(j)] == one[size_t(37 * p.ldc + j)]);
        const int64_t j0 = 19, nj = 23;
        std::vector<float> cols(size_t(p.m * nj));
        const float* b_cols = tb ? p.b.data() + j0 * p.ldb : p.b.data() + j0;
        run(kernel, ta, tb, p.m, nj, p.k, 1.0f, p.a.data(), p.lda, b_cols, p.ldb, 0.0f, cols.data(), nj);
        for (int64_t i = 0; i < p.m; ++i)
          for (int64_t j = 0; j < nj; ++j) REQUIRE(cols[size_t(i * nj + j)] == one[size_t(i * p.ldc + j0 + j)]);
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST_CASE("the avx512 tile compiled for AVX2 gives the avx512 kernel's bits", "[gemm][exact]") {
  if (!gemm_kernel_supported(GemmKernel::avx512)) {
    WARN("this CPU has no AVX-512F: the avx512 kernel is tested through its AVX2 build only");
    return;
  }
  Problem p(false, true, 50, 70, 300, 1, 3);
  std::vector<float> x(p.c0.size()), y(p.c0.size());
  gemm_detail::packed_sgemm(gemm_detail::kAvx512Kernel, false, true, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(),
                            p.ldb, 0.0f, x.data(), p.ldc);
  gemm_detail::packed_sgemm(gemm_detail::kAvx512LayoutOnAvx2, false, true, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda,
                            p.b.data(), p.ldb, 0.0f, y.data(), p.ldc);
  CHECK(x == y);
}

// The kernel's own list (/proc/cpuinfo's flags line) is an independent reading of the same bits:
// what cpuid + xgetbv report must be exactly what the kernel reports.
TEST_CASE("the CPU features read by cpuid match /proc/cpuinfo", "[gemm]") {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1);
      break;
    }
  if (flags.empty()) {
    WARN("no /proc/cpuinfo flags line here: nothing to compare against");
    return;
  }
  std::set<std::string> listed;
  std::istringstream words(flags);
  for (std::string w; words >> w;) listed.insert(w);
  const CpuFeatures& f = cpu_features();
  const std::vector<std::string> names_read = f.names();
  const std::set<std::string> ours(names_read.begin(), names_read.end());
  // /proc/cpuinfo calls sse3 "pni".
  const std::pair<const char*, const char*> names[] = {{"sse3", "pni"},
                                                       {"ssse3", "ssse3"},
                                                       {"sse4_1", "sse4_1"},
                                                       {"sse4_2", "sse4_2"},
                                                       {"avx", "avx"},
                                                       {"avx2", "avx2"},
                                                       {"fma", "fma"},
                                                       {"f16c", "f16c"},
                                                       {"avx512f", "avx512f"},
                                                       {"avx512bw", "avx512bw"},
                                                       {"avx512dq", "avx512dq"},
                                                       {"avx512vl", "avx512vl"},
                                                       {"avx512cd", "avx512cd"},
                                                       {"avx512_vnni", "avx512_vnni"},
                                                       {"avx512_bf16", "avx512_bf16"},
                                                       {"avx512_fp16", "avx512_fp16"},
                                                       {"amx_tile", "amx_tile"},
                                                       {"amx_bf16", "amx_bf16"},
                                                       {"amx_int8", "amx_int8"}};
  for (const auto& [ours_name, kernel_name] : names) {
    INFO(ours_name);
    CHECK(ours.count(ours_name) == listed.count(kernel_name));
  }
  CHECK(!f.vendor.empty());
  WARN("CPU: " << f.brand << " (" << f.vendor << ", family " << f.family << " model " << f.model << "); GEMM kernel "
               << gemm_kernel_reason());
}

TEST_CASE("the GEMM dispatch: names, refusals and the kernel asked for", "[gemm][exact]") {
  CHECK(parse_gemm_kernel("avx2", "QKV_GEMM") == GemmKernel::avx2);
  CHECK(parse_gemm_kernel("auto", "QKV_GEMM") == GemmKernel::automatic);
  try {
    parse_gemm_kernel("avx3", "QKV_GEMM");
    FAIL("avx3 was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "[gemm] QKV_GEMM must be auto, blas, sse, avx2 or avx512, got 'avx3'");
  }
  if (!gemm_kernel_supported(GemmKernel::avx512)) {
    CHECK_THROWS_WITH(set_gemm_kernel(GemmKernel::avx512), "[gemm] the avx512 kernel cannot run on this CPU");
  }
  CHECK(active_gemm_kernel() != GemmKernel::automatic);
  // scripts/test.sh runs the [exact] cases once per kernel with QKV_GEMM and QKV_EXPECT_GEMM_KERNEL
  // set: the kernel asked for is the one the ops ran.
  if (const char* expected = std::getenv("QKV_EXPECT_GEMM_KERNEL"); expected && *expected)
    CHECK(std::string(gemm_kernel_name(active_gemm_kernel())) == expected);
  // Forcing and restoring.
  const GemmKernel before = requested_gemm_kernel();
  set_gemm_kernel(GemmKernel::sse);
  CHECK(active_gemm_kernel() == GemmKernel::sse);
  set_gemm_kernel(before);
  CHECK(requested_gemm_kernel() == before);
}
