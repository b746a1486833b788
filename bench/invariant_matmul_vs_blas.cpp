// The batch-invariant linear forward (tensor/cpu/invariant_matmul.h) against cblas_sgemm and
// qkv::linear (what nn::Linear runs today: BLAS, or qkv's own GEMV at M = 1) on the model's Linear
// shapes, y [M, N] = x [M, K] · W [N, K]^T, in the same run on the same buffers, at 1 and 2 threads.
// Each figure is the median GFLOP/s of `repeats` samples of at least ~20 ms, the sides alternating
// so drift hits all alike. "inv" packs W per call (what a training step pays), "inv packed" reads a
// weight packed once by pack_weight (what a decode loop with a cached packing pays). At M = 1 the
// product streams W once: GB/s = 4 N K bytes / time.
//   qkv_bench_invariant [repeats=5] [max_threads=2] [max_m=3072]   (rows M of 1, 8, 768, 3072 up to max_m)
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "bench/bench_args.h"
#include "tensor/cpu/invariant_matmul.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `run`, over a batch of calls lasting at least ~20 ms.
double seconds_per_call(const std::function<void()>& run) {
  for (int calls = 1;; calls *= 2) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 20e-3 || calls >= 1 << 16) return s / calls;
  }
}

// GB/s of one thread reading `bytes` (integer sums, which the compiler vectorises freely): the bound
// for a matrix-vector product streaming a matrix of that size. Median of 5 passes after a warm one.
double read_bandwidth(int64_t bytes) {
  std::vector<uint32_t> buf(static_cast<size_t>(bytes / 4), 1u);
  uint32_t sink = 0;
  std::vector<double> gbs;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    uint32_t sum = 0;
    for (uint32_t v : buf) sum += v;
    sink += sum;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gbs.push_back(bytes / s / 1e9);
  }
  if (sink == 42) std::printf(" ");  // keeps the sums
  return median(gbs);
}

struct LinearShape {
  const char* what;
  int k, n;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<long long> args =
      qkv::bench::positional_or_exit(argc, argv, "qkv_bench_invariant [repeats=5] [max_threads=2] [max_m=3072]",
                                     {{"repeats", 5, 1000}, {"max_threads", 2, 256}, {"max_m", 3072, 1 << 20}});
  const int repeats = static_cast<int>(args[0]), max_threads = static_cast<int>(args[1]);
  const int max_m = static_cast<int>(args[2]);
  const std::vector<LinearShape> shapes = {
      {"gpt2 qkv", 768, 2304},      {"gpt2 proj", 768, 768}, {"gpt2 fc", 768, 3072}, {"gpt2 fc-proj", 3072, 768},
      {"gpt2 lm head", 768, 50257}, {"e384 qkv", 384, 1152}, {"e384 fc", 384, 1536}, {"e384 fc-proj", 1536, 384},
      {"e128 qkv", 128, 384},       {"e128 proj", 128, 128}, {"e128 fc", 128, 512},  {"e128 fc-proj", 512, 128},
  };
  std::printf("BLAS kernel %s; GFLOP/s, medians of %d; ratio = inv / cblas_sgemm\n", openblas_get_corename(), repeats);
  std::printf(
      "one thread reads %.1f GB/s from a 7 MiB buffer (the size of gpt2 qkv's W) and %.1f GB/s from 154 MiB "
      "(the LM head's)\n",
      read_bandwidth(int64_t(7) << 20), read_bandwidth(int64_t(154) << 20));
  std::printf("%-13s %5s %6s %5s %3s | %8s %8s %8s %10s | %6s %6s | %s\n", "shape", "K", "N", "M", "thr", "sgemm",
              "linear", "inv", "inv packed", "ratio", "packed", "GB/s at M=1 (sgemm, linear, inv, packed)");
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const LinearShape& s : shapes) {
    const int k = s.k, n = s.n;
    std::vector<float> w(static_cast<size_t>(n) * k);
    for (float& f : w) f = dist(gen) * 0.03f;
    const cpu::PackedWeight packed = cpu::pack_weight(w.data(), k, n, k);
    const Tensor wt = Tensor::empty({n, k});
    std::copy(w.begin(), w.end(), wt.data<float>());
    for (int m : {1, 8, 12 * 64, 12 * 256}) {
      if (m > max_m) continue;
      if (n > 10000 && m > 12 * 64) continue;  // the LM head at M = 3072: 237 GFLOP a call
      std::vector<float> x(static_cast<size_t>(m) * k), y(static_cast<size_t>(m) * n);
      for (float& f : x) f = dist(gen);
      const Tensor xt = Tensor::empty({m, k});
      std::copy(x.begin(), x.end(), xt.data<float>());
      for (int threads = 1; threads <= max_threads; threads *= 2) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
        const std::function<void()> sides[4] = {
            [&] {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f,
                          y.data(), n);
            },
            [&] { const Tensor out = linear(xt, wt, Tensor()); },
            [&] { cpu::invariant_linear(x.data(), k, w.data(), k, nullptr, y.data(), n, m, n, k); },
            [&] { cpu::invariant_linear(x.data(), k, packed, nullptr, y.data(), n, m); },
        };
        for (const auto& side : sides) side();  // warm caches, threads and the allocator
        std::vector<double> secs[4];
        for (int r = 0; r < repeats; ++r)
          for (int i = 0; i < 4; ++i) {
            const int side = r % 2 ? 3 - i : i;
            secs[side].push_back(seconds_per_call(sides[side]));
          }
        double t[4], gf[4];
        for (int i = 0; i < 4; ++i) t[i] = median(secs[i]), gf[i] = 2.0 * m * n * k / t[i] / 1e9;
        std::printf("%-13s %5d %6d %5d %3d | %8.1f %8.1f %8.1f %10.1f | %6.2f %6.2f |", s.what, k, n, m, threads, gf[0],
                    gf[1], gf[2], gf[3], gf[2] / gf[0], gf[3] / gf[0]);
        if (m == 1)
          for (int i = 0; i < 4; ++i) std::printf(" %6.1f", 4.0 * n * k / t[i] / 1e9);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
