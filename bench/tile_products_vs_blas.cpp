// The fused attention kernels' hand-written tile products (attention/cpu/tile_products.h) against
// cblas_sgemm on the same shapes and buffers, one thread: the three forms (A·Bᵀ, C += A·B,
// C += Aᵀ·B) at the shapes the kernels use — a full tile (32 rows × 32 keys × D), the strided
// walk's band tile (8 rows × l + 7 keys × D) and a 64×64 tile for reference. Runs alternate
// between the two sides so drift hits both alike; each figure is the median GFLOP/s of `repeats`
// timed batches. OPENBLAS_CORETYPE picks OpenBLAS's kernel (the line names the one in use).
//   qkv_bench_tiles [D=64] [repeats=15]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "attention/cpu/tile_products.h"
#include "bench/bench_args.h"

using namespace qkv::attn;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GFLOP/s of `run` (flops per call), timed over batches of ~2 ms.
double rate(const std::function<void()>& run, double flops) {
  int calls = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 2e-3) return flops * calls / s / 1e9;
    calls *= 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<long long> args = qkv::bench::positional_or_exit(argc, argv, "qkv_bench_tiles [D=64] [repeats=15]",
                                                                     {{"D", 64, 1024}, {"repeats", 15, 10000}});
  const int D = static_cast<int>(args[0]);
  const int repeats = static_cast<int>(args[1]);
  openblas_set_num_threads(1);
  std::printf("BLAS kernel %s, 1 thread, D = %d; GFLOP/s, medians of %d\n", openblas_get_corename(), D, repeats);
  std::printf("%-28s %10s %10s %8s\n", "product (rows x keys x D)", "hand", "OpenBLAS", "ratio");
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  struct Shape {
    const char* name;
    int rows, keys;
  };
  for (const Shape sh : {Shape{"full tile", 32, 32}, Shape{"64x64 tile", 64, 64}, Shape{"strided band, l=64", 8, 71},
                         Shape{"strided band, backward, l=64", 16, 79}, Shape{"strided band, l=128", 8, 135},
                         Shape{"residue group, first", 8, 7}, Shape{"residue group, second", 8, 15},
                         Shape{"residue group, median", 8, 31}, Shape{"residue group, last", 8, 63}}) {
    const int m = sh.rows, n = sh.keys, ld = 256;
    std::vector<float> q(m * D), k(n * D), v(n * D), s(m * ld), o(m * D), dv(n * D);
    for (auto* buf : {&q, &k, &v, &s, &o, &dv})
      for (float& x : *buf) x = u(gen);
    const double f_qk = 2.0 * m * n * D;
    struct Form {
      const char* what;
      std::function<void()> hand, blas;
    };
    const Form forms[] = {
        {"S = Q.K^T", [&] { tile::nt(m, n, D, 0.125f, q.data(), D, k.data(), D, s.data(), ld); },
         [&] {
           cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, D, 0.125f, q.data(), D, k.data(), D, 0.0f,
                       s.data(), ld);
         }},
        {"O += P.V", [&] { tile::add_nn(m, D, n, s.data(), ld, v.data(), D, o.data(), D); },
         [&] {
           cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, 1.0f, s.data(), ld, v.data(), D, 1.0f,
                       o.data(), D);
         }},
        {"dV += P^T.dO", [&] { tile::add_tn(n, D, m, s.data(), ld, o.data(), D, dv.data(), D); },
         [&] {
           cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1.0f, s.data(), ld, o.data(), D, 1.0f,
                       dv.data(), D);
         }},
    };
    for (const Form& f : forms) {
      std::vector<double> hand, blas;
      for (int r = 0; r < repeats; ++r) {
        hand.push_back(rate(f.hand, f_qk));
        blas.push_back(rate(f.blas, f_qk));
      }
      char label[64];
      std::snprintf(label, sizeof label, "%s %dx%d", f.what, m, n);
      std::printf("%-28s %10.1f %10.1f %7.2fx   (%s)\n", label, median(hand), median(blas), median(hand) / median(blas),
                  sh.name);
    }
  }
  return 0;
}
