// qkv bench [--config FILE] [--what step|attention|gemm|decode|numerics] [--steps N] [--threads N] [--profile] [--json]
//           decode also: [--tokens N] (greedy KV-cache decoding of the config's model, random weights)
//           numerics: step and decode under numerics = standard and invariant, alternated [--rounds R] (default 3)
//           batch also: [--tokens N] [--prompts N] [--batch-size B] [--count N] [--rounds R] (continuous batching:
//           throughput at B vs 1, distinct greedy completions of one prompt, standard vs invariant)
//           attention also: [--n N...] [--head-dim D...] [--hkv H] [--kernel K] [--pattern NAME]
//           [--pattern-stride S] [--pattern-local L] [--pattern-global G] [--pattern-random-blocks R]
//           [--pattern-block-size BS] [--versus-full [--rounds R]] [--interleave-n [--rounds R]]; a config with train.device = "cuda" selects the GPU
//           step on the GPU also: [--peak-tflops P] (the MFU denominator; default: the card's dense bf16
//           datasheet peak, tensor/device_peaks.cpp)
#include <omp.h>

#include <cstdio>
#include <cstdlib>

#include "app/commands.h"
#include "app/options.h"
#include "bench/attention_bench.h"
#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cpu/matmul.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/device_info.h"
#include "train/bench.h"
#include "train/config_schema.h"

namespace qkv::app {

void add_bench_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("bench", "measure a training step, the attention kernels, GEMM, or decoding");
  static std::string config, what = "step";
  static std::vector<std::string> sets;
  static int steps = 10;
  static std::optional<int64_t> threads;
  static int64_t tokens = 256;
  static std::optional<double> peak_tflops;
  static std::vector<int64_t> ns, head_dims;
  static std::string pattern = "full", linear_feature = "elu1";
  static bool profile = false, json = false;
  add_path_option(cmd, "--config", config, "config whose step (or GEMM shapes) to measure");
  add_set_option(cmd, sets, "override a config key (repeatable)");
  add_numerics_option(cmd, sets);
  add_choice_option(cmd, "--what", what, {"step", "attention", "gemm", "decode", "numerics", "batch"},
                    "what to measure (numerics: invariant vs standard, alternated)");
  add_int_option(cmd, "--tokens", tokens, {1, 1 << 20},
                 "decode, numerics, batch: tokens to generate (decode, numerics: default 256, or what fits "
                 "model.block_size after the 1-token prompt where that is less)");
  static int64_t batch_prompts = 16, batch_size = 8, batch_count = 1000;
  add_int_option(cmd, "--prompts", batch_prompts, {1, 1 << 20}, "batch: prompts per throughput run");
  add_int_option(cmd, "--batch-size", batch_size, {1, 4096}, "batch: rows decoded together (compared with 1)");
  add_int_option(cmd, "--count", batch_count, {0, 1 << 24},
                 "batch: greedy completions of the target prompt per numerics mode (0 = skip)");
  add_int_option(cmd, "--steps", steps, {1, 100000}, "step, numerics: timed steps after the warm-up");
  add_int_option(cmd, "--threads", threads, {1, 4096}, "OpenMP threads (default: the config's, else all)");
  add_int_list_option(cmd, "--n", ns, {1, 1 << 20}, "attention: sequence lengths (default 256 1024 4096)");
  add_int_list_option(cmd, "--head-dim", head_dims, {1, 1024}, "attention: head dims (default 64)");
  static std::optional<int64_t> p_stride, p_local, p_hkv;
  static int64_t p_global = 1, p_random = 2, p_bs = 64;
  add_choice_option(cmd, "--pattern", pattern, choice_names(kAttentionPatterns),
                    "attention: the pattern (linear: N 1K..64K, kv heads 8)");
  add_int_option(cmd, "--pattern-stride", p_stride, {1, 1 << 20}, "attention, strided: s (default ceil(sqrt(N)))");
  add_int_option(cmd, "--pattern-local", p_local, {1, 1 << 20},
                 "attention, window|strided|global|bigbird: local width l (default: the pattern's)");
  add_int_option(cmd, "--pattern-global", p_global, {0, 1 << 20},
                 "attention, global|bigbird: the first g positions are global (0: none)");
  add_int_option(cmd, "--pattern-random-blocks", p_random, {0, 1 << 20}, "attention, bigbird: random blocks (0: none)");
  add_int_option(cmd, "--pattern-block-size", p_bs, {1, 1 << 20}, "attention, bigbird|block_sparse: block size");
  add_int_option(cmd, "--hkv", p_hkv, {1, 1024}, "attention: kv heads (default: 8 and 2)");
  static bool versus_full = false;
  static std::optional<int64_t> rounds;
  cmd->add_flag("--versus-full", versus_full,
                "attention, sparse --pattern: also time full causal attention, alternating with the pattern in "
                "the same process, and report the ratio of their times per kept pair");
  add_int_option(cmd, "--rounds", rounds, {1, 100000},
                 "attention --versus-full: alternated rounds (default: about 10 s of full steps); numerics, batch: "
                 "rounds (default 3); --interleave-n: rounds over the N (default: about 20 s)");
  static bool interleave_n = false;
  cmd->add_flag("--interleave-n", interleave_n,
                "attention: time the --n values round-robin in one process (each round a warm-up and a timed step "
                "per N), so growth over N compares one machine state");
  static std::string kernel = "both";
  std::vector<std::string> kernels = choice_names(kAttnKernels);
  kernels.push_back("both");
  add_choice_option(cmd, "--kernel", kernel, kernels, "attention: which kernels");
  add_choice_option(cmd, "--linear-feature", linear_feature, choice_names(kLinearFeatures),
                    "attention --pattern linear: the feature map");
  cmd->add_flag("--profile", profile, "step: per-op forward/backward time table");
  add_real_option(cmd, "--peak-tflops", peak_tflops, {0, 1e9, true, false},
                  "step on the GPU: peak TFLOP/s for MFU (default: the card's dense bf16)");
  cmd->add_flag("--json", json, "print {\"results\": [...]} as one JSON line");
  cmd->callback([&exit_code, cmd] {
    // Decode's tokens: --tokens as given (a decode past the block is refused by name), else 256 or
    // what fits the model's block after the 1-token prompt.
    const auto decode_tokens = [cmd](const Config& cfg) {
      if (cmd->count("--tokens")) return tokens;
      return std::clamp<int64_t>(cfg.resolved().model.block_size - 1, 1, tokens);
    };
    // Options that only act with one --what (or one --pattern), given with another, would be
    // silently ignored: each is refused naming what it needs.
    const std::string got_what = "--what " + what;
    refuse_alone(cmd, {"--tokens"}, what == "decode" || what == "numerics" || what == "batch",
                 "--what decode, numerics or batch", got_what);
    refuse_alone(cmd, {"--prompts", "--batch-size", "--count"}, what == "batch", "--what batch", got_what);
    refuse_alone(cmd, {"--steps"}, what == "step" || what == "numerics", "--what step or numerics", got_what);
    refuse_alone(cmd, {"--profile", "--peak-tflops"}, what == "step", "--what step", got_what);
    refuse_alone(cmd,
                 {"--n", "--head-dim", "--hkv", "--pattern", "--pattern-stride", "--pattern-local", "--pattern-global",
                  "--pattern-random-blocks", "--pattern-block-size", "--versus-full", "--interleave-n", "--kernel",
                  "--linear-feature"},
                 what == "attention", "--what attention", got_what);
    const std::string got_pattern = "--pattern " + pattern;
    refuse_alone(cmd, {"--linear-feature"}, pattern == "linear", "--pattern linear", got_pattern);
    refuse_alone(cmd, {"--pattern-stride"}, pattern == "strided", "--pattern strided", got_pattern);
    refuse_alone(cmd, {"--pattern-local"},
                 pattern == "window" || pattern == "strided" || pattern == "global" || pattern == "bigbird",
                 "--pattern window, strided, global or bigbird", got_pattern);
    refuse_alone(cmd, {"--pattern-global"}, pattern == "global" || pattern == "bigbird", "--pattern global or bigbird",
                 got_pattern);
    refuse_alone(cmd, {"--pattern-random-blocks"}, pattern == "bigbird", "--pattern bigbird", got_pattern);
    refuse_alone(cmd, {"--pattern-block-size"}, pattern == "bigbird" || pattern == "block_sparse",
                 "--pattern bigbird or block_sparse", got_pattern);
    refuse_alone(cmd, {"--rounds"},
                 what == "numerics" || what == "batch" || (what == "attention" && (versus_full || interleave_n)),
                 "--what numerics, --what batch, or --what attention with --versus-full or --interleave-n");
    nlohmann::json results = nlohmann::json::array();
    std::FILE* out = json ? stderr : stdout;
    if (threads) omp_set_num_threads(static_cast<int>(*threads));
    if (what == "step" || what == "gemm") {
      QKV_CHECK(!config.empty(), "[bench] --what ", what, " needs --config");
      Config cfg = parse_config(config, sets);
      if (threads) cfg.train.threads = *threads;
      if (what == "step") {
        const auto r = train::bench_step(cfg, steps, 3, profile);
        std::fprintf(
            out, "%s: %.2f ms/step  %.0f tok/s  %.2f GFLOP/s  peak RSS %.0f MB  (%d threads, %lld params, loss %.4f)\n",
            config.c_str(), r.ms_per_step, r.tokens_per_s, r.gflops, r.peak_rss_bytes / 1048576.0, r.threads,
            static_cast<long long>(r.params), r.final_loss);
        std::fprintf(out, "  cpu %.2f ms/step, tensor peak %.0f MB, %.2f OS allocations/step\n", r.cpu_ms_per_step,
                     r.allocator_peak_bytes / 1048576.0, r.os_allocations_per_step);
        nlohmann::json j = {{"name", "step"},
                            {"config", config},
                            {"ms_per_step", r.ms_per_step},
                            {"tokens_per_s", r.tokens_per_s},
                            {"gflops", r.gflops},
                            {"flops_per_step", r.flops_per_step},
                            {"peak_rss_bytes", r.peak_rss_bytes},
                            {"threads", r.threads},
                            {"params", r.params},
                            {"step_ms", r.step_ms},
                            {"final_loss", r.final_loss},
                            {"cpu_ms_per_step", r.cpu_ms_per_step},
                            {"os_allocations_per_step", r.os_allocations_per_step},
                            {"allocator_peak_bytes", r.allocator_peak_bytes}};
        if (cfg.train.device == Device::cuda) {
          // MFU: model FLOP/s over the card's dense bf16 peak, for float32 and bf16 runs alike.
          const cuda::DeviceInfo dev = cuda::device_info();
          const double peak = peak_tflops.value_or(dev.peak_bf16_tflops);
          const double tflops = r.gflops * 1e-3;
          j["device"] = dev.name;
          j["tflops"] = tflops;
          j["peak_tflops"] = peak;
          if (peak > 0) j["mfu"] = tflops / peak;
          char mfu[48] = "n/a (unknown card: pass --peak-tflops)";
          if (peak > 0) std::snprintf(mfu, sizeof mfu, "%.1f%% of %.0f TFLOP/s", 100 * tflops / peak, peak);
          std::fprintf(out, "  %s (sm_%d%d): %.1f model TFLOP/s, MFU %s\n", dev.name.c_str(), dev.major, dev.minor,
                       tflops, mfu);
        }
        if (profile) {
          nlohmann::json prof = nlohmann::json::array();
          std::vector<std::pair<std::string, autograd::ProfileEntry>> rows(r.profile.begin(), r.profile.end());
          std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
          std::fprintf(out, "%-36s %10s %8s\n", "region / backward node", "ms/step", "calls");
          for (auto& [name, e] : rows) {
            std::fprintf(out, "%-36s %10.3f %8lld\n", name.c_str(), e.ms,
                         static_cast<long long>(e.calls / std::max(steps, 1)));
            prof.push_back({{"name", name}, {"ms", e.ms}, {"calls", e.calls}});
          }
          j["profile"] = prof;
        }
        results.push_back(j);
      } else {
        for (const auto& g : train::bench_gemm(cfg)) {
          std::fprintf(out, "%-18s m=%-6lld n=%-6lld k=%-6lld %8.1f GFLOP/s (%s)  BLAS %8.1f", g.name.c_str(),
                       static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k), g.gflops,
                       g.kernel.c_str(), g.blas_gflops);
          if (g.bf16_gflops > 0) std::fprintf(out, "  bf16 %8.1f (%s)", g.bf16_gflops, g.bf16_kernel.c_str());
          std::fprintf(out, "\n");
          results.push_back({{"name", g.name},
                             {"m", g.m},
                             {"n", g.n},
                             {"k", g.k},
                             {"gflops", g.gflops},
                             {"kernel", g.kernel},
                             {"blas_gflops", g.blas_gflops},
                             {"bf16_gflops", g.bf16_gflops},
                             {"bf16_kernel", g.bf16_kernel}});
        }
      }
    } else if (what == "attention") {
      attn::AttentionBenchOptions o;
      const AttentionChoice* choice = find_choice(kAttentionPatterns, pattern);
      QKV_CHECK(choice, "[bench] --pattern must be ", names_or(kAttentionPatterns), ", got '", pattern, "'");
      o.linear = choice->linear();
      o.pattern.kind = choice->sparse;
      o.linear_feature = attn::parse_linear_feature(linear_feature, "--linear-feature");
      if (o.linear) {
        o.ns = {1024, 2048, 4096, 8192, 16384, 32768, 65536};
        o.hkvs = {8};
      }
      if (!ns.empty()) o.ns = ns;
      if (!head_dims.empty()) o.head_dims = head_dims;
      if (p_hkv) o.hkvs = {*p_hkv};
      const attn::Kernel* k = find_choice(kAttnKernels, kernel);
      QKV_CHECK(k || kernel == "both", "[bench] --kernel must be fused, reference or both, got '", kernel, "'");
      if (k) o.kernels = {*k};
      o.pattern.stride = p_stride.value_or(0);  // 0: the pattern's own default (attention/pattern/pattern.h)
      o.pattern.local = p_local.value_or(0);
      o.pattern.global = p_global;
      o.pattern.random_blocks = p_random;
      o.pattern.block_size = p_bs;
      for (int64_t n : o.ns) o.pattern.validate_for(n, "--pattern-", "--n");
      QKV_CHECK(!versus_full || o.pattern.sparse(), "[bench] --versus-full needs a sparse --pattern, got '", pattern,
                "'");
      o.versus_full = versus_full;
      o.interleave_n = interleave_n;
      o.rounds = static_cast<int>(rounds.value_or(0));  // 0: the benchmark's own time-based count
      o.threads = threads ? static_cast<int>(*threads) : omp_get_max_threads();
      const Config cfg = config.empty() ? Config{} : parse_config(config, sets);
      if (!config.empty() && cfg.train.device == Device::cuda) {
        // The GPU: the config's batch and heads (B1 H8 would leave most SMs idle), its dtype (bf16:
        // the tensor-core kernels), and the reference kernel's N×N weights only up to N = 1024.
        QKV_CHECK(cuda::device_count() > 0, config, ": train.device = \"cuda\" but no CUDA device is visible");
        o.device = Device::cuda;
        o.batch = cfg.train.batch_size;
        o.heads = cfg.model.n_head;
        o.hkvs = {cfg.model.n_head};
        o.bf16_autocast = cfg.train.dtype == DType::bf16;
        o.reference_max_n = 1024;
      }
      // The reference kernel holds the N x N weights: it runs up to reference_max_n. Asked for
      // alone, a longer N is refused; beside the fused kernel it is left out there, and said so.
      for (int64_t n : o.ns)
        if (n > o.reference_max_n && !o.linear) {
          QKV_CHECK(kernel != "reference",
                    "[bench] --kernel reference keeps the N x N weights and runs up to N = ", o.reference_max_n,
                    " here; --n ", n, " is over it (--kernel fused runs any N)");
          if (kernel == "both")
            std::fprintf(stderr, "qkv bench: the reference kernel is left out at N = %lld (it runs up to N = %lld)\n",
                         static_cast<long long>(n), static_cast<long long>(o.reference_max_n));
        }
      for (const auto& r : attn::bench_attention(o)) {
        std::fprintf(
            out,
            "%-9s N=%-5lld hkv=%-2lld D=%-3lld %10.2f ms (fwd %.2f)  %6.2f / %6.2f TFLOP/s fwd/bwd  peak %8.2f MB\n",
            r.kernel.c_str(), static_cast<long long>(r.n), static_cast<long long>(r.hkv),
            static_cast<long long>(r.head_dim), r.ms, r.forward_ms, r.forward_tflops, r.backward_tflops,
            r.peak_bytes / 1048576.0);
        if (o.pattern.sparse())
          std::fprintf(
              out,
              "          %s: kept %lld pairs, %lld of %lld %lldx%lld tiles visited, %.2f ns/kept pair, %.1f GFLOP/s on "
              "kept\n",
              r.pattern.c_str(), static_cast<long long>(r.kept_pairs), static_cast<long long>(r.visited_tiles),
              static_cast<long long>(r.total_tiles), static_cast<long long>(r.tile_q), static_cast<long long>(r.tile_k),
              r.ns_per_kept_pair, r.kept_gflops);
        if (r.interleaved) std::fprintf(out, "          interleaved with the other N: median of %d rounds\n", r.rounds);
        if (r.rounds > 0 && !r.interleaved)
          std::fprintf(out,
                       "          vs full causal, %d alternated rounds: full %.2f ms, %.2f ns/kept pair; pattern/full "
                       "per kept pair %.3f\n",
                       r.rounds, r.full_ms, r.full_ns_per_kept_pair, r.ratio_vs_full);
        nlohmann::json row = {{"name", "attention"},
                              {"kernel", r.kernel},
                              {"n", r.n},
                              {"hkv", r.hkv},
                              {"head_dim", r.head_dim},
                              {"ms", r.ms},
                              {"forward_ms", r.forward_ms},
                              {"forward_tflops", r.forward_tflops},
                              {"backward_tflops", r.backward_tflops},
                              {"peak_bytes", r.peak_bytes},
                              {"pattern", r.pattern},
                              {"kept_pairs", r.kept_pairs},
                              {"visited_tiles", r.visited_tiles},
                              {"total_tiles", r.total_tiles},
                              {"tile_q", r.tile_q},
                              {"tile_k", r.tile_k},
                              {"kept_gflops", r.kept_gflops},
                              {"ns_per_kept_pair", r.ns_per_kept_pair}};
        if (r.interleaved) {
          row["interleaved"] = true;
          row["rounds"] = r.rounds;
        } else if (r.rounds > 0) {
          row["rounds"] = r.rounds;
          row["full_ms"] = r.full_ms;
          row["full_ns_per_kept_pair"] = r.full_ns_per_kept_pair;
          row["ratio_vs_full"] = r.ratio_vs_full;
        }
        results.push_back(row);
      }
    } else if (what == "numerics") {
      QKV_CHECK(!config.empty(), "[bench] --what numerics needs --config");
      Config cfg = parse_config(config, sets);
      if (threads) cfg.train.threads = *threads;
      const int n_rounds = static_cast<int>(rounds.value_or(3));
      const auto r = train::bench_numerics(cfg, steps, decode_tokens(cfg), n_rounds);
      auto med = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      std::fprintf(out,
                   "%s, %d rounds alternating: step %.2f ms standard, %.2f ms invariant (x%.3f); decode %.2f "
                   "ms/token standard, %.2f invariant (x%.3f)\n",
                   config.c_str(), n_rounds, med(r.step_ms[0]), med(r.step_ms[1]), r.step_ratio, med(r.token_ms[0]),
                   med(r.token_ms[1]), r.decode_ratio);
      for (int mode = 0; mode < 2; ++mode)
        std::fprintf(out, "  decode %-9s weights read at %.1f GB/s of %.1f streaming (%.0f%%)\n",
                     mode == 0 ? "standard" : "invariant", r.decode[mode].weight_gb_per_s,
                     r.decode[mode].stream_gb_per_s,
                     100 * r.decode[mode].weight_gb_per_s / r.decode[mode].stream_gb_per_s);
      results.push_back({{"name", "numerics"},
                         {"config", config},
                         {"rounds", n_rounds},
                         {"step_ms_standard", r.step_ms[0]},
                         {"step_ms_invariant", r.step_ms[1]},
                         {"step_ratio", r.step_ratio},
                         {"token_ms_standard", r.token_ms[0]},
                         {"token_ms_invariant", r.token_ms[1]},
                         {"decode_ratio", r.decode_ratio},
                         {"weight_gb_per_s_standard", r.decode[0].weight_gb_per_s},
                         {"weight_gb_per_s_invariant", r.decode[1].weight_gb_per_s},
                         {"stream_gb_per_s", r.decode[1].stream_gb_per_s},
                         {"threads", r.decode[1].threads}});
    } else if (what == "decode") {
      QKV_CHECK(!config.empty(), "[bench] --what decode needs --config");
      Config cfg = parse_config(config, sets);
      if (threads) cfg.train.threads = *threads;
      const auto r = train::bench_decode(cfg, decode_tokens(cfg));
      std::fprintf(out,
                   "%s: decode %.1f tok/s  %.2f ms/token (median)  peak RSS %.0f MB  (%s, %d threads, %lld tokens of "
                   "context, %lld params)\n",
                   config.c_str(), r.tokens_per_s, r.ms_per_token, r.peak_rss_bytes / 1048576.0,
                   r.bf16 ? "bf16" : "float32", r.threads, static_cast<long long>(r.context_tokens),
                   static_cast<long long>(r.params));
      std::fprintf(out,
                   "  weights read at %.1f GB/s (%.0f MB per token); streaming the same bytes on %d threads: %.1f "
                   "GB/s (%.0f%%)\n",
                   r.weight_gb_per_s, r.weight_bytes / 1e6, r.threads, r.stream_gb_per_s,
                   100 * r.weight_gb_per_s / r.stream_gb_per_s);
      results.push_back({{"name", "decode"},
                         {"numerics", std::string(choice_name(kNumericsModes, cfg.train.resolved_numerics()))},
                         {"dtype", r.bf16 ? "bf16" : "float32"},
                         {"weight_bytes", r.weight_bytes},
                         {"weight_gb_per_s", r.weight_gb_per_s},
                         {"stream_gb_per_s", r.stream_gb_per_s},
                         {"config", config},
                         {"tokens_per_s", r.tokens_per_s},
                         {"ms_per_token", r.ms_per_token},
                         {"tokens", r.tokens},
                         {"context_tokens", r.context_tokens},
                         {"peak_rss_bytes", r.peak_rss_bytes},
                         {"threads", r.threads},
                         {"params", r.params}});
    } else if (what == "batch") {
      QKV_CHECK(!config.empty(), "[bench] --what batch needs --config");
      Config cfg = parse_config(config, sets);
      if (threads) cfg.train.threads = *threads;
      train::BatchBenchOptions bo;
      bo.prompts = batch_prompts;
      bo.batch_size = batch_size;
      bo.count = batch_count;
      if (rounds) bo.rounds = static_cast<int>(*rounds);
      if (cmd->count("--tokens")) bo.max_new_tokens = tokens;
      const auto r = train::bench_batch(cfg, bo);
      nlohmann::json runs = nlohmann::json::array();
      for (const auto& t : r.runs) {
        std::fprintf(out, "%s: batch %lld: %.1f tok/s (%lld tokens in %.2f s)\n", config.c_str(),
                     static_cast<long long>(t.batch_size), t.tokens_per_s, static_cast<long long>(t.tokens), t.seconds);
        runs.push_back({{"batch_size", t.batch_size},
                        {"tokens", t.tokens},
                        {"seconds", t.seconds},
                        {"tokens_per_s", t.tokens_per_s}});
      }
      if (!r.runs.empty())
        std::fprintf(
            out, "  batch %lld / batch 1 throughput: %.2fx (median of %d alternated rounds; %d threads, %lld params)\n",
            static_cast<long long>(bo.batch_size), r.speedup, r.rounds, r.threads, static_cast<long long>(r.params));
      if (r.trials > 0)
        std::fprintf(out,
                     "  %lld greedy completions (%lld new tokens) of one %lld-token prompt among others: %lld distinct "
                     "(standard), %lld distinct (invariant); distinct log-prob sequences %lld (standard), %lld "
                     "(invariant)\n",
                     static_cast<long long>(r.trials), static_cast<long long>(r.max_new_tokens),
                     static_cast<long long>(r.target_tokens), static_cast<long long>(r.distinct_standard),
                     static_cast<long long>(r.distinct_invariant), static_cast<long long>(r.distinct_logprobs_standard),
                     static_cast<long long>(r.distinct_logprobs_invariant));
      results.push_back({{"name", "batch"},
                         {"config", config},
                         {"runs", runs},
                         {"speedup", r.speedup},
                         {"rounds", r.rounds},
                         {"trials", r.trials},
                         {"max_new_tokens", r.max_new_tokens},
                         {"target_tokens", r.target_tokens},
                         {"distinct_standard", r.distinct_standard},
                         {"distinct_invariant", r.distinct_invariant},
                         {"distinct_logprobs_standard", r.distinct_logprobs_standard},
                         {"distinct_logprobs_invariant", r.distinct_logprobs_invariant},
                         {"threads", r.threads},
                         {"params", r.params}});
    } else {
      fail("[bench] --what must be step, attention, gemm, decode, numerics or batch, got '", what, "'");
    }
    // What the figures depend on besides the code: the BLAS kernel family (OpenBLAS picks one per
    // CPU; OPENBLAS_CORETYPE overrides it) and OpenMP's barrier spin (app/main.cpp sets it).
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const cpu::CpuFeatures& features = cpu::cpu_features();
    const nlohmann::json environment = {{"cpu",
                                         {{"vendor", features.vendor},
                                          {"brand", features.brand},
                                          {"family", features.family},
                                          {"model", features.model},
                                          {"features", features.names()}}},
                                        {"gemm_kernel", cpu::gemm_kernel_name(cpu::active_gemm_kernel())},
                                        {"gemm_kernel_reason", cpu::gemm_kernel_reason()},
                                        {"bf16_kernel", cpu::bf16_kernel_name(cpu::active_bf16_kernel())},
                                        {"bf16_kernel_reason", cpu::bf16_kernel_reason()},
                                        {"blas_kernel", cpu::blas_kernel_name()},
                                        {"omp_max_threads", omp_get_max_threads()},
                                        {"gomp_spincount", spin ? spin : ""},
                                        {"omp_wait_policy", policy ? policy : ""}};
    std::fprintf(out, "CPU %s (family %d model %d); GEMM kernel %s; bf16 GEMM %s; %d OpenMP threads\n",
                 features.brand.c_str(), features.family, features.model, cpu::gemm_kernel_reason().c_str(),
                 cpu::bf16_kernel_reason().c_str(), omp_get_max_threads());
    if (json) print_json({{"results", results}, {"environment", environment}});
    exit_code = 0;
  });
}

}  // namespace qkv::app
