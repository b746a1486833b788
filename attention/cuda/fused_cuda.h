// Internal to attention/: the CUDA fused attention kernels (attention/cuda/fused_attention.cu),
// built only with QKV_WITH_CUDA. Same math as the CPU fused kernel (attention.h): only O and the
// row log-sum-exp are saved, P is recomputed in backward, extra memory is O(N·D). This first
// version is written for correctness and memory, not speed: one warp per query row (forward, dQ)
// or per key row (dK, dV, summing the G query heads of a group in order), keys or queries visited
// one at a time, so every sum runs in a fixed order (deterministic, no atomics).
//
// Supported: causal (bottom-right), window, key_lengths, key_padding, segment_ids, ALiBi,
// dropout (the Philox draw of attention.h, bit for bit the CPU's), GQA/MQA, float32/float64,
// head dims up to 256, and every sparse pattern (attention/pattern/pattern.h). A bias, an allow_mask or
// explicit mask rules take the reference path instead.
//
// Sparse patterns: the tiled kernels walk the pattern's block layout (patterns.h) on their own tile
// grids (forward and dQ: 8 query rows × the key tile; dK/dV: the query tile × 8 keys), built on the
// host once per (pattern, shape) and uploaded once (an LRU of device copies beside the CPU's layout
// cache). Empty tiles are never staged; full tiles apply no pattern or structural mask per element
// (key lengths and the elementwise masks still apply); partial tiles evaluate the pattern's
// predicate per element on the device (pattern_allows in pattern_predicate.cuh: arithmetic on positions,
// plus small tables for bigbird's random blocks and block_sparse layout files). The tensor-core
// kernels (mma_attention.h) walk the same kind of layout on their own 64 × 64 grid.
#pragma once
#include <memory>
#include <vector>

#include "attention/attention.h"
#include "attention/cuda/device_pattern.h"
#include "attention/cpu/fused.h"
#include "attention/mask.h"

namespace qkv::attn::cuda_fused {

// The device-side mask, plain values and device pointers (owned by `keep`).
struct DeviceMask {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 1, Nq = 0, Nk = 0, q_offset = 0, window = 0;
  bool causal_like = false;
  const int64_t* key_len = nullptr;  // [B]
  const bool* key_pad = nullptr;     // [B, Nk] with strides kp_sb, kp_sj
  int64_t kp_sb = 0, kp_sj = 0;
  const int64_t* seg = nullptr;  // [B, Nk] contiguous
  const float* alibi = nullptr;  // [Hq]
  bool drop = false;
  uint32_t k0 = 0, k1 = 0, c3 = 0, thr = 0;
  double keep_scale = 1;
  DevicePattern pat;        // kind 0: no sparse pattern
  DeviceLayout by_q, by_k;  // with a pattern: forward/dQ walk (CSR), dK/dV walk (CSC)
};

struct Plan {
  Problem p;
  DeviceMask m;
  std::vector<Tensor> keep;
};

// True when the CUDA kernels handle these options (else the caller uses the reference path).
bool supported(const AttentionOptions& o, const Problem& p);
// The kernels a plan is made for: a sparse pattern's layout walks are on their tile grids (the
// tiled kernels' above; the tensor-core kernels' kTensorCoreTile × kTensorCoreTile).
enum class KernelSet { tiled, tensor_core };
constexpr int64_t kTensorCoreTile = 64;
std::shared_ptr<const Plan> make_plan(const AttentionOptions& o, const Problem& p,
                                      KernelSet kernels = KernelSet::tiled);

// The tiles one kernel visits under the plan's sparse pattern, counted from the device copy of its
// walk (tests: the count of the independent brute-force layout). by_key: the dK/dV walk.
struct TileWalk {
  int64_t tq = 0, tk = 0, visited = 0, full = 0, total = 0;
};
TileWalk tile_walk(const Plan& plan, bool by_key);

// out [B, Hq, Nq, Dv] contiguous, lse [B, Hq, Nq] (−inf on rows with no visible key).
FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const Plan& plan);
// dq, dk, dv contiguous, shaped like q, k, v.
FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Plan& plan);

}  // namespace qkv::attn::cuda_fused
