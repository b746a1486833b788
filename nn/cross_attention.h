// Cross-attention (Vaswani et al. 2017, §3.2.3, "encoder-decoder attention"): the queries come from
// the sequence being produced, the keys and values from another one, the memory (an encoder's
// output, retrieved context). The math is the attention op's (attention/attention.h) with Nq ≠ Nk:
// the same fused kernel and the same hand-derived backward, so gradients flow into the memory.
//
// Legend: B batch, Nq queries, Nk memory rows, C d_model, Cm d_memory, Hq/Hkv query/kv heads,
// hd head_dim (default C / Hq).
//   Q = x·Wqᵀ + bq          x [B, Nq, C]        Wq [Hq·hd, C]     -> Q [B, Hq, Nq, hd]
//   K = m·Wkᵀ + bk          m [B, Nk, Cm]       Wk [Hkv·hd, Cm]   -> K [B, Hkv, Nk, hd]
//   V = m·Wvᵀ + bv                              Wv [Hkv·hd, Cm]   -> V [B, Hkv, Nk, hd]
//   A_h = softmax_j(Q_h·K_{h/G}ᵀ / sqrt(hd), masked where memory row j is padding) · V_{h/G}
//   out = concat_h(A_h)·Woᵀ + bo                Wo [C, Hq·hd]     -> out [B, Nq, C]
// with G = Hq / Hkv (GQA; Hkv == 1 is MQA). Parameter names follow Hugging Face's encoder-decoder
// attention: q_proj, k_proj, v_proj, o_proj (each .weight, and .bias when bias is on).
//
// Masks: the memory's key padding only (a bool [B, Nk], true = real row, or lengths). There is NO
// causal option, by design: query i and memory row j index different sequences, so "j <= i" means
// nothing, and the op's bottom-right alignment (query i at Nk - Nq + i) would silently hide memory
// rows j > Nk - Nq + i from query i. Causality belongs to the decoder's own self-attention. A query row whose memory is all padding yields a zero row (never NaN).
//
// RoPE is off by default: rotating q by its position in one sequence and k by its position in
// another makes the score depend on i - j, a difference of unrelated indices. With rope = true the
// caller asks for exactly that (positions default to 0..Nq-1 and 0..Nk-1, or are given).
#pragma once
#include <cstdint>
#include <vector>

#include "attention/attention.h"
#include "autograd/gradcheck.h"
#include "nn/layers.h"

namespace qkv::nn {

struct CrossAttentionConfig {
  int64_t d_model = 64, d_memory = 64;  // C, Cm
  int64_t n_head = 4, n_kv_head = 4;    // Hq, Hkv (n_head % n_kv_head == 0)
  int64_t head_dim = 0;                 // hd; 0 -> d_model / n_head (then d_model % n_head == 0)
  bool bias = true;
  bool rope = false;  // rotate q and k by their own sequences' positions
  double rope_theta = 10000.0;
  double attn_dropout = 0.0;  // on the attention weights, training mode only
  attn::Kernel kernel = attn::Kernel::fused;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  // Sizes > 0, n_head % n_kv_head == 0, a head_dim that fits, an even head_dim with RoPE, dropout in
  // [0, 1). Throws qkv::Error naming the field ("cross_attention.n_head ...").
  void validate() const;
};

// Per call: the memory's padding and, with RoPE, the positions.
struct CrossAttentionArgs {
  Tensor memory_padding;                // optional bool [B, Nk], true = real memory row
  std::vector<int64_t> memory_lengths;  // optional: rows [0, len_b) real in batch row b
  Tensor q_positions, k_positions;      // optional int [Nq] / [B, Nq] and [Nk] / [B, Nk] (RoPE only)
  RngContext* rng = nullptr;            // attention dropout stream (training with attn_dropout > 0)
};

// The parameters as plain tensors (float32 or float64; biases undefined when off).
struct CrossAttentionWeights {
  Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
};

// The whole computation above as a function of its tensors, differentiable in x, memory and every
// weight; the module calls it, and the gradcheck cases call it in float64. `training` enables
// attention dropout (then args.rng is required).
Tensor cross_attention(const Tensor& x, const Tensor& memory, const CrossAttentionWeights& w,
                       const CrossAttentionConfig& cfg, const CrossAttentionArgs& args = {}, bool training = false);

class CrossAttention : public Module {
 public:
  explicit CrossAttention(const CrossAttentionConfig& cfg);
  const CrossAttentionConfig& config() const { return cfg_; }
  // x [B, Nq, C], memory [B, Nk, Cm] -> [B, Nq, C]
  Tensor forward(const Tensor& x, const Tensor& memory, const CrossAttentionArgs& args = {}) const;
  CrossAttentionWeights weights() const;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  CrossAttentionConfig cfg_;
};

// Gradcheck cases (op "cross_attention"): MHA/GQA/MQA, Nq ≠ Nk, padded memory (mask and lengths),
// RoPE on, dropout, a memory row of all padding; differentiated in x, memory and every weight.
void register_cross_attention_gradchecks(autograd::GradcheckRegistry& r);

}  // namespace qkv::nn
