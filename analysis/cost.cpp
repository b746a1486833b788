#include "analysis/cost.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "attention/attention.h"
#include "attention/pattern/pattern.h"
#include "tensor/error.h"
#include "train/model_factory.h"
#include "train/session.h"

namespace qkv::analysis {

FlopSplit& FlopSplit::operator+=(const FlopSplit& o) {
  projections += o.projections;
  qk += o.qk;
  av += o.av;
  mlp += o.mlp;
  head += o.head;
  norm += o.norm;
  return *this;
}

namespace {

// A count that cannot overflow silently: + - * are exact in int64 (__builtin_*_overflow), or mark
// the result out of range, which every later result built on it stays. A report figure is taken
// from it by figure(), which refuses an out-of-range count by name.
class Count {
 public:
  Count(int64_t v = 0) : v_(v) {}  // NOLINT: implicit, so that 2 * c and c + 1 read as formulas
  friend Count operator+(Count a, Count b) {
    Count r;
    r.over_ = a.over_ || b.over_ || __builtin_add_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  friend Count operator-(Count a, Count b) {
    Count r;
    r.over_ = a.over_ || b.over_ || __builtin_sub_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  friend Count operator*(Count a, Count b) {
    Count r;
    r.over_ = a.over_ || b.over_ || __builtin_mul_overflow(a.v_, b.v_, &r.v_);
    return r;
  }
  friend Count operator/(Count a, int64_t d) {  // d > 0
    Count r = a;
    r.v_ = a.v_ / d;
    return r;
  }
  Count& operator+=(Count b) { return *this = *this + b; }
  Count& operator-=(Count b) { return *this = *this - b; }
  friend Count max(Count a, Count b) {
    Count r = a.v_ >= b.v_ ? a : b;
    r.over_ = a.over_ || b.over_;
    return r;
  }
  bool over() const { return over_; }
  int64_t value() const { return v_; }  // meaningful only when !over()
  double real() const { return static_cast<double>(v_); }

 private:
  int64_t v_ = 0;
  bool over_ = false;
};

FlopSplit scaled(FlopSplit f, double s) {
  f.projections *= s;
  f.qk *= s;
  f.av *= s;
  f.mlp *= s;
  f.head *= s;
  f.norm *= s;
  return f;
}

// Σ_{i<n} min(i + 1, w): the first w queries read every earlier key, the rest w keys each.
int64_t window_pairs(int64_t n, int64_t w) {
  if (n <= w) return n * (n + 1) / 2;
  return w * (w + 1) / 2 + (n - w) * w;
}

// The options the model's softmax attention call carries (nn/transformer.cpp: causal, model.window,
// the resolved pattern), so the counts below are the attention module's own.
attn::AttentionOptions model_attention_options(const nn::ModelConfig& c) {
  attn::AttentionOptions o;
  o.causal = true;
  o.window = c.window;
  if (c.pattern.sparse()) o.pattern = std::make_shared<const attn::SparsePattern>(c.pattern);
  return o;
}

// Visible pairs of one (batch row, head) slice for nq queries ending at key nk - 1 (bottom-right).
int64_t module_pairs(const nn::ModelConfig& c, int64_t nq, int64_t nk) {
  return attn::pattern_stats({1, 1, 1, nq, nk}, model_attention_options(c)).kept_pairs;
}

// Linear attention's chunked training form computes, per chunk of c keys, the masked c × c
// quadratic form: Σ over the chunks of n tokens of len(len + 1)/2 pairs.
int64_t chunk_pairs(int64_t n, int64_t c) {
  c = std::max<int64_t>(c, 1);
  const int64_t full = n / c, rest = n % c;
  return full * (c * (c + 1) / 2) + rest * (rest + 1) / 2;
}

}  // namespace

int64_t linear_feature_count(const nn::ModelConfig& c) {
  return c.linear_feature == attn::LinearFeature::favor ? c.linear_features : c.head_dim();
}

const std::vector<PatternCost>& pattern_costs() {
  // Rows for the patterns in this build, most specific first. The sparse rows count with
  // attn::pattern_stats on the model's own attention options (the resolved pattern of
  // train::model_config, ANDed with causal and model.window), so the cost is the module's count;
  // full and window keep their closed forms (the test checks they agree with the module too).
  auto sparse_row = [](attn::Pattern kind, std::string description) {
    return PatternCost{attn::pattern_name(kind), std::move(description),
                       [](const nn::ModelConfig& c, int64_t i) { return module_pairs(c, 1, i + 1); },
                       [](const nn::ModelConfig& c, int64_t n) { return module_pairs(c, n, n); },
                       [kind](const nn::ModelConfig& c) {
                         return c.attention_pattern == nn::AttentionPattern::full && c.pattern.kind == kind;
                       }};
  };
  static const std::vector<PatternCost> table = {
      {"linear",
       "no weights: chunked training form (c x c causal pairs per chunk of model.linear_chunk keys) + a state "
       "S [m, Dv], z [m] per kv head; decode reads the state, not the keys",
       [](const nn::ModelConfig&, int64_t) { return int64_t{0}; },
       [](const nn::ModelConfig& c, int64_t n) { return chunk_pairs(n, c.linear_chunk); },
       [](const nn::ModelConfig& c) { return c.attention_pattern == nn::AttentionPattern::linear; }},
      sparse_row(attn::Pattern::strided, "strided: a local band + every s-th key (model.pattern_stride, _local)"),
      sparse_row(attn::Pattern::global, "global: global positions read and are read by all + a local band"),
      sparse_row(attn::Pattern::bigbird, "bigbird: local, global and random key blocks (model.pattern_block_size)"),
      sparse_row(attn::Pattern::block_sparse, "block_sparse: the visible block pairs of model.pattern_layout"),
      sparse_row(attn::Pattern::window, "window pattern: the l most recent keys (model.pattern_local)"),
      {"window", "query i reads keys max(0, i - w + 1) .. i (model.window = w)",
       [](const nn::ModelConfig& c, int64_t i) { return std::min(i + 1, c.window); },
       [](const nn::ModelConfig& c, int64_t n) { return window_pairs(n, c.window); },
       [](const nn::ModelConfig& c) { return c.window > 0; }},
      {"full", "causal: query i reads keys 0 .. i", [](const nn::ModelConfig&, int64_t i) { return i + 1; },
       [](const nn::ModelConfig&, int64_t n) { return n * (n + 1) / 2; }, [](const nn::ModelConfig&) { return true; }},
  };
  return table;
}

const PatternCost& pattern_cost(const nn::ModelConfig& cfg) {
  for (const auto& p : pattern_costs())
    if (p.matches(cfg)) return p;
  return pattern_costs().back();
}

namespace {

// Floats per token that one block's autograd nodes keep for backward (training, no recompute),
// from nn/transformer.cpp and the rules they record:
//   both norms: the input (counted as the block input x and the residual h) and per-row stats
//     (LayerNorm mean + rstd, RMSNorm rstd); each norm's output (saved by the next linear).
//   attention, packed path (gpt2 fused c_attn, no RoPE): the qkv projection (q, k, v read in place),
//     the output O [T, Hq·hd] (saved by attention and by c_proj), lse [Hq] per token.
//   attention with RoPE: the rotated q and k (new tensors), v (a view that keeps its projection
//     alive: the whole fused qkv for gpt2, v_proj's output otherwise), O head-major (attention)
//     and its token-major contiguous copy (c_proj), lse.
//   reference kernel: additionally the probabilities, Hq·(kept keys) per token (softmax output).
//   MLP: GELU/ReLU keep the pre-activation and the activation (2F); SwiGLU keeps gate and up (2F),
//     silu(gate) and the product (2F).
struct BlockFloats {
  Count per_token = 0;      // floats per token, independent of the context
  Count per_pair_head = 0;  // floats per kept (query, key) pair and query head (reference kernel)
};

BlockFloats block_activation_floats(const nn::ModelConfig& c) {
  const Count C = c.n_embd, hd = c.head_dim(), qd = c.n_head * hd, kvd = c.n_kv_head * hd, Hq = c.n_head,
              F = c.ffn_hidden;
  const Count stats = c.norm == nn::NormKind::layernorm ? 2 : 1;
  BlockFloats b;
  b.per_token = C /*x*/ + stats + C /*ln1 out*/ + C /*h*/ + stats + C /*ln2 out*/;
  const bool gpt2 = c.family == nn::Family::gpt2;
  const bool rope = c.position == nn::Position::rope;
  if (gpt2 && !rope) {
    b.per_token += (qd + 2 * kvd) + qd + Hq;
  } else {
    const Count kept_v = gpt2 ? (qd + 2 * kvd) : kvd;
    b.per_token += qd + kvd + kept_v + 2 * qd + Hq;
  }
  if (c.attn_kernel == attn::Kernel::reference) b.per_pair_head = 1;
  b.per_token += c.activation == nn::Activation::swiglu ? 4 * F : 2 * F;
  return b;
}

int64_t resolve_vocab(const Config& cfg, const CostOptions& o) {
  if (cfg.model.vocab_size > 0) return cfg.model.vocab_size;
  if (o.vocab > 0) return o.vocab;
  QKV_CHECK(!cfg.data.path.empty() || cfg.data.random_tokens,
            "model.vocab_size is 0 (the tokenizer's) and data.path is empty: set model.vocab_size or pass --vocab");
  return train::load_run_data(cfg).vocab_size;
}

}  // namespace

CostReport estimate_cost(const Config& cfg_in, const CostOptions& o) {
  const Config cfg = cfg_in.resolved();
  const nn::ModelConfig m = train::model_config(cfg, resolve_vocab(cfg, o));
  const PatternCost& pat = pattern_cost(m);
  CostReport r;
  r.model = m;
  r.pattern = pat.name;
  r.batch = cfg.train.batch_size;
  r.row_tree = cfg.train.resolved_numerics() == Numerics::invariant;
  r.train_tokens = cfg.train.resolved_seq_len(m.block_size);
  r.context = o.context > 0 ? o.context : m.block_size;
  QKV_CHECK(o.context >= 0, "--context must be >= 1, got ", o.context);
  r.recompute = cfg.train.recompute;

  // Every byte and parameter figure is a Count: one that leaves int64 is refused here, naming the
  // figure and the keys it grows with (with their values), never printed wrapped.
  const std::pair<const char*, int64_t> key_values[] = {
      {"model.n_layer", m.n_layer},       {"model.n_embd", m.n_embd},
      {"model.n_head", m.n_head},         {"model.ffn_hidden", m.ffn_hidden},
      {"model.vocab_size", m.vocab_size}, {"train.batch_size", r.batch},
      {"train.seq_len", r.train_tokens},  {"--context", r.context}};
  auto figure = [&](const Count& c, const char* name, std::initializer_list<const char*> keys) {
    if (!c.over()) return c.value();
    std::string grows;
    for (const char* k : keys)
      for (const auto& [key, v] : key_values)
        if (std::string_view(k) == key)
          grows += (grows.empty() ? "" : ", ") + std::string(key) + " = " + std::to_string(v);
    fail("cost: ", name, " exceeds 2^63 - 1 and cannot be stated; it grows with ", grows, ": make them smaller");
  };
  // The keys each family of figures grows with.
  const auto kParams = {"model.n_layer", "model.n_embd", "model.ffn_hidden", "model.vocab_size"};
  const auto kStep = {"model.n_layer", "model.n_embd", "model.ffn_hidden", "train.batch_size", "train.seq_len"};
  const auto kWeights = {"model.n_layer", "model.n_head", "train.batch_size", "train.seq_len"};
  const auto kKv = {"model.n_layer", "model.n_embd", "--context"};

  const Count C = m.n_embd, hd = m.head_dim(), qd = m.n_head * hd, kvd = m.n_kv_head * hd, F = m.ffn_hidden,
              V = m.vocab_size, L = m.n_layer, Hq = m.n_head, B = r.batch, T = r.train_tokens;
  const bool gated = m.activation == nn::Activation::swiglu;
  const Count norm_params = m.norm == nn::NormKind::layernorm && m.bias ? 2 * C : C;
  const Count attn_params = C * (qd + 2 * kvd) + qd * C + (m.bias ? qd + 2 * kvd + C : 0);
  const Count mlp_params = C * (gated ? 2 * F : F) + F * C + (m.bias ? (gated ? 2 * F : F) + C : 0);
  const Count layer_params = 2 * norm_params + attn_params + mlp_params;
  const Count tok_emb = V * C, pos_emb = m.position == nn::Position::learned ? m.block_size * C : 0;
  const Count head_params = m.tie_embeddings ? 0 : C * V;
  const Count params = tok_emb + pos_emb + L * layer_params + norm_params + head_params;
  r.embedding_params = figure(tok_emb + pos_emb, "the embedding parameters", kParams);
  r.non_embedding_params = figure(L * layer_params + norm_params + head_params, "the parameters", kParams);
  r.params = figure(params, "the parameters", kParams);

  const double dC = C.real(), dV = V.real();
  const double dT = T.real(), dN = static_cast<double>(r.context), dB = B.real();
  // Forward FLOPs of one token of a layer given the average keys per query.
  auto layer_forward = [&](double keys_per_query) {
    FlopSplit f;
    f.projections = 2.0 * attn_params.real();
    f.mlp = 2.0 * mlp_params.real();
    f.norm = 2.0 * (2 * norm_params).real();
    f.qk = 2.0 * dC * keys_per_query;  // Hq · hd = C multiply-adds per key
    f.av = 2.0 * dC * keys_per_query;
    return f;
  };
  const int64_t pairs_T = pat.kept_pairs(m, r.train_tokens), pairs_N = pat.kept_pairs(m, r.context);
  r.kept_pairs_train = pairs_T;
  r.kept_pairs_context = pairs_N;
  r.full_pairs_context = figure(Count(r.context) * (r.context + 1) / 2, "the causal pairs of the context", kKv);
  FlopSplit lt = scaled(layer_forward(static_cast<double>(pairs_T) / dT), 3.0);
  FlopSplit lp = layer_forward(static_cast<double>(pairs_N) / dN);
  FlopSplit ld = layer_forward(static_cast<double>(pat.keys_at(m, r.context - 1)));
  const bool linear = m.attention_pattern == nn::AttentionPattern::linear;
  Count state_bytes_layer = 0;  // linear: S [m, Dv] + z [m] per kv head of one sequence (float64)
  if (linear) {
    // Per token, with m features, Dv = hd (linear_attention.h): the query side (Φ·z and ΦᵀS, or
    // the chunk's A = ΦΨᵀ and A·v) per query head, the state update Ψvᵀ, Ψ per kv head.
    const double mf = static_cast<double>(linear_feature_count(m)), Dv = hd.real();
    const double dHq = static_cast<double>(m.n_head), Hkv = static_cast<double>(m.n_kv_head);
    const double update = 2.0 * Hkv * mf * (Dv + 1);
    auto linear_layer = [&](double chunk_keys_per_query) {
      FlopSplit f = layer_forward(0);
      f.qk = 2.0 * dHq * mf * (1 + chunk_keys_per_query);                 // Φ·z⁻ + A_ij
      f.av = 2.0 * dHq * (mf * Dv + Dv * chunk_keys_per_query) + update;  // ΦᵀS⁻ + A·v + state update
      return f;
    };
    // Training: the chunked form over T tokens; prefill and decode: the recurrence (LinearState).
    lt = scaled(linear_layer(static_cast<double>(pairs_T) / dT), 3.0);
    lp = linear_layer(0);
    ld = linear_layer(0);
    const Count mfc = linear_feature_count(m);
    state_bytes_layer = Count(sizeof(double)) * m.n_kv_head * (mfc * hd + mfc);
  }
  FlopSplit top;  // final norm and LM head, forward
  top.norm = 2.0 * norm_params.real();
  top.head = 2.0 * dC * dV;

  // One layer's figures (every layer has the same), then the model's (L of them).
  const BlockFloats bf = block_activation_floats(m);
  const Count BT = B * T;
  const Count layer_act = 4 * (bf.per_token * BT + bf.per_pair_head * B * Hq * pairs_T);
  const Count layer_act_recompute = 4 * C * BT;
  const Count layer_naive = 4 * B * Hq * T * T;
  const Count layer_fused = 4 * (BT * qd + B * Hq * T);
  const Count layer_kv_f32 = linear ? 0 : 4 * 2 * kvd, layer_kv_bf16 = linear ? 0 : 2 * 2 * kvd;
  LayerCost lc;
  lc.params = figure(layer_params, "a layer's parameters", kParams);
  lc.attention_params = figure(attn_params, "a layer's parameters", kParams);
  lc.mlp_params = figure(mlp_params, "a layer's parameters", kParams);
  lc.norm_params = figure(2 * norm_params, "a layer's parameters", kParams);
  lc.train = lt;
  lc.prefill = lp;
  lc.decode = ld;
  lc.activation_bytes = figure(layer_act, "a layer's activations kept for backward", kStep);
  lc.activation_bytes_recompute = figure(layer_act_recompute, "a layer's activations with train.recompute", kStep);
  lc.attn_weights_naive_bytes = figure(layer_naive, "a layer's attention weights a naive kernel stores", kWeights);
  lc.attn_fused_kept_bytes = figure(layer_fused, "a layer's O + lse the fused kernel keeps", kStep);
  lc.kv_cache_bytes_per_token_f32 = figure(layer_kv_f32, "a layer's KV cache per token", kKv);
  lc.kv_cache_bytes_per_token_bf16 = figure(layer_kv_bf16, "a layer's KV cache per token", kKv);
  lc.decode_state_bytes = figure(state_bytes_layer, "a layer's linear decode state", kKv);
  lc.kept_pairs_train = pairs_T;
  lc.kept_pairs_context = pairs_N;
  r.layers.reserve(static_cast<size_t>(m.n_layer));
  for (int64_t l = 0; l < m.n_layer; ++l) {
    lc.index = l;
    r.train += lc.train;
    r.prefill += lc.prefill;
    r.decode += lc.decode;
    r.layers.push_back(lc);
  }
  r.decode_state_bytes = figure(L * state_bytes_layer, "the linear decode state", kKv);
  r.activation_bytes = figure(L * layer_act, "the activations kept for backward", kStep);
  r.activation_bytes_recompute = figure(L * layer_act_recompute, "the activations with train.recompute", kStep);
  r.attn_weights_naive_bytes = figure(L * layer_naive, "the attention weights a naive kernel stores", kWeights);
  r.attn_fused_kept_bytes = figure(L * layer_fused, "the O + lse the fused kernel keeps", kStep);
  r.kv_cache_bytes_per_token_f32 = figure(L * layer_kv_f32, "the KV cache per token", kKv);
  r.kv_cache_bytes_per_token_bf16 = figure(L * layer_kv_bf16, "the KV cache per token", kKv);
  r.train += scaled(top, 3.0);
  r.prefill += top;
  r.decode += top;
  r.train_flops_per_step = r.train.total() * dB * dT;
  r.prefill_flops = r.prefill.total() * dN;
  r.kv_cache_bytes_per_token_mha_f32 = figure(linear ? 0 : L * 4 * 2 * qd, "the KV cache per token if MHA", kKv);
  r.kv_cache_bytes_per_token_mha_bf16 = figure(linear ? 0 : L * 2 * 2 * qd, "the KV cache per token if MHA", kKv);
  // Linear attention decodes from its state (float64 accumulators, whatever the dtype): the
  // per-sequence figure is the state, the same at every length.
  r.kv_cache_bytes_per_sequence_f32 =
      linear ? r.decode_state_bytes
             : figure(Count(r.kv_cache_bytes_per_token_f32) * r.context, "the KV cache per sequence", kKv);
  r.kv_cache_bytes_per_sequence_bf16 =
      linear ? r.decode_state_bytes
             : figure(Count(r.kv_cache_bytes_per_token_bf16) * r.context, "the KV cache per sequence", kKv);

  // ---- the peak of a training step ----
  // Walk the step as the engine runs it: the forward ends holding every kept activation, the
  // logits and the loss' lse; backward then frees each layer's activations as it makes that
  // layer's gradients (gradients are dropped by zero_grad, so they are rebuilt every step).
  // Persistent: parameters and the AdamW moments (3 × 4 bytes per parameter).
  // `rows` rows go through forward and backward at once: the batch, or under the row tree of
  // invariant training (train/row_step.h) one row at a time.
  const Count P4 = 4 * params;
  r.state_bytes = figure(3 * P4, "the parameters + AdamW moments", kParams);
  const Count stats = m.norm == nn::NormKind::layernorm ? 2 : 1;
  const auto step_peak = [&](Count rows, Count held) {
    const Count RT = rows * T;
    const Count row_act = 4 * (bf.per_token * RT + bf.per_pair_head * rows * Hq * pairs_T);
    const Count batch_bytes = 2 * 8 * RT;                    // ids and targets, int64
    const Count top_act = 4 * RT * (C + stats + C + V + 1);  // x_L, ln_f stats and output, logits, lse
    const Count act = r.recompute ? 4 * C * RT : row_act;    // each layer's kept activations
    Count remaining = L * act;
    const Count base = P4 + 2 * P4 + batch_bytes + held;  // params + moments (+ what the row tree holds)
    Count peak = base + remaining + top_act;              // end of forward
    // LM head backward: dlogits overwrite the logits in place; dx [RT, C] and dW [V, C] are new.
    Count grads = 4 * (C * V + 2 * norm_params);
    peak = max(peak, base + remaining + top_act + grads + 4 * RT * C);
    // Each block, top down: its gradients appear while its activations go. In flight at its
    // busiest (the MLP): the incoming gradient and the residual's [RT, C], the hidden's gradient
    // twice [RT, F or 2F] (before and after the activation's backward), plus the layer's weight
    // gradients; with recompute the replay rebuilds the block's full activations first.
    const Count hidden = gated ? 2 * F : F;
    const Count replay = r.recompute ? row_act : 0;
    const Count transient = 4 * RT * (2 * C + 2 * hidden);
    for (int64_t l = m.n_layer - 1; l >= 0; --l) {
      grads += 4 * layer_params;
      peak = max(peak, base + remaining + replay + grads + transient);
      remaining -= act;
    }
    // The embeddings: a dense [V, C] gradient is added into the (tied) weight's gradient.
    grads = P4;
    return max(peak, base + grads + 4 * (m.tie_embeddings ? C * V : 0) + 4 * RT * C);
  };
  Count peak = step_peak(B, 0);
  if (r.row_tree) {
    // The flat gradient the rows are folded into, plus W rows at once (train::row_workers: one per
    // thread on the CPU), each with its own activations and gradients, and an even row's
    // gradients kept while the next row runs when a pair can straddle two rounds of W
    // (DataParallel::push_row); the tree's own blocks are reported apart.
    const int64_t rows = r.batch * cfg.train.grad_accum;  // <= 2^20 x 2^20: no overflow
    const int64_t threads = cfg.train.threads > 0 ? cfg.train.threads : omp_get_max_threads();
    const int64_t workers = cfg.train.device == Device::cpu ? std::clamp<int64_t>(threads, 1, rows) : 1;
    const Count one_row = step_peak(1, 0) - 3 * P4;  // a row's own peak above params and moments
    const Count kept = rows > 1 && workers % 2 == 1 ? P4 : 0;
    peak = 3 * P4 + P4 + kept + Count(workers) * one_row;
    int64_t depth = 0;  // blocks held at most: one per level below the rank's row count, + the newest
    while ((int64_t{1} << (depth + 1)) <= rows) ++depth;
    r.row_tree_bytes = figure(P4 * (depth + 1), "the row tree's blocks", kParams);
  }
  r.peak_step_bytes = figure(peak, "the peak tensor bytes of a training step", kStep);
  return r;
}

namespace {

nlohmann::json split_json(const FlopSplit& f) {
  return {{"projections", f.projections},
          {"qk", f.qk},
          {"av", f.av},
          {"mlp", f.mlp},
          {"head", f.head},
          {"norm", f.norm},
          {"total", f.total()}};
}

}  // namespace

nlohmann::json cost_json(const CostReport& r) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : r.layers)
    layers.push_back(
        {{"index", l.index},
         {"params", l.params},
         {"attention_params", l.attention_params},
         {"mlp_params", l.mlp_params},
         {"norm_params", l.norm_params},
         {"flops_per_token",
          {{"train", split_json(l.train)}, {"prefill", split_json(l.prefill)}, {"decode", split_json(l.decode)}}},
         {"activation_bytes", {{"no_recompute", l.activation_bytes}, {"recompute", l.activation_bytes_recompute}}},
         {"attention_weights_bytes", {{"naive", l.attn_weights_naive_bytes}, {"fused", l.attn_fused_kept_bytes}}},
         {"kv_cache_bytes_per_token",
          {{"f32", l.kv_cache_bytes_per_token_f32}, {"bf16", l.kv_cache_bytes_per_token_bf16}}},
         {"kept_pairs", {{"train", l.kept_pairs_train}, {"context", l.kept_pairs_context}}},
         {"decode_state_bytes", l.decode_state_bytes}});
  return {
      {"params", r.params},
      {"embedding_params", r.embedding_params},
      {"non_embedding_params", r.non_embedding_params},
      {"pattern", r.pattern},
      {"batch", r.batch},
      {"train_tokens", r.train_tokens},
      {"context", r.context},
      {"flops_per_token", {{"train", r.train.total()}, {"prefill", r.prefill.total()}, {"decode", r.decode.total()}}},
      {"flops_split",
       {{"train", split_json(r.train)}, {"prefill", split_json(r.prefill)}, {"decode", split_json(r.decode)}}},
      {"train_flops_per_step", r.train_flops_per_step},
      {"prefill_flops", r.prefill_flops},
      {"kv_cache_bytes_per_token",
       {{"f32", r.kv_cache_bytes_per_token_f32}, {"bf16", r.kv_cache_bytes_per_token_bf16}}},
      {"kv_cache_bytes_per_token_mha",
       {{"f32", r.kv_cache_bytes_per_token_mha_f32}, {"bf16", r.kv_cache_bytes_per_token_mha_bf16}}},
      {"kv_cache_bytes_per_sequence",
       {{"f32", r.kv_cache_bytes_per_sequence_f32},
        {"bf16", r.kv_cache_bytes_per_sequence_bf16},
        {"context", r.context}}},
      {"kept_pairs",
       {{"train", r.kept_pairs_train}, {"context", r.kept_pairs_context}, {"full_context", r.full_pairs_context}}},
      {"activation_bytes", {{"no_recompute", r.activation_bytes}, {"recompute", r.activation_bytes_recompute}}},
      {"attention_weights_bytes", {{"naive", r.attn_weights_naive_bytes}, {"fused", r.attn_fused_kept_bytes}}},
      {"decode_state_bytes", r.decode_state_bytes},
      {"recompute", r.recompute},
      {"peak_step_bytes", r.peak_step_bytes},
      {"row_tree_bytes", r.row_tree_bytes},
      {"layers", layers}};
}

namespace {

// 1234567 -> "1.23 M" (FLOPs, powers of 1000) or "1.18 MiB" (bytes, powers of 1024).
std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  const bool bytes = std::string(unit) == "B";
  const double base = bytes ? 1024.0 : 1000.0;
  int i = 0;
  while (std::abs(v) >= base && i < 5) {
    v /= base;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s%s%s", i == 0 ? 0 : 2, v, prefixes[i], bytes && i > 0 ? "i" : "", unit);
  return buf;
}

}  // namespace

std::string cost_table(const CostReport& r) {
  std::ostringstream o;
  const auto& m = r.model;
  char line[512];
  std::snprintf(
      line, sizeof line,
      "model: %s, L=%lld C=%lld Hq=%lld Hkv=%lld hd=%lld F=%lld V=%lld, attention %s; B=%lld T=%lld, context N=%lld\n",
      nn::family_name(m.family), (long long)m.n_layer, (long long)m.n_embd, (long long)m.n_head, (long long)m.n_kv_head,
      (long long)m.head_dim(), (long long)m.ffn_hidden, (long long)m.vocab_size, r.pattern.c_str(), (long long)r.batch,
      (long long)r.train_tokens, (long long)r.context);
  o << line;
  std::snprintf(line, sizeof line, "params: %lld total = %lld embedding + %lld non-embedding%s\n", (long long)r.params,
                (long long)r.embedding_params, (long long)r.non_embedding_params,
                m.tie_embeddings ? " (tied head counted once)" : "");
  o << line;
  o << "\nFLOPs per token      projections          QK^T            AV           MLP          head          norm       "
       "  total\n";
  auto row = [&](const char* name, const FlopSplit& f) {
    std::snprintf(line, sizeof line, "%-18s %13s %13s %13s %13s %13s %13s %13s\n", name,
                  human(f.projections, "").c_str(), human(f.qk, "").c_str(), human(f.av, "").c_str(),
                  human(f.mlp, "").c_str(), human(f.head, "").c_str(), human(f.norm, "").c_str(),
                  human(f.total(), "").c_str());
    o << line;
  };
  row("train (fwd+bwd)", r.train);
  row("prefill N", r.prefill);
  row("decode at N", r.decode);
  std::snprintf(line, sizeof line, "train FLOPs per step (B*T tokens): %s; prefill of N tokens: %s\n",
                human(r.train_flops_per_step, "FLOP").c_str(), human(r.prefill_flops, "FLOP").c_str());
  o << line;
  o << "\nmemory\n";
  auto mem = [&](const char* name, int64_t b) {
    std::snprintf(line, sizeof line, "  %-52s %14s\n", name, human(static_cast<double>(b), "B").c_str());
    o << line;
  };
  mem("activations kept for backward (step)", r.activation_bytes);
  mem("  with train.recompute", r.activation_bytes_recompute);
  mem("attention weights a naive kernel stores (step)", r.attn_weights_naive_bytes);
  mem("what the fused kernel keeps: O + lse (step)", r.attn_fused_kept_bytes);
  mem("params + AdamW moments", r.state_bytes);
  mem(r.recompute ? "peak tensor bytes of a step (recompute on)" : "peak tensor bytes of a step", r.peak_step_bytes);
  if (r.row_tree) mem("row tree blocks (invariant: rows alone)", r.row_tree_bytes);
  mem("KV cache per token, f32", r.kv_cache_bytes_per_token_f32);
  mem("KV cache per token, bf16", r.kv_cache_bytes_per_token_bf16);
  mem("KV cache per token if MHA (Hkv = Hq), f32", r.kv_cache_bytes_per_token_mha_f32);
  mem("KV cache per token if MHA (Hkv = Hq), bf16", r.kv_cache_bytes_per_token_mha_bf16);
  mem("KV cache per sequence of N tokens, f32", r.kv_cache_bytes_per_sequence_f32);
  mem("KV cache per sequence of N tokens, bf16", r.kv_cache_bytes_per_sequence_bf16);
  if (r.decode_state_bytes > 0) mem("linear decode state per sequence (S, z; float64, any N)", r.decode_state_bytes);
  std::snprintf(line, sizeof line,
                "\nattention pattern %s: kept pairs P(T=%lld) = %lld, P(N=%lld) = %lld of %lld causal (%.1f%%)\n",
                r.pattern.c_str(), (long long)r.train_tokens, (long long)r.kept_pairs_train, (long long)r.context,
                (long long)r.kept_pairs_context, (long long)r.full_pairs_context,
                100.0 * static_cast<double>(r.kept_pairs_context) /
                    static_cast<double>(std::max<int64_t>(r.full_pairs_context, 1)));
  o << line;
  o << "\nper layer   params   train FLOP/tok  decode FLOP/tok  activations   KV/token f32\n";
  for (const auto& l : r.layers) {
    std::snprintf(line, sizeof line, "%5lld %10lld %16s %16s %12s %14s\n", (long long)l.index, (long long)l.params,
                  human(l.train.total(), "").c_str(), human(l.decode.total(), "").c_str(),
                  human(static_cast<double>(l.activation_bytes), "B").c_str(),
                  human(static_cast<double>(l.kv_cache_bytes_per_token_f32), "B").c_str());
    o << line;
  }
  return o.str();
}

}  // namespace qkv::analysis
