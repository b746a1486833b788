// Benchmarks behind `qkv bench`: the full training step of a config (the work of
// bench/torch_reference.py step: zero grad, forward, loss, backward, AdamW), OpenBLAS
// sgemm on that step's own GEMM shapes, so a report can state model FLOP/s as a fraction of the
// GEMM rate measured in the same run, and greedy KV-cache decoding (tokens/s).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "autograd/profiler.h"
#include "train/config.h"

namespace qkv::train {

struct StepBenchResult {
  double ms_per_step = 0;  // median over the timed steps
  double tokens_per_s = 0;
  double gflops = 0;                   // model FLOPs (formula below) / median step time
  double flops_per_step = 0;           // 6·B·T·N_nonemb + 6·B·T·C·V + 6·L·B·T²·C
  int64_t peak_rss_bytes = 0;          // the process's peak resident set
  double cpu_ms_per_step = 0;          // median user + system CPU time of a step, all threads (less load-sensitive)
  double os_allocations_per_step = 0;  // blocks the caching allocator took from the OS per timed step (0 = steady)
  int64_t allocator_peak_bytes = 0;    // most tensor bytes in use at once during the timed steps
  int64_t params = 0, non_embedding_params = 0;
  int threads = 0;
  double final_loss = 0;
  std::vector<double> step_ms;
  std::map<std::string, autograd::ProfileEntry> profile;  // per timed step, when requested
};

StepBenchResult bench_step(const Config& cfg, int steps, int warmup = 3, bool profile = false);

struct GemmBenchResult {
  std::string name;  // which product of the step, e.g. "attn.c_attn fwd"
  int64_t m = 0, n = 0, k = 0;
  double gflops = 0;       // on `kernel`, the one the step runs
  std::string kernel;      // tensor/cpu/gemm/gemm.h's name ("avx2", "blas", ...) or "cublas"
  double blas_gflops = 0;  // the linked BLAS's sgemm on the same shape, timed alternately (CPU only)
  // CPU with bf16 units: the bf16 GEMM (tensor/cpu/gemm/bf16_gemm.h) timed alternately too; 0 and
  // "emulated" where the CPU has none (the bf16 GEMM is then the float32 one above).
  double bf16_gflops = 0;
  std::string bf16_kernel;
};
// The step's GEMM on every distinct GEMM shape of one training step (forward and both backward
// products of each linear layer and the LM head), plus the FLOP-weighted aggregate (name
// "step-weighted"); on the CPU each also on the BLAS.
std::vector<GemmBenchResult> bench_gemm(const Config& cfg);

// Greedy decoding with the KV cache on the config's model (random weights from train.seed, on
// the CPU): a 1-token prompt, then `tokens` new tokens, each one incremental forward; timed after
// a short warm-up generation. What `qkv sample` spends per token, without the checkpoint.
struct DecodeBenchResult {
  double tokens_per_s = 0;     // generated tokens / wall time of the timed generation
  double ms_per_token = 0;     // median time from one token to the next
  int64_t tokens = 0;          // generated in the timed run
  int64_t context_tokens = 0;  // prompt + generated: the longest context attended over
  int64_t peak_rss_bytes = 0;
  int64_t params = 0;
  int threads = 0;
  std::vector<double> token_ms;
  // A decode step at batch 1 is a matrix-vector product per layer: bound by reading the weights.
  bool bf16 = false;           // train.dtype = "bf16": bf16 inference, weights read as bf16 panels
  int64_t weight_bytes = 0;    // bytes of every weight a step reads (Linear layers, norms, LM head)
  double weight_gb_per_s = 0;  // weight_bytes / median step time
  double stream_gb_per_s = 0;  // the same threads streaming a weight_bytes buffer, measured in this run
};
DecodeBenchResult bench_decode(const Config& cfg, int64_t tokens);

// numerics = invariant against standard on the same config, side by side: `rounds` rounds, each a
// training step benchmark (`steps` timed steps) and a decode benchmark (`tokens` tokens) in either
// mode back to back, so both modes see the same machine state. Ratios are invariant / standard
// times, per round, then the median over the rounds.
struct NumericsBenchResult {
  std::vector<double> step_ms[2], token_ms[2];  // per round: [0] standard, [1] invariant
  double step_ratio = 0, decode_ratio = 0;
  DecodeBenchResult decode[2];  // the last round's decode figures (bandwidth), per mode
};
NumericsBenchResult bench_numerics(const Config& cfg, int steps, int64_t tokens, int rounds);

// GB/s of omp_get_max_threads() threads summing a `bytes` buffer (split in equal parts), median of
// 5 passes after a warm one: the read bandwidth a matrix-vector product over that many bytes can reach.
double stream_read_gb_per_s(int64_t bytes);

// `qkv bench --what batch`, on the config's model (random weights from train.seed, on the CPU):
//  throughput: greedy generation of the same `prompts` prompts (1 to 16 tokens) with continuous
//    batching (generate_batch) at batch size 1 and at `batch_size`, in the config's numerics mode;
//  consistency: `count` greedy completions of ONE target prompt, trial i mixing it among other
//    prompts of other lengths at batch size 1 + i % 16, at a varying place in the queue (so it
//    decodes at varying rows and sometimes joins a running batch), run in the standard and in the
//    invariant numerics mode; the number of distinct completions in each (invariant: 1), and of
//    distinct log-prob sequences (bitwise; invariant: 1). In the standard mode the target's decode
//    rows go through GEMMs of other row counts from trial to trial (one row: qkv's GEMV; more:
//    OpenBLAS), so its logits differ in the last bits; a greedy pick changes only where two logits
//    are that close, which a model with random weights rarely reaches.
struct BatchBenchOptions {
  int64_t prompts = 16;        // throughput: prompts generated per run
  int64_t max_new_tokens = 0;  // per prompt (both experiments); 0 = min(64, block_size / 2)
  int64_t batch_size = 8;      // throughput: the batched run's size
  int64_t count = 1000;        // consistency: trials (0 = skip the experiment)
  bool throughput = true;
  int rounds = 3;  // throughput: batch 1 and batch_size alternated this many times (medians)
};
struct BatchThroughput {
  int64_t batch_size = 0;
  int64_t tokens = 0;  // generated
  double seconds = 0;  // wall time of the run, prefills included (median over the rounds)
  double tokens_per_s = 0;
};
struct BatchBenchResult {
  std::vector<BatchThroughput> runs;  // batch size 1, then options.batch_size
  double speedup = 0;                 // median over the rounds of tokens/s at batch_size over tokens/s at 1
  int rounds = 0;
  int64_t trials = 0;
  int64_t distinct_standard = 0, distinct_invariant = 0;  // distinct completions of the target prompt
  // Distinct sequences of the completion's log-probs (bitwise): they show a difference in the
  // logits even where it is too small to change a greedy pick.
  int64_t distinct_logprobs_standard = 0, distinct_logprobs_invariant = 0;
  int64_t target_tokens = 0;  // the target prompt's length
  int64_t max_new_tokens = 0;
  int64_t params = 0;
  int threads = 0;
};
BatchBenchResult bench_batch(const Config& cfg, const BatchBenchOptions& options);

int64_t peak_rss_bytes();

}  // namespace qkv::train
