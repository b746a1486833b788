// One step = out = attention(q, k, v) then backward(out, g); q, k, v, g ~ N(0, 1), float32, on the
// CPU or the GPU (each phase then ends with a device synchronisation). Time: median over the timed
// steps, for the whole step and for the forward alone. Memory: allocator peak minus bytes in use before the step
// (so it counts S/P for the reference, O/lse/scratch for the fused kernel, and the gradients).
#include "bench/attention_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"

namespace qkv::attn {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
T median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One (kernel, D, N, Hkv) of the benchmark: its tensors and its step.
struct BenchCase {
  const AttentionBenchOptions* opt;
  Kernel kernel;
  int64_t n, hkv, D;
  Tensor q, k, v, g;
  AttentionOptions o;
  LinearAttentionOptions lo;
  double fwd_ms = 0;  // the last step's forward

  BenchCase(const AttentionBenchOptions& opt_, Kernel kernel_, int64_t D_, int64_t n_, int64_t hkv_)
      : opt(&opt_), kernel(kernel_), n(n_), hkv(hkv_), D(D_) {
    const Device dev = opt->device;
    const int64_t B = opt->batch, H = opt->heads;
    q = randn({B, H, n, D}, 1).to(dev);
    k = randn({B, hkv, n, D}, 2).to(dev);
    v = randn({B, hkv, n, D}, 3).to(dev);
    g = randn({B, H, n, D}, 4).to(dev);
    q.set_requires_grad(true);
    k.set_requires_grad(true);
    v.set_requires_grad(true);
    o.causal = opt->causal;
    o.kernel = kernel;
    lo.causal = opt->causal;
    lo.feature = opt->linear_feature;
    lo.chunk = opt->linear_chunk;
    if (lo.feature == LinearFeature::favor) lo.projection = favor_projection_for_layer(D, D, 0).to(dev);
    if (opt->pattern.sparse()) o.pattern = std::make_shared<const SparsePattern>(opt->pattern);
  }

  void sync() const {
    if (opt->device == Device::cuda) cuda::synchronize();
  }
  // One forward + backward under `opts` (ms); fwd_ms gets the forward's share.
  double step_with(const AttentionOptions& opts) {
    autograd::AutocastGuard autocast(opt->bf16_autocast);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor out = opt->linear ? linear_attention(q, k, v, lo) : attention(q, k, v, opts);
    sync();
    fwd_ms = ms_since(t0);
    autograd::backward(out, g);
    sync();
    autograd::zero_grad({q, k, v});
    return ms_since(t0);
  }
  double step() { return step_with(o); }
  // One step (ms), raising *peak to its allocator peak above the bytes in use before it.
  double timed_step(int64_t* peak) {
    const Device dev = opt->device;
    const int64_t before = allocator_stats(dev).bytes_in_use;
    reset_peak_bytes(dev);
    const double ms = step();
    *peak = std::max(*peak, allocator_stats(dev).peak_bytes - before);
    return ms;
  }

  // The row for the timed steps' times (ms, forward fms) and allocator peak.
  AttentionBenchResult result(const std::vector<double>& ms, const std::vector<double>& fms, int64_t peak) const {
    const bool linear = opt->linear;
    const int64_t B = opt->batch, H = opt->heads;
    AttentionBenchResult res;
    res.kernel = std::string(linear                    ? "linear"
                             : kernel == Kernel::fused ? "fused"
                                                       : "reference") +
                 (opt->bf16_autocast ? "/bf16" : "");
    res.n = n;
    res.hkv = hkv;
    res.head_dim = D;
    res.ms = median(ms);
    res.forward_ms = median(fms);
    res.peak_bytes = peak;
    const PatternStats st = pattern_stats({B, H, hkv, n, n}, o);
    res.pattern = linear ? "linear" : opt->pattern.describe();
    res.kept_pairs = st.kept_pairs;
    res.visited_tiles = linear ? 0 : st.visited_tiles;
    res.total_tiles = linear ? 0 : st.total_tiles;
    res.tile_q = linear ? 0 : st.tile_q;
    res.tile_k = linear ? 0 : st.tile_k;
    res.kept_gflops = 14.0 * static_cast<double>(D) * static_cast<double>(st.kept_pairs) / (res.ms * 1e-3) * 1e-9;
    res.ns_per_kept_pair = res.ms * 1e6 / std::max<double>(1.0, static_cast<double>(st.kept_pairs));
    double fwd_flops = 2.0 * static_cast<double>(B * H) * static_cast<double>(n) * static_cast<double>(n) *
                       static_cast<double>(D) * (opt->causal ? 1.0 : 2.0);
    if (linear)  // per token: the chunk's Φ·Ψᵀ and A·V (c·(m + Dv)), Φ·S and the state update (2·m·Dv), m = D
      fwd_flops = 2.0 * static_cast<double>(B * H) * static_cast<double>(n) *
                  (static_cast<double>(std::min(opt->linear_chunk, n)) * 2.0 * D + 2.0 * D * D);
    res.forward_tflops = fwd_flops / (res.forward_ms * 1e-3) * 1e-12;
    res.backward_tflops = 2.5 * fwd_flops / (std::max(res.ms - res.forward_ms, 1e-9) * 1e-3) * 1e-12;
    return res;
  }

  // versus_full: full causal attention alternated with the pattern, round by round (bench.h).
  void versus_full(AttentionBenchResult& res) {
    const int64_t B = opt->batch, H = opt->heads;
    AttentionOptions full = o;
    full.pattern.reset();
    const double full_kept =
        static_cast<double>(std::max<int64_t>(1, pattern_stats({B, H, hkv, n, n}, full).kept_pairs));
    const double pattern_kept = static_cast<double>(std::max<int64_t>(1, res.kept_pairs));
    const double full_warm_ms = step_with(full);
    res.rounds = opt->rounds > 0 ? opt->rounds
                                 : std::clamp(static_cast<int>(std::ceil(1e4 / std::max(full_warm_ms, 1.0))), 3, 15);
    const int per_round = std::clamp(static_cast<int>(std::lround(full_warm_ms / std::max(res.ms, 1e-3))), 1, 25);
    std::vector<double> full_ms, ratios;
    for (int r = 0; r < res.rounds; ++r) {
      const double f = step_with(full);
      std::vector<double> p;
      for (int i = 0; i < per_round; ++i) p.push_back(step());
      full_ms.push_back(f);
      ratios.push_back((median(p) / pattern_kept) / (f / full_kept));
    }
    res.full_ms = median(full_ms);
    res.full_ns_per_kept_pair = res.full_ms * 1e6 / full_kept;
    res.ratio_vs_full = median(ratios);
  }
};

// Each case's steps in turn, timed one after another (the default).
void bench_in_turn(const AttentionBenchOptions& opt, BenchCase& c, std::vector<AttentionBenchResult>& results) {
  const auto w0 = std::chrono::steady_clock::now();
  c.step();  // warm-up: fills the caching allocator and BLAS buffers
  const double warm_s = ms_since(w0) * 1e-3;
  // Short steps get more of them (about 10 s in all, at most 25): on a shared machine a
  // 0.4 s step meets a load spike far more often than a 6 s one, and the median needs company.
  const int base_reps = c.n <= 1024 ? 5 : 3;
  const int reps = opt.repeats > 0 ? opt.repeats
                   : warm_s > 60
                       ? 1
                       : std::clamp(static_cast<int>(std::ceil(10.0 / std::max(warm_s, 1e-3))), base_reps, 25);
  std::vector<double> ms, fms;
  int64_t peak = 0;
  for (int r = 0; r < reps; ++r) {
    ms.push_back(c.timed_step(&peak));
    fms.push_back(c.fwd_ms);
  }
  AttentionBenchResult res = c.result(ms, fms, peak);
  if (opt.versus_full && !opt.linear && c.o.pattern) c.versus_full(res);
  results.push_back(res);
}

// The cases of every N round-robin (interleave_n): each round one warm-up and one timed step per N.
void bench_interleaved(const AttentionBenchOptions& opt, std::vector<BenchCase>& cases,
                       std::vector<AttentionBenchResult>& results) {
  double round_s = 0;
  for (BenchCase& c : cases) {
    const auto w0 = std::chrono::steady_clock::now();
    c.step();
    round_s += 2 * ms_since(w0) * 1e-3;
  }
  const int rounds =
      opt.rounds > 0 ? opt.rounds : std::clamp(static_cast<int>(std::ceil(20.0 / std::max(round_s, 1e-3))), 5, 15);
  std::vector<std::vector<double>> ms(cases.size()), fms(cases.size());
  std::vector<int64_t> peak(cases.size(), 0);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      cases[i].step();  // the caches hold this N's tensors again, not the previous N's
      ms[i].push_back(cases[i].timed_step(&peak[i]));
      fms[i].push_back(cases[i].fwd_ms);
    }
  for (size_t i = 0; i < cases.size(); ++i) {
    AttentionBenchResult res = cases[i].result(ms[i], fms[i], peak[i]);
    res.rounds = rounds;
    res.interleaved = true;
    results.push_back(res);
  }
}

}  // namespace

std::vector<AttentionBenchResult> bench_attention(const AttentionBenchOptions& opt) {
  QKV_CHECK(!(opt.interleave_n && opt.versus_full), "[bench] --interleave-n and --versus-full do not combine");
  const int prev_threads = omp_get_max_threads();
  omp_set_num_threads(std::max(1, opt.threads));
  std::vector<AttentionBenchResult> results;
  try {
    const std::vector<Kernel> kernels = opt.linear ? std::vector<Kernel>{Kernel::fused} : opt.kernels;
    for (Kernel kernel : kernels)
      for (int64_t D : opt.head_dims)
        if (opt.interleave_n) {
          for (int64_t hkv : opt.hkvs) {
            std::vector<BenchCase> cases;
            for (int64_t n : opt.ns)
              if (kernel != Kernel::reference || n <= opt.reference_max_n) cases.emplace_back(opt, kernel, D, n, hkv);
            if (!cases.empty()) bench_interleaved(opt, cases, results);
          }
        } else {
          for (int64_t n : opt.ns)
            for (int64_t hkv : opt.hkvs) {
              if (kernel == Kernel::reference && n > opt.reference_max_n) continue;
              BenchCase c(opt, kernel, D, n, hkv);
              bench_in_turn(opt, c, results);
            }
        }
  } catch (...) {
    omp_set_num_threads(prev_threads);
    throw;
  }
  omp_set_num_threads(prev_threads);
  return results;
}

}  // namespace qkv::attn
