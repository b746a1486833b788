// One step = out = attention(q, k, v) then backward(out, g); q, k, v, g ~ N(0, 1), float32, on the
// CPU or the GPU (each phase then ends with a device synchronisation). Time: median over the timed
// steps, for the whole step and for the forward alone. Memory: allocator peak minus bytes in use before the step
// (so it counts S/P for the reference, O/lse/scratch for the fused kernel, and the gradients).
#include "attention/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"

namespace qkv::attn {

std::vector<AttentionBenchResult> bench_attention(const AttentionBenchOptions& opt) {
  const int prev_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(1, opt.threads));
  const Device dev = opt.device;
  auto sync = [dev] {
    if (dev == Device::cuda) cuda::synchronize();
  };
  std::vector<AttentionBenchResult> results;
  try {
    const bool linear = opt.linear;
    const std::vector<Kernel> kernels = linear ? std::vector<Kernel>{Kernel::fused} : opt.kernels;
    for (Kernel kernel : kernels)
      for (int64_t D : opt.head_dims)
        for (int64_t n : opt.ns)
          for (int64_t hkv : opt.hkvs) {
            if (kernel == Kernel::reference && n > opt.reference_max_n) continue;
            const int64_t B = opt.batch, H = opt.heads;
            Tensor q = randn({B, H, n, D}, 1).to(dev), k = randn({B, hkv, n, D}, 2).to(dev),
                   v = randn({B, hkv, n, D}, 3).to(dev);
            const Tensor g = randn({B, H, n, D}, 4).to(dev);
            q.set_requires_grad(true);
            k.set_requires_grad(true);
            v.set_requires_grad(true);
            AttentionOptions o;
            o.causal = opt.causal;
            o.kernel = kernel;
            LinearAttentionOptions lo;
            lo.causal = opt.causal;
            lo.feature = opt.linear_feature;
            lo.chunk = opt.linear_chunk;
            if (lo.feature == LinearFeature::favor) lo.projection = favor_projection_for_layer(D, D, 0).to(dev);
            if (opt.pattern.sparse()) o.pattern = std::make_shared<const SparsePattern>(opt.pattern);
            double fwd_ms = 0;
            // One forward + backward under `opts` (ms); fwd_ms gets the forward's share.
            auto step_with = [&](const AttentionOptions& opts) {
              autograd::AutocastGuard autocast(opt.bf16_autocast);
              const auto t0 = std::chrono::steady_clock::now();
              Tensor out = linear ? linear_attention(q, k, v, lo) : attention(q, k, v, opts);
              sync();
              fwd_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
              autograd::backward(out, g);
              sync();
              autograd::zero_grad({q, k, v});
              return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            };
            auto step = [&] { step_with(o); };
            const auto w0 = std::chrono::steady_clock::now();
            step();  // warm-up: fills the caching allocator and BLAS buffers
            const double warm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
            // Short steps get more of them (about 10 s in all, at most 25): on a shared machine a
            // 0.4 s step meets a load spike far more often than a 6 s one, and the median needs company.
            const int base_reps = n <= 1024 ? 5 : 3;
            const int reps =
                opt.repeats > 0 ? opt.repeats
                : warm_s > 60   ? 1
                                : std::clamp(static_cast<int>(std::ceil(10.0 / std::max(warm_s, 1e-3))), base_reps, 25);
            std::vector<double> ms, fms;
            int64_t peak = 0;
            for (int r = 0; r < reps; ++r) {
              const int64_t before = allocator_stats(dev).bytes_in_use;
              reset_peak_bytes(dev);
              const auto t0 = std::chrono::steady_clock::now();
              step();
              const auto t1 = std::chrono::steady_clock::now();
              peak = std::max(peak, allocator_stats(dev).peak_bytes - before);
              ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
              fms.push_back(fwd_ms);
            }
            std::sort(ms.begin(), ms.end());
            std::sort(fms.begin(), fms.end());
            AttentionBenchResult res;
            res.kernel = std::string(linear                    ? "linear"
                                     : kernel == Kernel::fused ? "fused"
                                                               : "reference") +
                         (opt.bf16_autocast ? "/bf16" : "");
            res.n = n;
            res.hkv = hkv;
            res.head_dim = D;
            res.ms = ms[ms.size() / 2];
            res.forward_ms = fms[fms.size() / 2];
            res.peak_bytes = peak;
            const PatternStats st = pattern_stats({B, H, hkv, n, n}, o);
            res.pattern = linear ? "linear" : opt.pattern.describe();
            res.kept_pairs = st.kept_pairs;
            res.visited_tiles = linear ? 0 : st.visited_tiles;
            res.total_tiles = linear ? 0 : st.total_tiles;
            res.tile_q = linear ? 0 : st.tile_q;
            res.tile_k = linear ? 0 : st.tile_k;
            res.kept_gflops =
                14.0 * static_cast<double>(D) * static_cast<double>(st.kept_pairs) / (res.ms * 1e-3) * 1e-9;
            res.ns_per_kept_pair = res.ms * 1e6 / std::max<double>(1.0, static_cast<double>(st.kept_pairs));
            double fwd_flops = 2.0 * static_cast<double>(B * H) * static_cast<double>(n) * static_cast<double>(n) *
                               static_cast<double>(D) * (opt.causal ? 1.0 : 2.0);
            if (linear)  // per token: the chunk's Φ·Ψᵀ and A·V (c·(m + Dv)), Φ·S and the state update (2·m·Dv), m = D
              fwd_flops = 2.0 * static_cast<double>(B * H) * static_cast<double>(n) *
                          (static_cast<double>(std::min(opt.linear_chunk, n)) * 2.0 * D + 2.0 * D * D);
            res.forward_tflops = fwd_flops / (res.forward_ms * 1e-3) * 1e-12;
            res.backward_tflops = 2.5 * fwd_flops / (std::max(res.ms - res.forward_ms, 1e-9) * 1e-3) * 1e-12;
            if (opt.versus_full && !linear && o.pattern) {
              AttentionOptions full = o;
              full.pattern.reset();
              const double full_kept =
                  static_cast<double>(std::max<int64_t>(1, pattern_stats({B, H, hkv, n, n}, full).kept_pairs));
              const double pattern_kept = static_cast<double>(std::max<int64_t>(1, st.kept_pairs));
              const double full_warm_ms = step_with(full);
              res.rounds = opt.rounds > 0
                               ? opt.rounds
                               : std::clamp(static_cast<int>(std::ceil(1e4 / std::max(full_warm_ms, 1.0))), 3, 15);
              const int per_round =
                  std::clamp(static_cast<int>(std::lround(full_warm_ms / std::max(res.ms, 1e-3))), 1, 25);
              std::vector<double> full_ms, ratios;
              for (int r = 0; r < res.rounds; ++r) {
                const double f = step_with(full);
                std::vector<double> p;
                for (int i = 0; i < per_round; ++i) p.push_back(step_with(o));
                std::sort(p.begin(), p.end());
                full_ms.push_back(f);
                ratios.push_back((p[p.size() / 2] / pattern_kept) / (f / full_kept));
              }
              std::sort(full_ms.begin(), full_ms.end());
              std::sort(ratios.begin(), ratios.end());
              res.full_ms = full_ms[full_ms.size() / 2];
              res.full_ns_per_kept_pair = res.full_ms * 1e6 / full_kept;
              res.ratio_vs_full = ratios[ratios.size() / 2];
            }
            results.push_back(res);
          }
  } catch (...) {
    omp_set_num_threads(prev_threads);
    throw;
  }
  omp_set_num_threads(prev_threads);
  return results;
}

}  // namespace qkv::attn
