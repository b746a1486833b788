#include "train/bench.h"

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cuda/cuda_backend.h"
#include "train/evaluate.h"
#include "train/row_step.h"
#include "train/model_factory.h"
#include "train/optimizer.h"
#include "train/sampler.h"
#include "train/session.h"
#include "train/trainer.h"

namespace qkv::train {

using Clock = std::chrono::steady_clock;

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

static double cpu_ms_now() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

StepBenchResult bench_step(const Config& cfg_in, int steps, int warmup, bool profile) {
  const Config cfg = cfg_in.resolved();
  apply_thread_setting(cfg);
  const NumericsGuard numerics_mode(cfg.train.resolved_numerics());
  RunData data = load_run_data(cfg);
  auto model = build_model(cfg, data.vocab_size, ModelUse::training);
  model->init_weights(static_cast<uint64_t>(cfg.train.seed));
  model->train();
  // train.device = "cuda": the whole step on the GPU. Each step ends in loss.item(), a copy to the
  // host that waits for every kernel queued before it (the AdamW update included), so the wall
  // clock measures the device's work.
  const Device device = cfg.train.device;
  const autograd::AutocastGuard autocast(cfg.train.dtype == DType::bf16);  // as in the trainer
  const TensorCoreAttention tensor_cores(cfg.train.cuda_mma);
  if (device == Device::cuda) {
    QKV_CHECK(cuda::device_count() > 0,
              "train.device = \"cuda\": no CUDA device is visible (or this build has no CUDA backend)");
    model->to(Device::cuda);
  }
  std::vector<OptimParam> oparams;
  for (const auto& p : model->named_parameters()) oparams.push_back({p.name, p.tensor, p.decay && p.tensor.dim() >= 2});
  AdamW opt(oparams, AdamWOptions::from(cfg.train));
  const auto params = model->parameters();
  BatcherOptions bo;
  bo.batch_size = cfg.train.batch_size;
  bo.block_size = cfg.train.resolved_seq_len(cfg.model.block_size);
  bo.seed = static_cast<uint64_t>(cfg.train.seed);
  Batcher batcher(data.train, bo);
  const Batch batch = batcher.next();  // one fixed batch, as the reference script does

  StepBenchResult r;
  r.threads = omp_get_max_threads();
  // Invariant numerics on the CPU: the trainer's row tree (train/row_step.h), one process.
  dist::SingleProcess one;
  std::optional<dist::DataParallel> rows;
  if (cfg.train.resolved_numerics() == Numerics::invariant && device == Device::cpu)
    rows.emplace(one, oparams, dist::DataParallelOptions{.tree_rows = bo.batch_size});
  auto step = [&](uint64_t i) {
    if (rows) {
      rows->zero_grads();
      const std::vector<double> losses =
          row_tree_backward(*model, *rows, {batch}, batch.n_targets, bo.seed, static_cast<int64_t>(i), nullptr);
      rows->reduce_grads();
      opt.step(cfg.train.lr);
      double loss = 0;
      for (double v : losses) loss += v;
      return loss;
    }
    autograd::zero_grad(params);
    Tensor loss = batch_loss(*model, batch, nn::RngContext{bo.seed, i, 0});
    autograd::backward(loss);
    opt.step(cfg.train.lr);
    return loss.item();
  };
  for (int i = 0; i < warmup; ++i) step(static_cast<uint64_t>(i));
  autograd::profile_reset();
  autograd::set_profiling(profile, /*sync_device=*/device == Device::cuda);
  const int64_t os_allocs_before = allocator_stats(device).os_allocations;
  reset_peak_bytes(device);
  std::vector<double> cpu_ms;
  for (int i = 0; i < steps; ++i) {
    const double c0 = cpu_ms_now();
    const auto t0 = Clock::now();
    r.final_loss = step(static_cast<uint64_t>(warmup + i));
    r.step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu_ms.push_back(cpu_ms_now() - c0);
  }
  autograd::set_profiling(false);
  r.os_allocations_per_step =
      static_cast<double>(allocator_stats(device).os_allocations - os_allocs_before) / std::max(steps, 1);
  r.allocator_peak_bytes = allocator_stats(device).peak_bytes;  // the device's allocator on a GPU
  r.cpu_ms_per_step = median(cpu_ms);
  if (profile) {
    r.profile = autograd::profile_snapshot();
    for (auto& [name, e] : r.profile) e.ms /= std::max(steps, 1);
  }
  const double B = static_cast<double>(bo.batch_size), T = static_cast<double>(bo.block_size);
  const auto& mc = model->config();
  const double C = static_cast<double>(mc.n_embd), V = static_cast<double>(mc.vocab_size),
               L = static_cast<double>(mc.n_layer);
  r.params = model->parameter_count();
  r.non_embedding_params = model->non_embedding_parameter_count();
  r.flops_per_step =
      6 * B * T * static_cast<double>(r.non_embedding_params) + 6 * B * T * C * V + 6 * L * B * T * T * C;
  r.ms_per_step = median(r.step_ms);
  r.tokens_per_s = B * T / (r.ms_per_step / 1000.0);
  r.gflops = r.flops_per_step / (r.ms_per_step / 1000.0) * 1e-9;
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

DecodeBenchResult bench_decode(const Config& cfg_in, int64_t tokens) {
  const Config cfg = cfg_in.resolved();
  QKV_CHECK(tokens >= 1, "[bench] decode needs at least 1 token, got ", tokens);
  QKV_CHECK(cfg.train.device != Device::cuda,
            "[bench] --what decode runs on the CPU (train.device = \"cuda\" is not supported)");
  QKV_CHECK(tokens + 1 <= cfg.model.block_size, "[bench] --tokens ", tokens,
            " plus the 1-token prompt exceeds model.block_size ", cfg.model.block_size,
            " (decoding past it recomputes the window, which is not what decode measures)");
  apply_thread_setting(cfg);
  const NumericsGuard numerics_mode(cfg.train.resolved_numerics());
  const int64_t V = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : 256;
  auto model = build_model(cfg, V);
  model->init_weights(static_cast<uint64_t>(cfg.train.seed));
  model->eval();
  model->set_bf16_autocast(cfg.train.dtype == DType::bf16);  // as load_for_inference does
  SampleOptions o;
  o.temperature = 0;  // greedy: the pick costs one argmax, the forward is what is measured
  o.kv_cache = true;
  const std::vector<int32_t> prompt = {0};
  o.max_new_tokens = std::min<int64_t>(tokens, 8);
  generate(*model, prompt, o);  // warm-up: caches, allocator, helper threads
  DecodeBenchResult r;
  r.threads = omp_get_max_threads();
  o.max_new_tokens = tokens;
  auto last = Clock::now();
  const auto t0 = last;
  generate(*model, prompt, o, [&](int32_t) {
    const auto now = Clock::now();
    r.token_ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  });
  const double s = std::chrono::duration<double>(last - t0).count();
  r.tokens = tokens;
  r.context_tokens = static_cast<int64_t>(prompt.size()) + tokens;
  r.tokens_per_s = static_cast<double>(tokens) / s;
  r.ms_per_token = median(r.token_ms);
  r.params = model->parameter_count();
  // Every parameter but the embedding tables is read once per step; the LM head reads its
  // [V, C] weight, which is the token table itself when tied.
  const nn::ModelConfig& mc = model->config();
  int64_t read = r.params - V * mc.n_embd;
  if (mc.position == nn::Position::learned) read -= mc.block_size * mc.n_embd;
  if (mc.tie_embeddings) read += V * mc.n_embd;
  // bf16: 2 bytes a weight (the norms' weights and the biases, a fraction of a percent, are
  // read as float32).
  r.bf16 = cfg.train.dtype == DType::bf16;
  r.weight_bytes = read * (r.bf16 ? 2 : static_cast<int64_t>(sizeof(float)));
  r.weight_gb_per_s = r.weight_bytes / (r.ms_per_token / 1e3) / 1e9;
  r.peak_rss_bytes = peak_rss_bytes();  // before the stream test's buffer
  r.stream_gb_per_s = stream_read_gb_per_s(r.weight_bytes);
  return r;
}

NumericsBenchResult bench_numerics(const Config& cfg, int steps, int64_t tokens, int rounds) {
  QKV_CHECK(rounds >= 1, "[bench] --rounds must be at least 1 for --what numerics, got ", rounds);
  NumericsBenchResult r;
  std::vector<double> step_ratio, decode_ratio;
  for (int round = 0; round < rounds; ++round) {
    double step[2], token[2];
    for (int mode = 0; mode < 2; ++mode) {
      Config c = cfg;
      c.train.numerics = mode == 0 ? Numerics::standard : Numerics::invariant;
      step[mode] = bench_step(c, steps, 1).ms_per_step;
      r.decode[mode] = bench_decode(c, tokens);
      token[mode] = r.decode[mode].ms_per_token;
      r.step_ms[mode].push_back(step[mode]);
      r.token_ms[mode].push_back(token[mode]);
    }
    step_ratio.push_back(step[1] / step[0]);
    decode_ratio.push_back(token[1] / token[0]);
  }
  r.step_ratio = median(step_ratio);
  r.decode_ratio = median(decode_ratio);
  return r;
}

double stream_read_gb_per_s(int64_t bytes) {
  const int64_t n = std::max<int64_t>(bytes / 4, 1);
  std::vector<uint32_t> buf(static_cast<size_t>(n), 1u);
  const int threads = omp_get_max_threads();
  std::vector<double> gbs;
  uint64_t sink = 0;
  for (int pass = 0; pass < 6; ++pass) {
    uint64_t total = 0;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
      uint32_t sum = 0;
      for (int64_t i = lo; i < hi; ++i) sum += buf[static_cast<size_t>(i)];
      total += sum;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink += total;
    if (pass > 0) gbs.push_back(static_cast<double>(n) * 4 / s / 1e9);
  }
  if (sink == 42) std::fprintf(stderr, " ");  // keeps the sums
  return median(gbs);
}

namespace {

// `n` ids in [0, V) from a xorshift stream of `seed` (the bench's prompts: any tokens will do).
std::vector<int32_t> bench_prompt(int64_t n, uint64_t seed, int64_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& id : ids) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    id = static_cast<int32_t>(s % static_cast<uint64_t>(V));
  }
  return ids;
}

}  // namespace

BatchBenchResult bench_batch(const Config& cfg_in, const BatchBenchOptions& o) {
  const Config cfg = cfg_in.resolved();
  QKV_CHECK(cfg.train.device != Device::cuda,
            "[bench] --what batch runs on the CPU (train.device = \"cuda\" is not supported)");
  QKV_CHECK(o.prompts >= 1 && o.batch_size >= 1 && o.max_new_tokens >= 0 && o.count >= 0,
            "[bench] batch: prompts and batch size must be >= 1, tokens and count >= 0");
  const int64_t block = cfg.model.block_size;
  const int64_t new_tokens = o.max_new_tokens > 0 ? o.max_new_tokens : std::min<int64_t>(64, block / 2);
  // The longest prompt must leave room for every new token in its KV cache (generate_batch).
  const int64_t max_prompt = block - new_tokens + 1;
  QKV_CHECK(new_tokens >= 1 && max_prompt >= 4, "[bench] --tokens ", new_tokens,
            " leaves prompts fewer than 4 tokens within model.block_size ", block, " (use --tokens <= ", block - 3,
            ")");
  apply_thread_setting(cfg);
  const int64_t V = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : 256;
  auto model = build_model(cfg, V);
  model->init_weights(static_cast<uint64_t>(cfg.train.seed));
  model->eval();
  SampleOptions so;
  so.temperature = 0;  // greedy
  so.max_new_tokens = new_tokens;
  BatchBenchResult r;
  r.threads = omp_get_max_threads();
  r.params = model->parameter_count();
  r.max_new_tokens = new_tokens;
  // Prompt lengths spread over [1, limit].
  auto length = [](uint64_t k, int64_t limit) {
    return 1 + static_cast<int64_t>((k * 2654435761ull) % static_cast<uint64_t>(limit));
  };
  if (o.throughput) {
    const NumericsGuard mode(cfg.train.resolved_numerics());
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < o.prompts; ++i)
      // Short prompts (at most 16 tokens): the run's time is decoding, what batching speeds up.
      prompts.push_back(bench_prompt(length(static_cast<uint64_t>(i), std::min<int64_t>(16, max_prompt)),
                                     static_cast<uint64_t>(i), V));
    generate_batch(*model, {prompts[0]}, so, 1);  // warm-up: caches, allocator, helper threads
    // Alternated rounds, medians: a noisy machine slows both sizes alike within a round.
    const int rounds = std::max(1, o.rounds);
    std::vector<double> seconds[2], ratio;
    int64_t tokens[2] = {0, 0};
    for (int round = 0; round < rounds; ++round) {
      double tps[2] = {0, 0};
      for (int which = 0; which < 2; ++which) {
        const int64_t b = which == 0 ? 1 : o.batch_size;
        const auto t0 = Clock::now();
        tokens[which] = 0;
        for (const Completion& c : generate_batch(*model, prompts, so, b))
          tokens[which] += static_cast<int64_t>(c.tokens.size());
        seconds[which].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        tps[which] = static_cast<double>(tokens[which]) / seconds[which].back();
      }
      ratio.push_back(tps[1] / tps[0]);
    }
    for (int which = 0; which < 2; ++which) {
      BatchThroughput t;
      t.batch_size = which == 0 ? 1 : o.batch_size;
      t.tokens = tokens[which];
      t.seconds = median(seconds[which]);
      t.tokens_per_s = static_cast<double>(t.tokens) / t.seconds;
      r.runs.push_back(t);
    }
    r.rounds = rounds;
    r.speedup = median(ratio);
  }
  if (o.count > 0) {
    // The target prompt depends on train.seed, as the weights do: --set train.seed=S is another trial.
    const std::vector<int32_t> target =
        bench_prompt(std::min<int64_t>(12, max_prompt), 0xC0FFEE + static_cast<uint64_t>(cfg.train.seed), V);
    r.target_tokens = static_cast<int64_t>(target.size());
    r.trials = o.count;
    for (const Numerics mode : {Numerics::standard, Numerics::invariant}) {
      const NumericsGuard guard(mode);
      std::set<std::vector<int32_t>> distinct;
      std::set<std::vector<double>> distinct_logprobs;
      for (int64_t i = 0; i < o.count; ++i) {
        const auto u = static_cast<uint64_t>(i);
        const int64_t batch = 1 + i % 16;
        const int64_t others = batch - 1 + i % 3;  // i % 3 > 0: more prompts than rows, so rows refill
        const auto place = static_cast<size_t>((u * 7) % static_cast<uint64_t>(others + 1));
        std::vector<std::vector<int32_t>> prompts;
        for (int64_t j = 0; j < others; ++j)
          prompts.push_back(bench_prompt(length(u * 31 + static_cast<uint64_t>(j), max_prompt),
                                         u * 1000 + static_cast<uint64_t>(j) + 1, V));
        prompts.insert(prompts.begin() + static_cast<std::ptrdiff_t>(place), target);
        const Completion c = generate_batch(*model, prompts, so, batch, /*logprobs=*/true)[place];
        distinct.insert(c.tokens);
        distinct_logprobs.insert(c.logprobs);
      }
      const bool standard = mode == Numerics::standard;
      (standard ? r.distinct_standard : r.distinct_invariant) = static_cast<int64_t>(distinct.size());
      (standard ? r.distinct_logprobs_standard : r.distinct_logprobs_invariant) =
          static_cast<int64_t>(distinct_logprobs.size());
    }
  }
  return r;
}

namespace {

// Median seconds of one CPU product C[m, n] = op(A) op(B) on the step's kernel, the BLAS's sgemm
// and (where the CPU has bf16 units) the bf16 kernel, timed alternately; bf16 0 where it is the
// float32 GEMM.
struct CpuTimes {
  double kernel = 0, blas = 0, bf16 = 0;
  cpu::GemmKernel gemm_kernel;
  cpu::Bf16Kernel bf16_kernel;
};
CpuTimes time_cpu_gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
      c(static_cast<size_t>(m * n));
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
  CpuTimes r;
  r.gemm_kernel = cpu::active_gemm_kernel();
  r.bf16_kernel = cpu::active_bf16_kernel();
  auto run = [&](cpu::GemmKernel kernel) {
    cpu::sgemm_with(kernel, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), n);
  };
  const bool with_bf16 = r.bf16_kernel != cpu::Bf16Kernel::emulated;
  auto run_bf16 = [&] {
    cpu::sbgemm_with(r.bf16_kernel, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), n);
  };
  run(r.gemm_kernel);
  run(cpu::GemmKernel::blas);
  if (with_bf16) run_bf16();
  std::vector<double> ts, ts_blas, ts_bf16;
  const int reps = std::clamp(static_cast<int>(2e9 / flops), 3, 50);
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    run(r.gemm_kernel);
    ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    run(cpu::GemmKernel::blas);
    ts_blas.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!with_bf16) continue;
    t0 = Clock::now();
    run_bf16();
    ts_bf16.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  r.kernel = median(ts);
  r.blas = median(ts_blas);
  r.bf16 = with_bf16 ? median(ts_bf16) : 0.0;
  return r;
}

}  // namespace

std::vector<GemmBenchResult> bench_gemm(const Config& cfg_in) {
  const Config cfg = cfg_in.resolved();
  apply_thread_setting(cfg);
  const NumericsGuard numerics_mode(cfg.train.resolved_numerics());
  const int64_t N = cfg.train.batch_size * cfg.train.resolved_seq_len(cfg.model.block_size);
  const int64_t C = cfg.model.n_embd, F = cfg.model.resolved_ffn_hidden();
  const int64_t hd = cfg.model.head_dim(), qkv = C + 2 * cfg.model.resolved_n_kv_head() * hd;
  const int64_t V = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : 256;
  struct Layer {
    std::string name;
    int64_t in, out, count;
  };
  const int64_t L = cfg.model.n_layer;
  std::vector<Layer> layers = {{"attn.qkv", C, qkv, L},
                               {"attn.proj", C, C, L},
                               {"mlp.up", C, F, L},
                               {"mlp.down", F, C, L},
                               {"lm_head", C, V, 1}};
  std::vector<GemmBenchResult> out;
  double total_flops = 0, total_s = 0, total_s_bf16 = 0, total_s_blas = 0;
  // train.device = "cuda": the same shapes on cuBLAS (the MFU denominator of a GPU run).
  const bool gpu = cfg.train.device == Device::cuda;
  QKV_CHECK(!gpu || cuda::device_count() > 0,
            "train.device = \"cuda\": no CUDA device is visible (or this build has no CUDA backend)");
  for (const auto& l : layers) {
    // The layouts the step really uses (tensor/cpu/matmul.cpp folds the transposes into the call):
    // forward y = x W^T: x [N,in] NoTrans, W [out,in] Trans; dx = dy W: [N,out]x[out,in] NoTrans;
    // dW = dy^T x: dy [N,out] Trans, x [N,in] NoTrans.
    const int64_t shapes[3][3] = {{N, l.out, l.in}, {N, l.in, l.out}, {l.out, l.in, N}};
    const bool trans[3][2] = {{false, true}, {false, false}, {true, false}};
    const char* what[3] = {" fwd", " dx", " dW"};
    for (int s = 0; s < 3; ++s) {
      const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
      const bool ta = trans[s][0], tb = trans[s][1];
      const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
      if (gpu) {
        // cuBLAS through the raw op, float32 and bf16 operands (tensor cores), device-synchronised.
        const Tensor a = full(ta ? Shape{k, m} : Shape{m, k}, 0.5, DType::f32, Device::cuda);
        const Tensor b = full(tb ? Shape{n, k} : Shape{k, n}, 0.25, DType::f32, Device::cuda);
        const Tensor c = Tensor::empty({m, n}, DType::f32, Device::cuda);
        for (const bool bf16 : {false, true}) {
          auto run = [&] { matmul_into(ta ? a.transpose(0, 1) : a, tb ? b.transpose(0, 1) : b, c, 1.0, 0.0, bf16); };
          run();
          cuda::synchronize();
          const int reps = std::clamp(static_cast<int>(2e12 / flops), 5, 200);
          const auto t0 = Clock::now();
          for (int i = 0; i < reps; ++i) run();
          cuda::synchronize();
          const double t = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
          out.push_back({l.name + what[s] + (bf16 ? " bf16" : " fp32"), m, n, k, flops / t * 1e-9, "cublas"});
          (bf16 ? total_s_bf16 : total_s) += t * static_cast<double>(l.count);
        }
        total_flops += flops * static_cast<double>(l.count);
        continue;
      }
      const CpuTimes ts = time_cpu_gemm(m, n, k, ta, tb);
      out.push_back({l.name + what[s], m, n, k, flops / ts.kernel * 1e-9, cpu::gemm_kernel_name(ts.gemm_kernel),
                     flops / ts.blas * 1e-9, ts.bf16 > 0 ? flops / ts.bf16 * 1e-9 : 0.0,
                     cpu::bf16_kernel_name(ts.bf16_kernel)});
      const double t = ts.kernel, t_blas = ts.blas, t_bf16 = ts.bf16;
      total_flops += flops * static_cast<double>(l.count);
      total_s += t * static_cast<double>(l.count);
      total_s_blas += t_blas * static_cast<double>(l.count);
      total_s_bf16 += t_bf16 * static_cast<double>(l.count);
    }
  }
  const std::string kernel = gpu ? "cublas" : cpu::gemm_kernel_name(cpu::active_gemm_kernel());
  out.push_back({"step-weighted", 0, 0, 0, total_flops / total_s * 1e-9, kernel,
                 gpu ? 0.0 : total_flops / total_s_blas * 1e-9,
                 gpu || total_s_bf16 == 0.0 ? 0.0 : total_flops / total_s_bf16 * 1e-9,
                 gpu ? "" : cpu::bf16_kernel_name(cpu::active_bf16_kernel())});
  if (gpu) out.push_back({"step-weighted bf16", 0, 0, 0, total_flops / total_s_bf16 * 1e-9, "cublas"});
  if (!gpu) {
    // A square product of the forward's layout: the rate the kernels reach on a shape that fills
    // them, the reference for the step's own (kept out of step-weighted).
    constexpr int64_t kSquare = 1536;
    const CpuTimes ts = time_cpu_gemm(kSquare, kSquare, kSquare, false, true);
    const double flops = 2.0 * static_cast<double>(kSquare * kSquare * kSquare);
    out.push_back({"square", kSquare, kSquare, kSquare, flops / ts.kernel * 1e-9, cpu::gemm_kernel_name(ts.gemm_kernel),
                   flops / ts.blas * 1e-9, ts.bf16 > 0 ? flops / ts.bf16 * 1e-9 : 0.0,
                   cpu::bf16_kernel_name(ts.bf16_kernel)});
  }
  return out;
}

}  // namespace qkv::train
