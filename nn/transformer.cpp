#include "nn/transformer.h"

#include "tensor/numerics.h"

#include <cmath>

#include "attention/alibi.h"
#include "attention/rope.h"
#include "autograd/functions.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"
#include "tensor/numerics.h"
#include "tensor/value_range.h"

namespace qkv::nn {

namespace {

// The range of each size and number, stated here once: wide enough for any model qkv can hold,
// narrow enough that no product of two sizes overflows int64.
constexpr int64_t kMaxSize = int64_t{1} << 20;
struct IntKey {
  const char* key;
  int64_t ModelConfig::*member;
  IntRange range;
};
struct RealKey {
  const char* key;
  double ModelConfig::*member;
  RealRange range;
};
const IntKey kIntKeys[] = {
    {"model.n_layer", &ModelConfig::n_layer, {1, 1024}},
    {"model.n_head", &ModelConfig::n_head, {1, 1024}},
    {"model.n_kv_head", &ModelConfig::n_kv_head, {1, 1024}},
    {"model.n_embd", &ModelConfig::n_embd, {1, 65536}},
    {"model.block_size", &ModelConfig::block_size, {1, kMaxSize}},
    {"model.vocab_size", &ModelConfig::vocab_size, {1, int64_t{1} << 24}},
    {"model.ffn_hidden", &ModelConfig::ffn_hidden, {1, kMaxSize}},
    {"model.window", &ModelConfig::window, {0, kMaxSize}},
};
const RealKey kRealKeys[] = {
    {"model.dropout", &ModelConfig::dropout, {0, 1, false, true}},
    {"model.attn_dropout", &ModelConfig::attn_dropout, {0, 1, false, true}},
    {"model.norm_eps", &ModelConfig::norm_eps, {0, 1, true, false}},
    {"model.rope_theta", &ModelConfig::rope_theta, {0, 1e12, true, false}},
    {"model.init_std", &ModelConfig::init_std, {0, 1}},
};

}  // namespace

std::optional<std::variant<IntRange, RealRange>> model_key_range(std::string_view key) {
  for (const IntKey& k : kIntKeys)
    if (key == k.key) return k.range;
  for (const RealKey& k : kRealKeys)
    if (key == k.key) return k.range;
  return std::nullopt;
}

void ModelConfig::validate() const {
  auto in_range = [](const char* key, int64_t v, IntRange r) {
    QKV_CHECK(r.contains(v), key, " must be ", describe(r), ", got ", v);
  };
  for (const IntKey& k : kIntKeys) in_range(k.key, this->*k.member, k.range);
  for (const RealKey& k : kRealKeys)
    QKV_CHECK(k.range.contains(this->*k.member), k.key, " must be ", describe(k.range), ", got ", this->*k.member);
  QKV_CHECK(n_embd % n_head == 0, "model.n_embd (", n_embd, ") must be divisible by model.n_head (", n_head, ")");
  QKV_CHECK(n_head % n_kv_head == 0, "model.n_head (", n_head, ") must be divisible by model.n_kv_head (", n_kv_head,
            ")");
  pattern.validate_for(block_size);
  QKV_CHECK(position != Position::rope || head_dim() % 2 == 0,
            "rotary positions need an even head size, but model.n_embd / model.n_head = ", head_dim());
  QKV_CHECK(position != Position::sinusoidal || n_embd % 2 == 0, "sinusoidal positions need an even model.n_embd, got ",
            n_embd);
  if (attention_pattern == AttentionPattern::linear) {
    // Each refused option is defined on softmax weights, which linear attention never forms.
    const char* lin = " is not defined for model.attention_pattern = \"linear\" (no softmax weights)";
    QKV_CHECK(position != Position::alibi, "model.position = \"alibi\"", lin,
              "; use rope, learned, sinusoidal or none");
    QKV_CHECK(attn_dropout == 0, "model.attn_dropout = ", attn_dropout, lin, "; set it to 0");
    QKV_CHECK(window == 0, "model.window = ", window, lin, "; set it to 0");
    QKV_CHECK(attn_kernel == attn::Kernel::fused, "model.attn_kernel = \"reference\"", lin, "; use \"fused\"");
    in_range("model.linear_features", linear_features, {1, 65536});
    in_range("model.linear_chunk", linear_chunk, {1, kMaxSize});
  }
}

int64_t ModelCache::length() const {
  if (!linear.empty()) return linear[0].length();
  return layers.empty() ? 0 : layers[0].length();
}

void ModelCache::clear() {
  for (attn::KVCache& c : layers) c.clear();
  for (attn::LinearState& s : linear) s.clear();
}

int64_t ModelCache::bytes() const {
  int64_t n = 0;
  for (const attn::KVCache& c : layers) {
    const auto [k, v] = c.view();
    n += c.capacity() * (k.size(0) * k.size(1) * k.size(3) + v.size(0) * v.size(1) * v.size(3)) *
         static_cast<int64_t>(dtype_size(k.dtype()));
  }
  for (const attn::LinearState& s : linear) n += s.state_bytes();
  return n;
}

namespace {

// A module that only groups children (e.g. "transformer", "h").
class Container : public Module {
 public:
  using Module::register_module;
};

// LayerNorm or RMSNorm behind one name, so blocks are written once.
class Norm : public Module {
 public:
  Norm(NormKind kind, int64_t dim, double eps, bool bias) : kind_(kind), eps_(eps) {
    weight_ = register_parameter("weight", ones({dim}), /*decay=*/false);
    if (bias && kind == NormKind::layernorm) bias_ = register_parameter("bias", zeros({dim}), false);
  }
  Tensor forward(const Tensor& x) const {
    return kind_ == NormKind::layernorm ? ag::layer_norm(x, weight_, bias_, eps_) : ag::rms_norm(x, weight_, eps_);
  }

 private:
  NormKind kind_;
  double eps_;
  Tensor weight_, bias_;
};

}  // namespace

Tensor AttentionOps::rope(const Tensor& x, const Tensor& positions, double theta, int64_t /*cached*/) const {
  return attn::apply_rope(x, positions, theta);
}
attn::AttentionOptions AttentionOps::options(attn::AttentionOptions o, const ModelConfig& /*cfg*/, bool /*training*/,
                                             RngContext& /*rng*/) const {
  return o;
}
Tensor AttentionOps::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const attn::AttentionOptions& o) const {
  return attn::attention(q, k, v, o);
}
Tensor AttentionOps::attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                                      const attn::AttentionOptions& o) const {
  return attn::attention_packed(qkv, q_heads, kv_heads, o);
}
Tensor AttentionOps::linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const attn::LinearAttentionOptions& o) const {
  return attn::linear_attention(q, k, v, o);
}
attn::AttentionWeights AttentionOps::attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                            const attn::AttentionOptions& o) const {
  return attn::attention_with_weights(q, k, v, o);
}
ModelCache& AttentionOps::row_cache(const std::vector<ModelCache*>& row_caches, size_t row) const {
  return *row_caches.at(row);
}
std::shared_ptr<const AttentionOps> AttentionOps::library() {
  static const auto ops = std::make_shared<const AttentionOps>();
  return ops;
}

class SelfAttention : public Module {
 public:
  // `ops` is the model's member: replacing the model's ops reaches every layer.
  SelfAttention(const ModelConfig& c, const std::shared_ptr<const AttentionOps>& ops) : cfg_(c), ops_(ops) {
    const int64_t C = c.n_embd, hd = c.head_dim(), qd = c.n_head * hd, kvd = c.n_kv_head * hd;
    if (c.family == Family::gpt2) {
      c_attn_ = register_module("c_attn", std::make_shared<Linear>(C, qd + 2 * kvd, c.bias));
      c_proj_ = register_module("c_proj", std::make_shared<Linear>(qd, C, c.bias));
    } else {
      q_proj_ = register_module("q_proj", std::make_shared<Linear>(C, qd, c.bias));
      k_proj_ = register_module("k_proj", std::make_shared<Linear>(C, kvd, c.bias));
      v_proj_ = register_module("v_proj", std::make_shared<Linear>(C, kvd, c.bias));
      c_proj_ = register_module("o_proj", std::make_shared<Linear>(qd, C, c.bias));
    }
    if (c.position == Position::alibi) alibi_ = attn::alibi_slopes(c.n_head);
    if (c.pattern.sparse()) pattern_ = std::make_shared<const attn::SparsePattern>(c.pattern);
  }

  // x [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x, const Tensor& positions, ForwardArgs& args, int64_t layer) const {
    autograd::ProfileScope prof("forward attention block");
    const int64_t B = x.size(0), T = x.size(1), hd = cfg_.head_dim(), Hq = cfg_.n_head, Hkv = cfg_.n_kv_head;
    Tensor q, k, v;
    if (c_attn_) {
      // Split by heads after the reshape: each piece stays a view, and in backward the three head
      // gradients land in one [B, T, Hq + 2 Hkv, hd] buffer (NarrowBackward adds into it) that
      // reshapes back to the projection's output without a copy.
      Tensor qkv = ag::reshape(c_attn_->forward(x), {B, T, Hq + 2 * Hkv, hd});
      if (cfg_.position != Position::rope && !args.cache && args.row_caches.empty() && !args.attention && !linear() &&
          !by_document(args)) {
        // A whole sequence without RoPE: attention reads q, k, v in place from the packed
        // projection and returns [B, T, Hq, hd], so neither direction copies a head transpose and
        // backward writes dq, dk, dv into one gradient (attention/attention.h).
        const Tensor y = ops_->attention_packed(qkv, Hq, Hkv, options(args));
        return c_proj_->forward(ag::reshape(y, {B, T, Hq * hd}));
      }
      q = ag::narrow(qkv, 2, 0, Hq);
      k = ag::narrow(qkv, 2, Hq, Hkv);
      v = ag::narrow(qkv, 2, Hq + Hkv, Hkv);
    } else {
      q = ag::reshape(q_proj_->forward(x), {B, T, Hq, hd});
      k = ag::reshape(k_proj_->forward(x), {B, T, Hkv, hd});
      v = ag::reshape(v_proj_->forward(x), {B, T, Hkv, hd});
    }
    q = ag::transpose(q, 1, 2);  // [B, Hq, T, hd]
    k = ag::transpose(k, 1, 2);  // [B, Hkv, T, hd]
    v = ag::transpose(v, 1, 2);
    if (args.attention) args.attention->push_back({q, k, v, Tensor()});
    if (!args.row_caches.empty()) {
      Tensor y = attend_rows(q, k, v, positions, args, layer);  // [B, Hq, T, hd]
      if (args.attention) args.attention->back().out = y;
      return c_proj_->forward(ag::reshape(ag::contiguous(ag::transpose(y, 1, 2)), {B, T, Hq * hd}));
    }
    if (cfg_.position == Position::rope) {
      // Rotations by absolute position, so cached keys and fresh queries agree.
      const int64_t cached = args.cache ? args.cache->length() : 0;
      q = ops_->rope(q, positions, cfg_.rope_theta, cached);
      k = ops_->rope(k, positions, cfg_.rope_theta, cached);
    }
    if (linear()) {
      Tensor y = by_document(args) ? attention_by_document(q, k, v, args, layer)
                                   : linear_attention(q, k, v, args, layer);  // [B, Hq, T, hd]
      if (args.attention) args.attention->back().out = y;
      y = ag::reshape(ag::contiguous(ag::transpose(y, 1, 2)), {B, T, Hq * hd});
      return c_proj_->forward(y);
    }
    if (args.cache) {
      auto kv = args.cache->layers[layer].append(k, v);
      k = kv.first;
      v = kv.second;
    }
    Tensor y = by_document(args) ? attention_by_document(q, k, v, args, layer)
                                 : ops_->attention(q, k, v, options(args));  // [B, Hq, T, hd]
    if (args.attention) args.attention->back().out = y;
    y = ag::reshape(ag::contiguous(ag::transpose(y, 1, 2)), {B, T, Hq * hd});  // [B, T, C]
    return c_proj_->forward(y);
  }

 private:
  bool linear() const { return cfg_.attention_pattern == AttentionPattern::linear; }

  // Under numerics = invariant, a row with segment ids (packed documents) or key padding is
  // attended document by document: each run of real tokens with one segment id as a sequence of
  // its own, from key 0. The fused kernel's key tiles and sum lanes are counted from a sequence's
  // first key, so only then does a document's output equal the same document alone (or decoded).
  // Padded query rows get zeros (their targets are ignored; no real query reads a padded key).
  // Only for a pattern whose keys depend on i − j alone: the others (global tokens, bigbird's and
  // block_sparse's blocks) are defined on the row's positions, so a document's keys depend on
  // where it sits and there is no "alone" to equal.
  bool by_document(const ForwardArgs& args) const {
    return numerics() == Numerics::invariant && !args.cache && args.row_caches.empty() &&
           (linear() || cfg_.pattern.relative()) && (args.segment_ids.defined() || args.key_padding.defined());
  }

  // Linear attention too: its chunks then start at the document's first token, so a padded or
  // packed document is cut into the chunks it has alone.
  Tensor attention_by_document(const Tensor& q, const Tensor& k, const Tensor& v, ForwardArgs& args,
                               int64_t layer) const {
    const int64_t B = q.size(0), T = q.size(2);
    QKV_CHECK(!args.key_padding.defined() || args.key_padding.shape() == Shape({B, T}), "[model] key_padding is ",
              shape_str(args.key_padding.shape()), ", need [", B, ", ", T, "]");
    QKV_CHECK(!args.segment_ids.defined() || args.segment_ids.shape() == Shape({B, T}), "[model] segment_ids is ",
              shape_str(args.segment_ids.shape()), ", need [", B, ", ", T, "]");
    const std::vector<double> keep = args.key_padding.defined() ? args.key_padding.to_vector() : std::vector<double>{};
    const std::vector<double> seg = args.segment_ids.defined() ? args.segment_ids.to_vector() : std::vector<double>{};
    ForwardArgs alone;
    alone.rng = args.rng;
    attn::AttentionOptions o = options(alone);
    args.rng = alone.rng;
    // Attention dropout: each piece draws from its own stretch of the layer's counter range (a
    // piece's Hq·n·n elements after the previous pieces'), within the B·Hq·T·T of the whole call.
    const uint64_t dropout_base = o.dropout_offset;
    uint64_t used = 0;
    std::vector<Tensor> rows;
    for (int64_t b = 0; b < B; ++b) {
      auto real = [&](int64_t t) { return keep.empty() || keep[b * T + t] != 0; };
      auto same_doc = [&](int64_t s, int64_t t) { return seg.empty() || seg[b * T + s] == seg[b * T + t]; };
      std::vector<Tensor> pieces;
      for (int64_t s = 0; s < T;) {
        int64_t e = s + 1;
        if (!real(s)) {
          while (e < T && !real(e)) ++e;
          pieces.push_back(zeros({1, q.size(1), e - s, v.size(3)}, q.dtype(), q.device()));
        } else {
          while (e < T && real(e) && same_doc(s, e)) ++e;
          auto part = [&](const Tensor& x) { return ag::narrow(ag::narrow(x, 0, b, 1), 2, s, e - s); };
          o.dropout_offset = dropout_base + used;
          used += static_cast<uint64_t>(q.size(1) * (e - s) * (e - s));
          pieces.push_back(linear() ? ops_->linear_attention(part(q), part(k), part(v),
                                                             linear_options(cfg_, layer, q.device(), alone))
                                    : ops_->attention(part(q), part(k), part(v), o));
        }
        s = e;
      }
      rows.push_back(pieces.size() == 1 ? pieces[0] : ag::cat(pieces, 2));
    }
    return B == 1 ? rows[0] : ag::cat(rows, 0);
  }

  // ForwardArgs::row_caches: row b's RoPE, cache append and attention (or linear-state step), each
  // on [1, H, T, hd] exactly as a batch-1 forward with ForwardArgs::cache does them.
  Tensor attend_rows(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, ForwardArgs& args,
                     int64_t layer) const {
    autograd::ProfileScope prof("forward attention rows");
    std::vector<Tensor> rows;
    for (size_t b = 0; b < args.row_caches.size(); ++b) {
      ModelCache& cache = ops_->row_cache(args.row_caches, b);
      const auto r = static_cast<int64_t>(b);
      Tensor qb = ag::narrow(q, 0, r, 1), kb = ag::narrow(k, 0, r, 1), vb = ag::narrow(v, 0, r, 1);
      if (cfg_.position == Position::rope) {
        const Tensor pos = positions.dim() == 1 ? positions : positions.select(0, r);
        qb = ops_->rope(qb, pos, cfg_.rope_theta, cache.length());
        kb = ops_->rope(kb, pos, cfg_.rope_theta, cache.length());
      }
      if (linear()) {
        QKV_CHECK(static_cast<int64_t>(cache.linear.size()) > layer,
                  "[model] a linear-attention model needs the caches make_cache() builds (recurrent states)");
        rows.push_back(cache.linear[layer].step(qb, kb, vb));
        continue;
      }
      QKV_CHECK(static_cast<int64_t>(cache.layers.size()) > layer,
                "[model] a softmax-attention model needs the KV caches make_cache() builds");
      const auto [kc, vc] = cache.layers[layer].append(kb, vb);
      rows.push_back(ops_->attention(qb, kc, vc, options(args)));
    }
    return rows.size() == 1 ? rows[0] : ag::cat(rows, 0);
  }

  // model.attention_pattern = linear: the chunked causal op on a whole sequence, or one step of the
  // layer's recurrent state when decoding (key padding: the columns of this call's tokens).
  Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, ForwardArgs& args, int64_t layer) const {
    if (args.cache) {
      QKV_CHECK(!args.segment_ids.defined(), "[model] linear attention decodes without segment_ids");
      QKV_CHECK(static_cast<int64_t>(args.cache->linear.size()) > layer,
                "[model] a linear-attention model needs the cache make_cache() builds (recurrent states)");
      Tensor kp = args.key_padding;
      if (kp.defined()) kp = kp.narrow(1, kp.size(1) - q.size(2), q.size(2)).contiguous();
      return args.cache->linear[layer].step(q, k, v, kp);
    }
    return ops_->linear_attention(q, k, v, linear_options(cfg_, layer, q.device(), args));
  }

 public:
  // The options of a layer's linear attention (causal; favor's W drawn for the layer, never redrawn).
  static attn::LinearAttentionOptions linear_options(const ModelConfig& c, int64_t layer, Device dev,
                                                     const ForwardArgs& args) {
    attn::LinearAttentionOptions o;
    o.feature = c.linear_feature;
    o.causal = true;
    o.chunk = c.linear_chunk;
    o.key_padding = args.key_padding;
    o.segment_ids = args.segment_ids;
    if (c.linear_feature == attn::LinearFeature::favor)
      o.projection = attn::favor_projection_for_layer(c.linear_features, c.head_dim(), layer).to(dev);
    return o;
  }

 private:
  // The attention call's options; draws this layer's dropout offset when attention dropout is on.
  attn::AttentionOptions options(ForwardArgs& args) const {
    attn::AttentionOptions o;
    o.causal = true;
    o.pattern = pattern_;  // the same absolute-position pattern in training, eval and KV-cache decode
    o.window = cfg_.window;
    o.kernel = cfg_.attn_kernel;
    o.key_padding = args.key_padding;
    o.segment_ids = args.segment_ids;
    o.alibi_slopes = alibi_;
    if (cfg_.attn_dropout > 0 && is_training()) {
      o.dropout_p = cfg_.attn_dropout;
      o.dropout_seed = args.rng.seed;
      o.dropout_offset = args.rng.next_offset();
    }
    return ops_->options(std::move(o), cfg_, is_training(), args.rng);
  }

  const ModelConfig& cfg_;
  const std::shared_ptr<const AttentionOps>& ops_;
  std::shared_ptr<Linear> c_attn_, q_proj_, k_proj_, v_proj_, c_proj_;
  std::vector<float> alibi_;
  std::shared_ptr<const attn::SparsePattern> pattern_;
};

class MLP : public Module {
 public:
  explicit MLP(const ModelConfig& c) : cfg_(c) {
    const int64_t C = c.n_embd, F = c.ffn_hidden;
    const bool gated = c.activation == Activation::swiglu;
    if (c.family == Family::gpt2) {
      up_ = register_module("c_fc", std::make_shared<Linear>(C, gated ? 2 * F : F, c.bias));
      down_ = register_module("c_proj", std::make_shared<Linear>(F, C, c.bias));
    } else {
      if (gated) gate_ = register_module("gate_proj", std::make_shared<Linear>(C, F, c.bias));
      up_ = register_module("up_proj", std::make_shared<Linear>(C, F, c.bias));
      down_ = register_module("down_proj", std::make_shared<Linear>(F, C, c.bias));
    }
  }
  // gelu(x W_up^T + b): with a bias, the GEMM runs without it and the bias and GELU are one
  // kernel (ag::bias_gelu), which saves a write and a read of the [rows, F] activation each way.
  Tensor up_gelu(const Tensor& x, GeluApprox approx) const {
    if (!up_->bias.defined()) return ag::gelu(up_->forward(x), approx);
    return ag::bias_gelu(ag::linear(x, up_->weight, Tensor()), up_->bias, approx);
  }

  Tensor forward(const Tensor& x) const {
    autograd::ProfileScope prof("forward mlp");
    const int64_t F = cfg_.ffn_hidden;
    Tensor h;
    switch (cfg_.activation) {
      case Activation::gelu_tanh:
        h = up_gelu(x, GeluApprox::tanh);
        break;
      case Activation::gelu:
        h = up_gelu(x, GeluApprox::none);
        break;
      case Activation::relu:
        h = ag::relu(up_->forward(x));
        break;
      case Activation::swiglu: {
        // silu(gate) * up; gpt2 naming keeps gate and up fused in c_fc as [gate | up].
        Tensor gate, up;
        if (gate_) {
          gate = gate_->forward(x);
          up = up_->forward(x);
        } else {
          Tensor both = up_->forward(x);
          gate = ag::narrow(both, -1, 0, F);
          up = ag::narrow(both, -1, F, F);
        }
        h = ag::mul(ag::silu(gate), up);
        break;
      }
    }
    return down_->forward(h);
  }

 private:
  const ModelConfig& cfg_;
  std::shared_ptr<Linear> gate_, up_, down_;
};

class Block : public Module {
 public:
  Block(const ModelConfig& c, const std::shared_ptr<const AttentionOps>& ops) : cfg_(c) {
    const bool gpt2 = c.family == Family::gpt2;
    ln1_ = register_module(gpt2 ? "ln_1" : "input_layernorm",
                           std::make_shared<Norm>(c.norm, c.n_embd, c.norm_eps, c.bias));
    attn_ = register_module(gpt2 ? "attn" : "self_attn", std::make_shared<SelfAttention>(c, ops));
    ln2_ = register_module(gpt2 ? "ln_2" : "post_attention_layernorm",
                           std::make_shared<Norm>(c.norm, c.n_embd, c.norm_eps, c.bias));
    mlp_ = register_module("mlp", std::make_shared<MLP>(c));
  }
  // With model recompute on and a graph being recorded, the block keeps only its input: its
  // forward runs under no-grad and CheckpointedBlockBackward replays it in backward (same dropout
  // offsets, deterministic kernels, so the gradients are bitwise those of the recorded forward).
  Tensor forward(const Tensor& x, const Tensor& positions, ForwardArgs& args, int64_t layer) const;
  Tensor forward_recorded(const Tensor& x, const Tensor& positions, ForwardArgs& args, int64_t layer) const {
    Tensor a = attn_->forward(ln1_->forward(x), positions, args, layer);
    Tensor h = ag::add(x, dropout(a, cfg_.dropout, is_training(), args.rng));
    Tensor m = mlp_->forward(ln2_->forward(h));
    return ag::add(h, dropout(m, cfg_.dropout, is_training(), args.rng));
  }

 private:
  const ModelConfig& cfg_;
  std::shared_ptr<Norm> ln1_, ln2_;
  std::shared_ptr<SelfAttention> attn_;
  std::shared_ptr<MLP> mlp_;
};

namespace {

// Activation recomputation for one block: y = block(x) was computed without recording; backward
// replays the block with recording on from a detached copy of x and backpropagates grad_out
// through the replay. Parameter gradients land in their leaves' .grad through the replay's own
// accumulators; the gradient for x is handed back to the outer graph.
class CheckpointedBlockBackward : public autograd::Node {
 public:
  CheckpointedBlockBackward(const Block* block, Tensor x, Tensor positions, const ForwardArgs& args, int64_t layer)
      : block_(block), x_(std::move(x)), positions_(std::move(positions)), layer_(layer) {
    args_.key_padding = args.key_padding;
    args_.segment_ids = args.segment_ids;
    args_.rng = args.rng;                   // the state before the block drew its dropout offsets
    autocast_ = autograd::autocast_bf16();  // the replay must round exactly as the forward did
  }
  const char* name() const override { return "CheckpointedBlockBackward"; }
  std::vector<Tensor> backward(const Tensor& grad_out) override {
    Tensor x = x_;
    x.set_requires_grad(true);
    Tensor y;
    {
      // The engine runs nodes under no-grad; the replay must record.
      const autograd::GradModeGuard record(true);
      const autograd::AutocastGuard same_precision(autocast_);
      ForwardArgs replay = args_;
      y = block_->forward_recorded(x, positions_, replay, layer_);
    }
    // A private copy of grad_out, so the replay's engine owns its seed as the outer engine owns
    // the gradients it passes along: the same in-place accumulations happen in the same places and
    // the gradients come out bitwise those of the recorded forward.
    autograd::backward(y, grad_out.clone());
    Tensor dx = needs_grad(0) ? autograd::take_leaf_grad(x) : Tensor();
    release();
    return {dx};
  }
  void release() override {
    x_ = Tensor();
    positions_ = Tensor();
    args_ = ForwardArgs();
  }

 private:
  const Block* block_;
  Tensor x_, positions_;
  ForwardArgs args_;
  int64_t layer_;
  bool autocast_ = false;
};

}  // namespace

Tensor Block::forward(const Tensor& x, const Tensor& positions, ForwardArgs& args, int64_t layer) const {
  // Only a block whose input carries a graph is checkpointed (the replay hands dx back through
  // it); a block fed by frozen layers records normally.
  const bool checkpoint = cfg_.recompute && autograd::grad_enabled() && !args.cache && args.row_caches.empty() &&
                          !args.attention && (x.requires_grad() || x.grad_fn());
  if (!checkpoint) return forward_recorded(x, positions, args, layer);
  const ForwardArgs before = args;
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    y = forward_recorded(x, positions, args, layer);
  }
  // The replay starts from an alias of x with no history of its own.
  const Tensor x_alias = x.detach();
  auto node = std::make_shared<CheckpointedBlockBackward>(this, x_alias, positions, before, layer);
  const std::vector<Tensor> inputs{x};
  return autograd::record(std::move(y), node, inputs);
}

DecoderModel::DecoderModel(const ModelConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const bool gpt2 = cfg_.family == Family::gpt2;
  auto root = std::make_shared<Container>();
  root_ = register_module(gpt2 ? "transformer" : "model", root);
  tok_emb_ =
      root->register_module(gpt2 ? "wte" : "embed_tokens", std::make_shared<Embedding>(cfg_.vocab_size, cfg_.n_embd));
  if (cfg_.position == Position::learned)
    pos_emb_ = root->register_module(gpt2 ? "wpe" : "embed_positions",
                                     std::make_shared<Embedding>(cfg_.block_size, cfg_.n_embd));
  auto list = root->register_module(gpt2 ? "h" : "layers", std::make_shared<Container>());
  for (int64_t i = 0; i < cfg_.n_layer; ++i)
    blocks_.push_back(list->register_module(std::to_string(i), std::make_shared<Block>(cfg_, attention_ops_)));
  final_norm_ = root->register_module(gpt2 ? "ln_f" : "norm",
                                      std::make_shared<Norm>(cfg_.norm, cfg_.n_embd, cfg_.norm_eps, cfg_.bias));
  if (!cfg_.tie_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(cfg_.n_embd, cfg_.vocab_size, false));
  if (cfg_.position == Position::sinusoidal) {
    // PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C))
    const int64_t T = cfg_.block_size, C = cfg_.n_embd;
    sinusoid_ = Tensor::empty({T, C});
    float* pe = sinusoid_.data<float>();
    for (int64_t p = 0; p < T; ++p)
      for (int64_t i = 0; i < C; ++i) {
        const double freq = std::pow(10000.0, -static_cast<double>(i - i % 2) / static_cast<double>(C));
        pe[p * C + i] = static_cast<float>(i % 2 == 0 ? std::sin(p * freq) : std::cos(p * freq));
      }
  }
}

void DecoderModel::init_weights(uint64_t seed) {
  autograd::NoGradGuard no_grad;
  const double resid_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  const auto params = named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const bool is_norm = p.name.find("ln_") != std::string::npos || p.name.find("layernorm") != std::string::npos ||
                         p.name.ends_with("norm.weight") || p.name.ends_with("norm.bias");
    if (is_norm) {
      fill_(p.tensor, p.name.ends_with(".weight") ? 1.0 : 0.0);
    } else if (p.name.ends_with(".bias")) {
      fill_(p.tensor, 0.0);
    } else {
      const bool residual = p.name.ends_with("attn.c_proj.weight") || p.name.ends_with("mlp.c_proj.weight") ||
                            p.name.ends_with("o_proj.weight") || p.name.ends_with("down_proj.weight");
      // Each parameter draws from its own Philox stream: offset = its index in the upper bits.
      copy_(p.tensor, randn(p.tensor.shape(), seed, (static_cast<uint64_t>(i) + 1) << 40, 0.0,
                            residual ? resid_std : cfg_.init_std));
    }
  }
}

void DecoderModel::set_attention_ops(std::shared_ptr<const AttentionOps> ops) {
  attention_ops_ = ops ? std::move(ops) : AttentionOps::library();
}

void DecoderModel::to(Device device) {
  Module::to(device);
  if (sinusoid_.defined()) sinusoid_ = sinusoid_.to(device);
}

Tensor DecoderModel::forward(ForwardArgs& args) const {
  const autograd::AutocastGuard autocast(autograd::autocast_bf16() || bf16_autocast_);
  QKV_CHECK(args.ids.defined() && args.ids.dim() == 2, "[model] ids must be [B, T], got ",
            args.ids.defined() ? shape_str(args.ids.shape()) : "undefined");
  const Device dev = device();
  auto here = [dev](const Tensor& t) { return t.defined() && t.device() != dev ? t.to(dev) : t; };
  args.ids = here(args.ids);
  args.key_padding = here(args.key_padding);
  args.segment_ids = here(args.segment_ids);
  const int64_t B = args.ids.size(0), T = args.ids.size(1);
  const int64_t start = args.cache ? args.cache->length() : 0;
  Tensor positions = args.positions;
  if (!args.row_caches.empty()) {
    QKV_CHECK(static_cast<int64_t>(args.row_caches.size()) == B, "[model] row_caches has ", args.row_caches.size(),
              " caches for ", B, " rows of ids (one cache per row)");
    QKV_CHECK(!args.cache, "[model] give either cache (one cache for the batch) or row_caches (one per row), not both");
    QKV_CHECK(!args.key_padding.defined() && !args.segment_ids.defined(),
              "[model] row_caches decode whole rows: key_padding and segment_ids are not supported with them");
    std::vector<int64_t> pos;
    for (ModelCache* c : args.row_caches) {
      QKV_CHECK(c != nullptr, "[model] row_caches holds a null cache");
      for (int64_t t = 0; t < T; ++t) pos.push_back(c->length() + t);
    }
    if (!positions.defined()) positions = from_vector_i64(pos, {B, T});
  }
  if (!positions.defined()) positions = arange(start, start + T, DType::i64);
  QKV_CHECK((positions.shape() == Shape{T} || positions.shape() == Shape{B, T}),
            "[model] positions must be [T] or [B, T]");
  if (cfg_.position == Position::learned || cfg_.position == Position::sinusoidal) {
    const auto pv = positions.to_vector();
    for (double p : pv)
      QKV_CHECK(p >= 0 && p < cfg_.block_size, "[model] position ", p, " is outside model.block_size ",
                cfg_.block_size);
  }
  positions = here(positions);
  Tensor x = tok_emb_->forward(args.ids);  // [B, T, C]
  if (pos_emb_) x = ag::add(x, pos_emb_->forward(positions));
  // The table is float32; a model whose parameters were made float64 (gradcheck) adds it in its dtype.
  if (sinusoid_.defined())
    x = ag::add(x, index_select(sinusoid_.dtype() == x.dtype() ? sinusoid_ : sinusoid_.to(x.dtype()), 0,
                                positions.reshape({-1}))
                       .reshape(positions.dim() == 1 ? Shape{T, cfg_.n_embd} : Shape{B, T, cfg_.n_embd}));
  x = dropout(x, cfg_.dropout, is_training(), args.rng);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    x = blocks_[l]->forward(x, positions, args, static_cast<int64_t>(l));
    if (args.hidden) args.hidden->push_back(x);
  }
  if (args.last_logits_only && T > 1) x = x.narrow(1, T - 1, 1);
  x = static_cast<const Norm&>(*final_norm_).forward(x);
  autograd::ProfileScope prof("forward lm head");
  return ag::linear(x, lm_head_ ? lm_head_->weight : tok_emb_->weight, Tensor());
}

ModelCache DecoderModel::make_cache(int64_t batch, int64_t capacity) const {
  ModelCache c;
  if (cfg_.attention_pattern == AttentionPattern::linear) {
    // One recurrent state per layer: its size does not depend on `capacity`.
    for (int64_t l = 0; l < cfg_.n_layer; ++l) {
      ForwardArgs none;
      c.linear.emplace_back(batch, cfg_.n_head, cfg_.n_kv_head, cfg_.head_dim(), cfg_.head_dim(),
                            SelfAttention::linear_options(cfg_, l, Device::cpu, none));
    }
    return c;
  }
  for (int64_t l = 0; l < cfg_.n_layer; ++l)
    c.layers.emplace_back(batch, cfg_.n_kv_head, capacity, cfg_.head_dim(), cfg_.head_dim(), DType::f32, device());
  return c;
}

int64_t DecoderModel::non_embedding_parameter_count() const {
  int64_t n = parameter_count() - tok_emb_->weight.numel();
  if (pos_emb_) n -= pos_emb_->weight.numel();
  return n;
}

}  // namespace qkv::nn
