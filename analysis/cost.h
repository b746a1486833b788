// The cost model behind `qkv cost`: what a config's model costs, computed from the config alone
// (no weights, no run): parameters, FLOPs per token (training, prefill, decode) split by part,
// bytes of activations kept for backward, of attention weights, of the KV cache, and the peak
// tensor bytes of a training step. Tests hold it to reality: parameters equal the built model's,
// training FLOPs the count `qkv bench --what step` reports, KV-cache bytes what make_cache
// allocates, and the step's peak tensor bytes the allocator's peak within 15%.
//
// Legend: L layers, C n_embd, Hq/Hkv query/kv heads, hd = C/Hq, F ffn_hidden, V vocab, B batch,
// T training tokens per row (train.seq_len), N the inference context (--context, default block_size),
// P(n) the (query, key) pairs the attention pattern keeps over n tokens.
//
// FLOP conventions (those of `qkv bench --what step`, so the two agree):
//   forward, per token: 2 per non-embedding parameter (a multiply-add per weight; biases and norm
//     gains counted alike), 2·C·V for the LM head, and for attention 2·C·P(n)/n each for QKᵀ and
//     for AV (every kept pair costs hd multiply-adds per query head, in each product);
//   training (forward + backward) = 3 × forward (backward computes two products per forward one);
//   prefill of N tokens: the forward of N tokens (logits for all of them, as the model computes);
//   decode at context N: one token's forward, its query reading the keys the pattern keeps for the
//     query at position N - 1.
//   Embedding lookups, position additions, softmax and the loss are not counted.
// bench's attention term is 6·L·B·T²·C per step, i.e. P(T) = T²/2; this model uses the exact
// causal count T(T+1)/2, so for full attention it exceeds bench's count by exactly 6·L·C per
// token (the diagonal), which the test asserts.
//
// Memory conventions: float32 tensors (4 bytes) unless stated; the activations kept for backward
// are the tensors the autograd nodes of one training step save (listed per family in cost.cpp),
// counted once even when several nodes share them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/transformer.h"
#include "train/config.h"

namespace qkv::analysis {

// ---- attention patterns (table-driven: a new pattern adds one row) ----
// An attention pattern's cost is what it keeps of the causal (query, key) pairs. Each row states it
// as two functions of the model's settings, so a pattern implemented in attention/ can point its
// row at the attention module's own count.
struct PatternCost {
  std::string name;         // the pattern ("full", "window", ...)
  std::string description;  // one line: which keys a query at position i reads
  // Keys the query at 0-based position i reads (i + 1 for full causal attention).
  std::function<int64_t(const nn::ModelConfig&, int64_t i)> keys_at;
  // Pairs kept over n tokens: Σ_{i<n} keys_at(i), given in closed form where there is one.
  std::function<int64_t(const nn::ModelConfig&, int64_t n)> kept_pairs;
  // Whether this row describes `cfg`'s attention.
  std::function<bool(const nn::ModelConfig&)> matches;
};
// model.attention_pattern = linear: the kept pairs are those of the chunked training form (each
// chunk of c = model.linear_chunk keys computes its c × c causal quadratic form; no N × N weights);
// the model's FLOPs then count, per token and layer with m features (linear_feature_count) and
// Dv = hd: qk = 2·Hq·m·(1 + chunk keys per query) (Φ·z and A = ΦΨᵀ), av = 2·Hq·(m·Dv + Dv·chunk
// keys per query) + 2·Hkv·m·(Dv + 1) (ΦᵀS, A·v and the state update Ψvᵀ and Ψ). Prefill and decode run
// the recurrence (LinearState: chunk keys 0), so decode costs the same at every context. Instead of
// a KV cache it decodes from S [m, Dv] and z [m] per kv head, float64: decode_state_bytes; the KV
// bytes per token are then 0 and the per-sequence figures are the state.
// Every pattern the cost model knows, most specific first ("full" last: it matches anything).
const std::vector<PatternCost>& pattern_costs();
// The row for `cfg`'s attention.
const PatternCost& pattern_cost(const nn::ModelConfig& cfg);
// linear attention's feature count m (favor: model.linear_features; elu1, relu: the head size).
int64_t linear_feature_count(const nn::ModelConfig& cfg);

// ---- the report ----
// FLOPs of one token, by part. `norm` holds the norms' gains and biases (2 per parameter).
struct FlopSplit {
  double projections = 0, qk = 0, av = 0, mlp = 0, head = 0, norm = 0;
  double total() const { return projections + qk + av + mlp + head + norm; }
  FlopSplit& operator+=(const FlopSplit& o);
};

struct LayerCost {
  int64_t index = 0;
  int64_t params = 0;  // the block's parameters (norms, attention, MLP)
  int64_t attention_params = 0, mlp_params = 0, norm_params = 0;
  FlopSplit train, prefill, decode;        // per token (train: per token of a T-token row)
  int64_t activation_bytes = 0;            // kept for backward over one step (B·T tokens), no recompute
  int64_t activation_bytes_recompute = 0;  // with train.recompute: the block's input only
  int64_t attn_weights_naive_bytes = 0;    // B·Hq·T·T float32 probabilities a naive kernel keeps
  int64_t attn_fused_kept_bytes = 0;       // what the fused kernel keeps: O [B,T,Hq·hd] + lse [B,Hq,T]
  int64_t kv_cache_bytes_per_token_f32 = 0, kv_cache_bytes_per_token_bf16 = 0;  // this layer's K and V
  int64_t kept_pairs_train = 0, kept_pairs_context = 0;                         // P(T), P(N) per (batch row, head)
  int64_t decode_state_bytes = 0;  // linear: S and z of this layer for one sequence (else 0)
};

struct CostOptions {
  int64_t context = 0;  // N for prefill / decode / KV cache; 0 = block_size
  int64_t vocab = 0;    // vocabulary when model.vocab_size is 0 (the tokenizer's); 0 = ask the data
};

struct CostReport {
  nn::ModelConfig model;                                               // resolved
  std::string pattern;                                                 // the pattern row's name
  int64_t batch = 0, train_tokens = 0, context = 0;                    // B, T, N
  bool recompute = false;                                              // the config's train.recompute
  int64_t params = 0, embedding_params = 0, non_embedding_params = 0;  // tied embeddings once
  FlopSplit train, prefill, decode;                                    // per token, whole model
  double train_flops_per_step = 0;                                     // train.total() · B · T
  double prefill_flops = 0;                                            // prefill.total() · N (the whole prompt)
  int64_t kv_cache_bytes_per_token_f32 = 0, kv_cache_bytes_per_token_bf16 = 0;          // all layers, the config's Hkv
  int64_t kv_cache_bytes_per_token_mha_f32 = 0, kv_cache_bytes_per_token_mha_bf16 = 0;  // as if Hkv = Hq
  int64_t kv_cache_bytes_per_sequence_f32 = 0, kv_cache_bytes_per_sequence_bf16 = 0;    // · N
  int64_t kept_pairs_train = 0, kept_pairs_context = 0, full_pairs_context = 0;         // P(T), P(N), N(N+1)/2
  int64_t decode_state_bytes = 0;  // linear: the recurrent state of one sequence, all layers (else 0)
  int64_t activation_bytes = 0, activation_bytes_recompute = 0;     // whole step, kept for backward
  int64_t attn_weights_naive_bytes = 0, attn_fused_kept_bytes = 0;  // whole model, one step
  // Tensor bytes in use at the peak of a training step (params, AdamW moments, gradients,
  // activations, logits and the transients of backward), with the config's recompute setting.
  // Under the row tree (invariant numerics on the CPU: one row at a time) the activations are one
  // row's, plus the flat gradient and a held row's gradients.
  int64_t peak_step_bytes = 0;
  bool row_tree = false;       // the step runs its rows alone (docs/distributed.md, "Split invariance")
  int64_t row_tree_bytes = 0;  // row tree: its blocks at most (outside the tensor allocator), else 0
  int64_t state_bytes = 0;     // params + AdamW moments (+ gradients once backward has made them)
  std::vector<LayerCost> layers;
};

// The cost of `cfg` (resolved first). Throws qkv::Error naming the key when the config has no
// vocabulary (model.vocab_size = 0 and no data to ask) or the context is < 1. Parameter and byte
// figures are exact int64 counts (overflow-checked arithmetic): one past 2^63 - 1 (reachable at the
// ends of the batch and length ranges) is refused naming the figure and the keys it grows with,
// with their values. FLOP figures are doubles (finite at every size the ranges allow). Allocates
// nothing that grows with the model but the per-layer list (model.n_layer <= 1024 entries).
CostReport estimate_cost(const Config& cfg, const CostOptions& o = {});

// --json: {params, embedding_params, non_embedding_params, kv_cache_bytes_per_token {f32, bf16},
// kv_cache_bytes_per_token_mha {f32, bf16}, kv_cache_bytes_per_sequence {f32, bf16, context},
// flops_per_token {train, prefill, decode}, flops_split {train, prefill, decode: {projections, qk,
// av, mlp, head, norm}}, train_flops_per_step, prefill_flops, pattern, kept_pairs {train, context,
// full_context}, activation_bytes {no_recompute, recompute}, attention_weights_bytes {naive,
// fused}, decode_state_bytes, peak_step_bytes, row_tree_bytes (0 without the row tree), batch,
// train_tokens, context, layers: [...]}.
nlohmann::json cost_json(const CostReport& r);
// The human-readable tables.
std::string cost_table(const CostReport& r);

}  // namespace qkv::analysis
