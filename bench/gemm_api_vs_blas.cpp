// qkv::matmul against cblas_sgemm called directly, in the same process on the same buffers: the
// price of our front end (checks, views, allocation from the caching allocator, dispatch).
// Repeats alternate between the two so drift (clock, thermal, neighbours) hits both alike; the
// figures reported are each side's median GFLOP/s, the overhead of the API in percent from those
// medians, and the median of the per-pair overheads (each API run against the direct run next to
// it, which cancels slow drift best on a shared machine).
//   qkv_bench_gemm [n=1024] [repeats=30]   (threads: OMP_NUM_THREADS)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/bench_args.h"
#include "tensor/ops.h"

using namespace qkv;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) {
  const std::vector<long long> args = qkv::bench::positional_or_exit(argc, argv, "qkv_bench_gemm [n=1024] [repeats=30]",
                                                                     {{"n", 1024, 16384}, {"repeats", 30, 10000}});
  const int n = static_cast<int>(args[0]);
  const int repeats = static_cast<int>(args[1]);
  const Tensor a = randn({n, n}, 1), b = randn({n, n}, 2);
  Tensor c_direct = Tensor::empty({n, n});
  const double flop = 2.0 * n * n * n;
  using clock = std::chrono::steady_clock;

  auto run_direct = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                c_direct.data<float>(), n);
  };
  Tensor c_api;
  auto run_api = [&] { c_api = matmul(a, b); };

  for (int w = 0; w < 3; ++w) {  // warm up BLAS threads, caches and the allocator's free list
    run_direct();
    run_api();
  }
  std::vector<double> g_direct, g_api;
  for (int r = 0; r < repeats; ++r) {
    for (int side = 0; side < 2; ++side) {
      const bool api_first = r % 2 == 0;
      const bool api = (side == 0) == api_first;
      const auto t0 = clock::now();
      api ? run_api() : run_direct();
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      (api ? g_api : g_direct).push_back(flop / s / 1e9);
    }
  }
  std::vector<double> pair_overhead;
  for (int r = 0; r < repeats; ++r) pair_overhead.push_back(100.0 * (g_direct[r] - g_api[r]) / g_direct[r]);
  const double md = median(g_direct), ma = median(g_api);
  const double diff = max_abs_diff(c_api, c_direct);
  std::printf("sgemm %dx%dx%d, %d threads, %d repeats each (alternating)\n", n, n, n, omp_get_max_threads(), repeats);
  std::printf("  cblas_sgemm direct : %7.1f GFLOP/s (median)\n", md);
  std::printf("  qkv::matmul        : %7.1f GFLOP/s (median)\n", ma);
  std::printf("  overhead           : %+6.2f %% of the medians, %+6.2f %% median of pairs (max |difference| %.3g)\n",
              100.0 * (md - ma) / md, median(pair_overhead), diff);
  return diff == 0.0 ? 0 : 1;
}
