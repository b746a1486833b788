#include "nn/encoder_decoder.h"

#include <cmath>
#include <string>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace qkv::nn {

void EncoderDecoderConfig::validate() const {
  auto positive = [](const char* key, int64_t v) { QKV_CHECK(v > 0, key, " must be > 0, got ", v); };
  positive("encoder_decoder.vocab_size", vocab_size);
  positive("encoder_decoder.n_embd", n_embd);
  positive("encoder_decoder.n_head", n_head);
  positive("encoder_decoder.n_kv_head", n_kv_head);
  positive("encoder_decoder.ffn_hidden", ffn_hidden);
  positive("encoder_decoder.enc_layers", enc_layers);
  positive("encoder_decoder.dec_layers", dec_layers);
  positive("encoder_decoder.max_len", max_len);
  QKV_CHECK(n_embd % n_head == 0, "encoder_decoder.n_embd (", n_embd, ") must be divisible by n_head (", n_head, ")");
  QKV_CHECK(n_head % n_kv_head == 0, "encoder_decoder.n_head (", n_head, ") must be divisible by n_kv_head (",
            n_kv_head, ")");
  QKV_CHECK(position == Position::learned || position == Position::none,
            "encoder_decoder.position must be learned or none");
}

namespace {

class Group : public Module {
 public:
  using Module::register_module;
};

CrossAttentionConfig attention_config(const EncoderDecoderConfig& c) {
  CrossAttentionConfig a;
  a.d_model = a.d_memory = c.n_embd;
  a.n_head = c.n_head;
  a.n_kv_head = c.n_kv_head;
  return a;
}

class FeedForward {
 public:
  FeedForward(Group& owner, const EncoderDecoderConfig& c) {
    fc1 = owner.register_module("fc1", std::make_shared<Linear>(c.n_embd, c.ffn_hidden, true));
    fc2 = owner.register_module("fc2", std::make_shared<Linear>(c.ffn_hidden, c.n_embd, true));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(ag::gelu(fc1->forward(x), GeluApprox::tanh)); }
  std::shared_ptr<Linear> fc1, fc2;
};

// Causal self-attention over the target: q/k/v/o projections and the op with causal = true.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const EncoderDecoderConfig& c)
      : H_(c.n_head), Hkv_(c.n_kv_head), hd_(c.n_embd / c.n_head) {
    q_ = register_module("q_proj", std::make_shared<Linear>(c.n_embd, H_ * hd_, true));
    k_ = register_module("k_proj", std::make_shared<Linear>(c.n_embd, Hkv_ * hd_, true));
    v_ = register_module("v_proj", std::make_shared<Linear>(c.n_embd, Hkv_ * hd_, true));
    o_ = register_module("o_proj", std::make_shared<Linear>(H_ * hd_, c.n_embd, true));
  }
  Tensor forward(const Tensor& x) const {
    const int64_t B = x.size(0), T = x.size(1);
    auto heads = [&](const Tensor& t, int64_t h) { return ag::transpose(ag::reshape(t, {B, T, h, hd_}), 1, 2); };
    attn::AttentionOptions o;
    o.causal = true;
    Tensor y = attn::attention(heads(q_->forward(x), H_), heads(k_->forward(x), Hkv_), heads(v_->forward(x), Hkv_), o);
    return o_->forward(ag::reshape(ag::contiguous(ag::transpose(y, 1, 2)), {B, T, H_ * hd_}));
  }

 private:
  int64_t H_, Hkv_, hd_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
};

}  // namespace

class EncoderDecoder::EncoderLayer : public Group {
 public:
  explicit EncoderLayer(const EncoderDecoderConfig& c) {
    attn_ = register_module("self_attn", std::make_shared<CrossAttention>(attention_config(c)));
    ln1_ = register_module("self_attn_layer_norm", std::make_shared<LayerNorm>(c.n_embd, c.norm_eps, true));
    ff_ = std::make_unique<FeedForward>(*this, c);
    ln2_ = register_module("final_layer_norm", std::make_shared<LayerNorm>(c.n_embd, c.norm_eps, true));
  }
  Tensor forward(const Tensor& x, const Tensor& padding) const {
    CrossAttentionArgs a;
    a.memory_padding = padding;
    const Tensor h = ln1_->forward(x);
    const Tensor y = ag::add(x, attn_->forward(h, h, a));  // bidirectional: memory = the sequence itself
    return ag::add(y, ff_->forward(ln2_->forward(y)));
  }

 private:
  std::shared_ptr<CrossAttention> attn_;
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::unique_ptr<FeedForward> ff_;
};

class EncoderDecoder::DecoderLayer : public Group {
 public:
  explicit DecoderLayer(const EncoderDecoderConfig& c) {
    self_ = register_module("self_attn", std::make_shared<CausalSelfAttention>(c));
    ln1_ = register_module("self_attn_layer_norm", std::make_shared<LayerNorm>(c.n_embd, c.norm_eps, true));
    cross_ = register_module("encoder_attn", std::make_shared<CrossAttention>(attention_config(c)));
    ln2_ = register_module("encoder_attn_layer_norm", std::make_shared<LayerNorm>(c.n_embd, c.norm_eps, true));
    ff_ = std::make_unique<FeedForward>(*this, c);
    ln3_ = register_module("final_layer_norm", std::make_shared<LayerNorm>(c.n_embd, c.norm_eps, true));
  }
  Tensor forward(const Tensor& y, const Tensor& memory, const Tensor& padding) const {
    CrossAttentionArgs a;
    a.memory_padding = padding;
    Tensor h = ag::add(y, self_->forward(ln1_->forward(y)));
    h = ag::add(h, cross_->forward(ln2_->forward(h), memory, a));
    return ag::add(h, ff_->forward(ln3_->forward(h)));
  }

 private:
  std::shared_ptr<CausalSelfAttention> self_;
  std::shared_ptr<CrossAttention> cross_;
  std::shared_ptr<LayerNorm> ln1_, ln2_, ln3_;
  std::unique_ptr<FeedForward> ff_;
};

EncoderDecoder::EncoderDecoder(const EncoderDecoderConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const int64_t C = cfg_.n_embd;
  shared_ = register_module("shared", std::make_shared<Embedding>(cfg_.vocab_size, C));
  auto enc = register_module("encoder", std::make_shared<Group>());
  auto dec = register_module("decoder", std::make_shared<Group>());
  if (cfg_.position == Position::learned) {
    enc_pos_ = enc->register_module("embed_positions", std::make_shared<Embedding>(cfg_.max_len, C));
    dec_pos_ = dec->register_module("embed_positions", std::make_shared<Embedding>(cfg_.max_len, C));
  }
  auto el = enc->register_module("layers", std::make_shared<Group>());
  for (int64_t i = 0; i < cfg_.enc_layers; ++i)
    enc_.push_back(el->register_module(std::to_string(i), std::make_shared<EncoderLayer>(cfg_)));
  enc_norm_ = enc->register_module("layer_norm", std::make_shared<LayerNorm>(C, cfg_.norm_eps, true));
  auto dl = dec->register_module("layers", std::make_shared<Group>());
  for (int64_t i = 0; i < cfg_.dec_layers; ++i)
    dec_.push_back(dl->register_module(std::to_string(i), std::make_shared<DecoderLayer>(cfg_)));
  dec_norm_ = dec->register_module("layer_norm", std::make_shared<LayerNorm>(C, cfg_.norm_eps, true));
}

void EncoderDecoder::init_weights(uint64_t seed) {
  autograd::NoGradGuard no_grad;
  const double resid_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.enc_layers + cfg_.dec_layers));
  const auto params = named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (p.name.find("norm") != std::string::npos) {
      fill_(p.tensor, p.name.ends_with(".weight") ? 1.0 : 0.0);
    } else if (p.name.ends_with(".bias")) {
      fill_(p.tensor, 0.0);
    } else {
      const bool residual = p.name.ends_with("o_proj.weight") || p.name.ends_with("fc2.weight");
      copy_(p.tensor, randn(p.tensor.shape(), seed, (static_cast<uint64_t>(i) + 1) << 40, 0.0,
                            residual ? resid_std : cfg_.init_std));
    }
  }
}

Tensor EncoderDecoder::embed(const std::shared_ptr<Embedding>& pos, const Tensor& ids) const {
  QKV_CHECK(ids.defined() && ids.dim() == 2, "[encoder_decoder] ids must be [B, N], got ",
            ids.defined() ? shape_str(ids.shape()) : "undefined");
  const int64_t N = ids.size(1);
  QKV_CHECK(N <= cfg_.max_len, "[encoder_decoder] ", N, " tokens exceed encoder_decoder.max_len ", cfg_.max_len);
  Tensor x = shared_->forward(ids);
  if (pos) x = ag::add(x, pos->forward(arange(0, N, DType::i64)));
  return x;
}

Tensor EncoderDecoder::encode(const Tensor& src, const Tensor& src_padding) const {
  Tensor x = embed(enc_pos_, src);
  for (const auto& l : enc_) x = l->forward(x, src_padding);
  return enc_norm_->forward(x);
}

Tensor EncoderDecoder::decode(const Tensor& tgt, const Tensor& memory, const Tensor& src_padding) const {
  Tensor y = embed(dec_pos_, tgt);
  for (const auto& l : dec_) y = l->forward(y, memory, src_padding);
  return ag::linear(dec_norm_->forward(y), shared_->weight, Tensor());
}

std::vector<std::vector<int64_t>> EncoderDecoder::greedy(const Tensor& src, const Tensor& src_padding, int64_t bos,
                                                         int64_t eos, int64_t max_new) const {
  autograd::NoGradGuard no_grad;
  const int64_t B = src.size(0);
  const Tensor memory = encode(src, src_padding);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(B));
  std::vector<int64_t> prefix(static_cast<size_t>(B), bos);  // [B, t] row-major, grown each step
  std::vector<bool> done(static_cast<size_t>(B), false);
  for (int64_t t = 0; t < max_new; ++t) {
    const Tensor logits = decode(from_vector_i64(prefix, {B, t + 1}), memory, src_padding);  // [B, t+1, V]
    const auto next = argmax(logits.narrow(1, t, 1).squeeze(1), -1).to_vector();
    std::vector<int64_t> grown;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t tok = done[b] ? eos : static_cast<int64_t>(next[b]);
      out[b].push_back(tok);
      done[b] = done[b] || tok == eos;
      grown.insert(grown.end(), prefix.begin() + b * (t + 1), prefix.begin() + (b + 1) * (t + 1));
      grown.push_back(tok);
    }
    prefix = std::move(grown);
  }
  return out;
}

}  // namespace qkv::nn
