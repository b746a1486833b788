// One step = out = attention(q, k, v) then backward(out, g); q, k, v, g ~ N(0, 1), float32.
// Time: median over the timed steps. Memory: allocator peak minus bytes in use before the step
// (so it counts S/P for the reference, O/lse/scratch for the fused kernel, and the gradients).
#include "attention/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "autograd/engine.h"
#include "tensor/ops.h"

namespace qkv::attn {

std::vector<AttentionBenchResult> bench_attention(const AttentionBenchOptions& opt) {
  const int prev_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(1, opt.threads));
  std::vector<AttentionBenchResult> results;
  try {
    for (Kernel kernel : opt.kernels)
      for (int64_t n : opt.ns)
        for (int64_t hkv : opt.hkvs) {
          if (kernel == Kernel::reference && n > opt.reference_max_n) continue;
          const int64_t B = opt.batch, H = opt.heads, D = opt.head_dim;
          Tensor q = randn({B, H, n, D}, 1), k = randn({B, hkv, n, D}, 2), v = randn({B, hkv, n, D}, 3);
          const Tensor g = randn({B, H, n, D}, 4);
          q.set_requires_grad(true);
          k.set_requires_grad(true);
          v.set_requires_grad(true);
          AttentionOptions o;
          o.causal = opt.causal;
          o.kernel = kernel;
          auto step = [&] {
            Tensor out = attention(q, k, v, o);
            autograd::backward(out, g);
            autograd::zero_grad({q, k, v});
          };
          step();  // warm-up: fills the caching allocator and BLAS buffers
          const int reps = opt.repeats > 0 ? opt.repeats : (n <= 1024 ? 5 : 3);
          std::vector<double> ms;
          int64_t peak = 0;
          for (int r = 0; r < reps; ++r) {
            const int64_t before = allocator_stats().bytes_in_use;
            reset_peak_bytes();
            const auto t0 = std::chrono::steady_clock::now();
            step();
            const auto t1 = std::chrono::steady_clock::now();
            peak = std::max(peak, allocator_stats().peak_bytes - before);
            ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          std::sort(ms.begin(), ms.end());
          results.push_back({kernel == Kernel::fused ? "fused" : "reference", n, hkv, ms[ms.size() / 2], peak});
        }
  } catch (...) {
    omp_set_num_threads(prev_threads);
    throw;
  }
  omp_set_num_threads(prev_threads);
  return results;
}

}  // namespace qkv::attn
