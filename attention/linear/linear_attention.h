// Linear attention (Katharopoulos et al. 2020, Transformers are RNNs; Choromanski et al. 2021,
// Performer): softmax's exp(q·k) replaced by a feature map, φ(q)·φ(k), so the keys fold into a
// state of fixed size and cost is O(N·m·Dv) instead of O(N²·D). One fused op with a hand-written
// backward (one autograd node, LinearAttentionBackward) and a recurrent state for decoding.
//
// Shapes:  q [B, Hq, Nq, D]   k [B, Hkv, Nk, D]   v [B, Hkv, Nk, Dv]   out [B, Hq, Nq, Dv]
//          Hq % Hkv == 0, query head h reads kv head h / G (GQA), as in attention/attention.h.
//          Causal calls need Nq == Nk (query i is key i); decoding continues a sequence through
//          LinearState (below) instead of a longer key range.
//
// Scale: s = opts.scale (0 -> 1/sqrt(D)) is split between the two sides, q~ = √s·q, k~ = √s·k, so
// that φ(q~)·φ(k~) stands in for exp(s·q·k) (exactly so in expectation for favor).
//
// Feature maps φ: R^D -> R^m (all ≥ 0, so every weight below is ≥ 0):
//   elu1   φ(x) = elu(x) + 1 = x + 1 (x > 0), exp(x) (x ≤ 0)          m = D   φ' = 1 or exp(x)
//   relu   φ(x) = max(x, 0)                                          m = D   φ' = [x > 0]
//   favor  φ(x)_r = exp(w_rᵀx − |x|²/2) / √m, r < m, w_r ~ N(0, I_D)      (positive random features)
//          E_w[φ(x)·φ(y)] = exp(xᵀy). The exponent is ≤ |w_r|²/2 (complete the square), so it never
//          overflows and needs no stabiliser (a data-dependent one over the keys would let future
//          keys scale past outputs). W [m, D] is a constant of the call (no gradient):
//          ∂φ_r/∂x = φ_r·(w_r − x), so dx = Wᵀ(dφ∘φ) − x·Σ_r dφ_r φ_r.
//          Redraw policy (favor_projection): W is a pure function of (seed, offset, m, D); the model
//          draws one per layer from a fixed seed and the layer index and NEVER redraws it, so train,
//          eval, decode, resume and every device see the same features and checkpoints need not store W.
//
// Forward, per (b, h), with Φ_i = φ(q~_i), Ψ_j = valid_j · φ(k~_j) (a padded key contributes nothing):
//   non-causal   S = Σ_j Ψ_j v_jᵀ [m, Dv]     z = Σ_j Ψ_j [m]             (one pass over the keys)
//   causal       S_i = Σ_{j ≤ i} Ψ_j v_jᵀ     z_i = Σ_{j ≤ i} Ψ_j
//   num_i = Φ_iᵀ S_i [Dv]     den_i = Φ_i·z_i + ε     O_i = num_i / den_i
// A query that sees no valid key (or whose features are all 0 under relu) gets den = ε, O = 0:
// never NaN. ε = opts.eps (default 1e-6); den is saved for backward (like lse for softmax).
//
// Segments (packed documents): visibility also needs run(j) == run(i); the prefix state holds only
// the current run's keys (it restarts at a run start), a query reads it only when its run began
// before the chunk, and in backward the suffix state R⁺ likewise only reaches keys of its own run.
//
// Causal, chunked (exact, parallel in training): chunks C = [c0, c1) of c = opts.chunk keys; S⁻, z⁻
// the state of the keys before c0 (a running prefix sum across chunks). For i ∈ C:
//   A_ij = Φ_i·Ψ_j for j ∈ C, j ≤ i (0 for j > i)              (c × c, the masked quadratic form)
//   num_i = Φ_iᵀ S⁻ + Σ_j A_ij v_j      den_i = Φ_i·z⁻ + Σ_j A_ij + ε
//   then S⁻ += Σ_{j∈C} Ψ_j v_jᵀ, z⁻ += Σ_{j∈C} Ψ_j.
// Equal to the causal line above for every c ≥ 1 (c = 1 is the recurrence, c ≥ N the quadratic form).
//
// Backward, given dO (the vjp of each line above, in reverse):
//   dnum_i = dO_i / den_i          dden_i = −(dO_i·O_i) / den_i
//   non-causal   dΦ_i = S·dnum_i + z·dden_i
//                R = Σ_i Φ_i dnum_iᵀ [m, Dv]   r = Σ_i Φ_i dden_i [m]
//                dΨ_j = R·v_j + r              dv_j = Rᵀ·Ψ_j
//   causal       dΦ_i = S_i·dnum_i + z_i·dden_i
//                R_j = Σ_{i ≥ j} Φ_i dnum_iᵀ    r_j = Σ_{i ≥ j} Φ_i dden_i   (suffix sums: the state
//                dΨ_j = R_j·v_j + r_j           dv_j = R_jᵀ·Ψ_j               gradients, in reverse order)
//   chunked: dA_ij = v_j·dnum_i + dden_i (j ≤ i in C, else 0); a forward sweep over chunks gives
//     dΦ_i = S⁻·dnum_i + z⁻·dden_i + Σ_j dA_ij Ψ_j, a reverse sweep with R⁺, r⁺ = the sums over
//     later chunks gives dΨ_j = R⁺v_j + r⁺ + Σ_i dA_ij Φ_i and dv_j = R⁺ᵀΨ_j + Σ_i A_ij dnum_i,
//     then R⁺ += Σ_{i∈C} Φ_i dnum_iᵀ, r⁺ += Σ_{i∈C} Φ_i dden_i. No state is stored: memory is
//     O(N·(m + Dv)) per thread, never N × N.
//   then dq = √s·φ'-vjp(q~, dΦ), dk = √s·valid·φ'-vjp(k~, dΨ), dk and dv summed over the G query
//   heads of a kv group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/tensor.h"

namespace qkv::attn {

enum class LinearFeature { elu1, relu, favor };
const char* linear_feature_name(LinearFeature f);
// "elu1", "relu", "favor"; throws naming `key` and the accepted names otherwise.
LinearFeature parse_linear_feature(const std::string& name, const std::string& key = "linear_feature");

struct LinearAttentionOptions {
  LinearFeature feature = LinearFeature::elu1;
  bool causal = false;
  int64_t chunk = 64;  // c: keys per chunk of the causal form (any c ≥ 1 gives the same values)
  double scale = 0;    // 0 -> 1/sqrt(D); √scale multiplies q and k before φ
  double eps = 1e-6;   // ε of the normaliser
  Tensor key_padding;  // optional bool [B, Nk], true = valid key
  Tensor segment_ids;  // optional int [B, Nk], causal only: key j visible to query i only when
                       // seg[b, j] == seg[b, i]; each segment must be one contiguous run (packed
                       // documents), so the prefix state simply restarts where a run begins
  Tensor projection;   // favor: W [m, D] (favor_projection), a constant; unused otherwise
  // The in-chunk rule of the causal form, as a value (like attention's MaskRules): within a chunk,
  // key j is visible to query i iff j - i < chunk_key_hi. 1 is causal (j <= i), what the library
  // always uses; tests and leakcheck's self-test set a larger one on purpose (later keys of the
  // chunk leak in) to prove that their detectors notice.
  int64_t chunk_key_hi = 1;
};

// Number of features m that `o` gives for head size D (D for elu1/relu, rows of W for favor).
int64_t linear_feature_dim(const LinearAttentionOptions& o, int64_t D);

// Performer's W [m, D]: iid N(0, 1) entries drawn by randn(seed, offset) (tensor/ops.h), f32.
Tensor favor_projection(int64_t m, int64_t D, uint64_t seed, uint64_t offset = 0);
// The model's W for a layer: favor_projection(m, D, kFavorSeed, layer << 40), never redrawn.
constexpr uint64_t kFavorSeed = 0x1f7a0a77e5eedULL;
Tensor favor_projection_for_layer(int64_t m, int64_t D, int64_t layer);

// Differentiable in q, k, v (float32 or float64, CPU; CUDA where built). Records ONE autograd
// node (LinearAttentionBackward) whose backward is the hand-written vjp above.
Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& opts = {});

// The recurrent form for decoding: per (b, kv head) the state S [m, Dv] and z [m] of every key
// seen so far (S and z depend on keys and values only, so GQA shares them like it shares the KV
// cache) — O(B·Hkv·m·Dv) memory, constant in the sequence length (the linear
// counterpart of KVCache). step() takes n ≥ 1 new tokens (a chunk of a prompt, or one token) and,
// token by token, adds Ψ_t v_tᵀ to S and Ψ_t to z, then reads O_t = Φ_tᵀS / (Φ_t·z + ε): exactly
// the causal formula above, continued. Inference only (no gradient).
class LinearState {
 public:
  LinearState(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim,
              const LinearAttentionOptions& opts);
  // q [B, Hq, n, D], k [B, Hkv, n, D], v [B, Hkv, n, Dv] -> out [B, Hq, n, Dv]. `key_padding`, when
  // defined, is [B, n] for these n tokens (a padded token adds nothing to the state).
  Tensor step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding = Tensor());
  int64_t length() const { return length_; }
  void clear();
  // Bytes held by the state (S and z): independent of length().
  int64_t state_bytes() const;

 private:
  LinearAttentionOptions opts_;
  int64_t B_, Hq_, Hkv_, D_, Dv_, m_, length_ = 0;
  std::vector<double> S_, z_;  // [B, Hkv, m, Dv], [B, Hkv, m] (float64 accumulators)
  Tensor W_;                   // favor: W [m, D] as float64
};

// Gradcheck cases of the linear op: every φ × {non-causal, causal} × chunk boundary (c = 1, c
// not dividing N, c = N), with GQA and key padding; case names contain "linear".
void register_linear_attention_gradchecks(autograd::GradcheckRegistry& r);

}  // namespace qkv::attn
