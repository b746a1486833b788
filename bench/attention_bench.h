// Attention benchmark (`qkv bench --what attention`): forward + backward time and the extra
// allocator bytes of one causal attention call, per kernel, N and Hkv (the results of
// `qkv bench --what attention`). The CLI prints these; the PyTorch anchor is measured by
// bench/torch_attention_bench.py.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/linear/linear_attention.h"

namespace qkv::attn {

struct AttentionBenchOptions {
  std::vector<int64_t> ns = {256, 1024, 4096};
  std::vector<int64_t> hkvs = {8, 2};
  std::vector<Kernel> kernels = {Kernel::reference, Kernel::fused};
  int threads = 2;  // OpenMP threads for the measurement (restored afterwards)
  int64_t batch = 1, heads = 8;
  std::vector<int64_t> head_dims = {64};
  Device device = Device::cpu;  // cuda: the tensors live on the GPU, timings synchronise
  bool causal = true;
  int64_t reference_max_n = 4096;  // skip the O(N²)-memory reference above this N
  int repeats = 0;                 // timed steps after one warm-up; 0: about 10 s of them (at least 5 for
                                   // N <= 1024, else 3; at most 25), and 1 when the warm-up took over a
                                   // minute (full attention at 16K on 2 cores)
  bool bf16_autocast = false;      // run under bf16 autocast (on the GPU: the tensor-core kernels)
  SparsePattern pattern;           // ANDed with the causal mask (full: none)
  // linear: attention/linear/linear_attention.h instead (causal as above, kernel "linear", feature
  // linear_feature, chunk linear_chunk; `kernels` and `pattern` are then ignored).
  bool linear = false;
  LinearFeature linear_feature = LinearFeature::elu1;
  int64_t linear_chunk = 64;
  // A sparse pattern also measured against full causal attention in the same process, on the same
  // tensors, alternating (`--versus-full`): each round one full step, then as many pattern steps as
  // take about as long. On a shared machine whose load drifts by tens of percent within seconds,
  // two separate runs seconds apart compare two different machines; alternated rounds see the same one.
  bool versus_full = false;
  int rounds = 0;  // versus_full or interleave_n rounds; 0: about 10 s of full steps (at least 3, at most 15),
                   // or about 20 s of interleaved rounds (at least 5, at most 15)
  // Every N of `ns` measured in the same stretch of time (`--interleave-n`): round-robin over the
  // N, each round one warm-up step (so the caches hold that N's tensors, not the previous N's) and
  // one timed step per N, the median over rounds. Growth over N (the log-log slope of time over N)
  // then compares one machine state, where N after N in turn compares minutes apart. Not with versus_full.
  bool interleave_n = false;
};

struct AttentionBenchResult {
  std::string kernel;  // "reference" | "fused", with "/bf16" under bf16 autocast
  int64_t n = 0, hkv = 0, head_dim = 0;
  double ms = 0;                                   // median forward + backward
  double forward_ms = 0;                           // median forward alone
  double forward_tflops = 0, backward_tflops = 0;  // causal work: fwd 2·B·H·N²·D, bwd 2.5x that
  int64_t peak_bytes = 0;                          // allocator peak during one step, above what was in use before it
  // The pattern's figures (pattern_stats): visible pairs over the whole problem, the fused kernel's
  // visited / total tiles of tile_q × tile_k (the CPU kernels' grid, mask.h's kTileQ × kTileK;
  // the strided walk reports the logits it computes in such tiles), and the rate on kept pairs: 14·D FLOPs per kept pair (forward
  // QKᵀ and PV: 4·D; backward, five products: 10·D) over the fwd+bwd time. Linear attention
  // reports the causal pairs its state stands for (every one reaches O, none is formed), so time
  // per kept pair compares it with full attention at equal context.
  std::string pattern = "full";
  int64_t kept_pairs = 0, visited_tiles = 0, total_tiles = 0, tile_q = 0, tile_k = 0;
  double kept_gflops = 0, ns_per_kept_pair = 0;
  // versus_full: full causal attention's median fwd+bwd over the rounds and its time per kept pair,
  // and the median over rounds of (the pattern's time per kept pair) / (full's), each round's ratio
  // taken from steps run within about a second of each other (the pattern's median in the round).
  int rounds = 0;
  bool interleaved = false;  // interleave_n: `rounds` rounds, one timed step of this N in each
  double full_ms = 0, full_ns_per_kept_pair = 0, ratio_vs_full = 0;
};

std::vector<AttentionBenchResult> bench_attention(const AttentionBenchOptions& opt = {});

}  // namespace qkv::attn
