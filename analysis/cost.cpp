#include "analysis/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "attention/attention.h"
#include "attention/patterns.h"
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
  double per_token = 0;      // floats per token, independent of the context
  double per_pair_head = 0;  // floats per kept (query, key) pair and query head (reference kernel)
};

BlockFloats block_activation_floats(const nn::ModelConfig& c) {
  const double C = static_cast<double>(c.n_embd), hd = static_cast<double>(c.head_dim());
  const double qd = static_cast<double>(c.n_head) * hd, kvd = static_cast<double>(c.n_kv_head) * hd;
  const double Hq = static_cast<double>(c.n_head), F = static_cast<double>(c.ffn_hidden);
  const double stats = c.norm == nn::NormKind::layernorm ? 2 : 1;
  BlockFloats b;
  b.per_token = C /*x*/ + stats + C /*ln1 out*/ + C /*h*/ + stats + C /*ln2 out*/;
  const bool gpt2 = c.family == nn::Family::gpt2;
  const bool rope = c.position == nn::Position::rope;
  if (gpt2 && !rope) {
    b.per_token += (qd + 2 * kvd) + qd + Hq;
  } else {
    const double kept_v = gpt2 ? (qd + 2 * kvd) : kvd;
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
  r.train_tokens = cfg.train.resolved_seq_len(m.block_size);
  r.context = o.context > 0 ? o.context : m.block_size;
  QKV_CHECK(o.context >= 0, "--context must be >= 1, got ", o.context);
  r.recompute = cfg.train.recompute;

  const int64_t C = m.n_embd, hd = m.head_dim(), qd = m.n_head * hd, kvd = m.n_kv_head * hd, F = m.ffn_hidden,
                V = m.vocab_size, L = m.n_layer;
  const bool gated = m.activation == nn::Activation::swiglu;
  const int64_t norm_params = m.norm == nn::NormKind::layernorm && m.bias ? 2 * C : C;
  const int64_t attn_params = C * (qd + 2 * kvd) + qd * C + (m.bias ? qd + 2 * kvd + C : 0);
  const int64_t mlp_params = C * (gated ? 2 * F : F) + F * C + (m.bias ? (gated ? 2 * F : F) + C : 0);
  const int64_t layer_params = 2 * norm_params + attn_params + mlp_params;
  const int64_t tok_emb = V * C, pos_emb = m.position == nn::Position::learned ? m.block_size * C : 0;
  const int64_t head_params = m.tie_embeddings ? 0 : C * V;
  r.embedding_params = tok_emb + pos_emb;
  r.non_embedding_params = L * layer_params + norm_params + head_params;
  r.params = r.embedding_params + r.non_embedding_params;

  const double dC = static_cast<double>(C), dV = static_cast<double>(V);
  const double T = static_cast<double>(r.train_tokens), N = static_cast<double>(r.context);
  const double B = static_cast<double>(r.batch);
  // Forward FLOPs of one token of a layer given the average keys per query.
  auto layer_forward = [&](double keys_per_query) {
    FlopSplit f;
    f.projections = 2.0 * static_cast<double>(attn_params);
    f.mlp = 2.0 * static_cast<double>(mlp_params);
    f.norm = 2.0 * static_cast<double>(2 * norm_params);
    f.qk = 2.0 * dC * keys_per_query;  // Hq · hd = C multiply-adds per key
    f.av = 2.0 * dC * keys_per_query;
    return f;
  };
  const int64_t pairs_T = pat.kept_pairs(m, r.train_tokens), pairs_N = pat.kept_pairs(m, r.context);
  r.kept_pairs_train = pairs_T;
  r.kept_pairs_context = pairs_N;
  r.full_pairs_context = r.context * (r.context + 1) / 2;
  FlopSplit lt = scaled(layer_forward(static_cast<double>(pairs_T) / T), 3.0);
  FlopSplit lp = layer_forward(static_cast<double>(pairs_N) / N);
  FlopSplit ld = layer_forward(static_cast<double>(pat.keys_at(m, r.context - 1)));
  const bool linear = m.attention_pattern == nn::AttentionPattern::linear;
  int64_t state_bytes_layer = 0;  // linear: S [m, Dv] + z [m] per kv head of one sequence (float64)
  if (linear) {
    // Per token, with m features, Dv = hd (linear_attention.h): the query side (Φ·z and ΦᵀS, or
    // the chunk's A = ΦΨᵀ and A·v) per query head, the state update Ψvᵀ, Ψ per kv head.
    const double mf = static_cast<double>(linear_feature_count(m)), Dv = static_cast<double>(hd);
    const double Hq = static_cast<double>(m.n_head), Hkv = static_cast<double>(m.n_kv_head);
    const double update = 2.0 * Hkv * mf * (Dv + 1);
    auto linear_layer = [&](double chunk_keys_per_query) {
      FlopSplit f = layer_forward(0);
      f.qk = 2.0 * Hq * mf * (1 + chunk_keys_per_query);                 // Φ·z⁻ + A_ij
      f.av = 2.0 * Hq * (mf * Dv + Dv * chunk_keys_per_query) + update;  // ΦᵀS⁻ + A·v + state update
      return f;
    };
    // Training: the chunked form over T tokens; prefill and decode: the recurrence (LinearState).
    lt = scaled(linear_layer(static_cast<double>(pairs_T) / T), 3.0);
    lp = linear_layer(0);
    ld = linear_layer(0);
    state_bytes_layer =
        static_cast<int64_t>(sizeof(double)) * m.n_kv_head * (linear_feature_count(m) * hd + linear_feature_count(m));
  }
  FlopSplit top;  // final norm and LM head, forward
  top.norm = 2.0 * static_cast<double>(norm_params);
  top.head = 2.0 * dC * dV;

  const BlockFloats bf = block_activation_floats(m);
  const int64_t BT = r.batch * r.train_tokens;
  for (int64_t l = 0; l < L; ++l) {
    LayerCost lc;
    lc.index = l;
    lc.params = layer_params;
    lc.attention_params = attn_params;
    lc.mlp_params = mlp_params;
    lc.norm_params = 2 * norm_params;
    lc.train = lt;
    lc.prefill = lp;
    lc.decode = ld;
    lc.activation_bytes = static_cast<int64_t>(
        4 * (bf.per_token * static_cast<double>(BT) + bf.per_pair_head * B * static_cast<double>(m.n_head * pairs_T)));
    lc.activation_bytes_recompute = 4 * C * BT;
    lc.attn_weights_naive_bytes = 4 * r.batch * m.n_head * r.train_tokens * r.train_tokens;
    lc.attn_fused_kept_bytes = 4 * (BT * qd + r.batch * m.n_head * r.train_tokens);
    lc.kv_cache_bytes_per_token_f32 = linear ? 0 : 4 * 2 * kvd;
    lc.kv_cache_bytes_per_token_bf16 = linear ? 0 : 2 * 2 * kvd;
    lc.decode_state_bytes = state_bytes_layer;
    r.decode_state_bytes += state_bytes_layer;
    lc.kept_pairs_train = pairs_T;
    lc.kept_pairs_context = pairs_N;
    r.train += lc.train;
    r.prefill += lc.prefill;
    r.decode += lc.decode;
    r.activation_bytes += lc.activation_bytes;
    r.activation_bytes_recompute += lc.activation_bytes_recompute;
    r.attn_weights_naive_bytes += lc.attn_weights_naive_bytes;
    r.attn_fused_kept_bytes += lc.attn_fused_kept_bytes;
    r.kv_cache_bytes_per_token_f32 += lc.kv_cache_bytes_per_token_f32;
    r.kv_cache_bytes_per_token_bf16 += lc.kv_cache_bytes_per_token_bf16;
    r.layers.push_back(lc);
  }
  r.train += scaled(top, 3.0);
  r.prefill += top;
  r.decode += top;
  r.train_flops_per_step = r.train.total() * B * T;
  r.prefill_flops = r.prefill.total() * N;
  r.kv_cache_bytes_per_token_mha_f32 = linear ? 0 : L * 4 * 2 * qd;
  r.kv_cache_bytes_per_token_mha_bf16 = linear ? 0 : L * 2 * 2 * qd;
  // Linear attention decodes from its state (float64 accumulators, whatever the dtype): the
  // per-sequence figure is the state, the same at every length.
  r.kv_cache_bytes_per_sequence_f32 = linear ? r.decode_state_bytes : r.kv_cache_bytes_per_token_f32 * r.context;
  r.kv_cache_bytes_per_sequence_bf16 = linear ? r.decode_state_bytes : r.kv_cache_bytes_per_token_bf16 * r.context;

  // ---- the peak of a training step ----
  // Walk the step as the engine runs it: the forward ends holding every kept activation, the
  // logits and the loss' lse; backward then frees each layer's activations as it makes that
  // layer's gradients (gradients are dropped by zero_grad, so they are rebuilt every step).
  // Persistent: parameters and the AdamW moments (3 × 4 bytes per parameter).
  const int64_t P4 = 4 * r.params;
  r.state_bytes = 3 * P4;
  const int64_t stats = m.norm == nn::NormKind::layernorm ? 2 : 1;
  const int64_t batch_bytes = 2 * 8 * BT;                    // ids and targets, int64
  const int64_t top_act = 4 * BT * (C + stats + C + V + 1);  // x_L, ln_f stats and output, logits, lse
  std::vector<int64_t> act(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l)
    act[static_cast<size_t>(l)] = r.recompute ? r.layers[static_cast<size_t>(l)].activation_bytes_recompute
                                              : r.layers[static_cast<size_t>(l)].activation_bytes;
  int64_t remaining = 0;
  for (int64_t a : act) remaining += a;
  const int64_t base = P4 + 2 * P4 + batch_bytes;  // params + moments
  int64_t peak = base + remaining + top_act;       // end of forward
  // LM head backward: dlogits overwrite the logits in place; dx [BT, C] and dW [V, C] are new.
  int64_t grads = 4 * (C * V + 2 * norm_params);
  peak = std::max(peak, base + remaining + top_act + grads + 4 * BT * C);
  // Each block, top down: its gradients appear while its activations go. In flight at its
  // busiest (the MLP): the incoming gradient and the residual's [BT, C], the hidden's gradient
  // twice [BT, F or 2F] (before and after the activation's backward), plus the layer's weight
  // gradients; with recompute the replay rebuilds the block's full activations first.
  const int64_t hidden = gated ? 2 * F : F;
  for (int64_t l = L - 1; l >= 0; --l) {
    const int64_t replay = r.recompute ? r.layers[static_cast<size_t>(l)].activation_bytes : 0;
    const int64_t transient = 4 * BT * (2 * C + 2 * hidden);
    grads += 4 * layer_params;
    peak = std::max(peak, base + remaining + replay + grads + transient);
    remaining -= act[static_cast<size_t>(l)];
  }
  // The embeddings: a dense [V, C] gradient is added into the (tied) weight's gradient.
  grads = P4;
  peak = std::max(peak, base + grads + 4 * (m.tie_embeddings ? C * V : 0) + 4 * BT * C);
  r.peak_step_bytes = peak;
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
