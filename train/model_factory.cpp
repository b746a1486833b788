#include "train/model_factory.h"

#include "tensor/error.h"

namespace qkv::train {

nn::ModelConfig model_config(const Config& cfg, int64_t tokenizer_vocab) {
  const ModelSettings& m = cfg.model;
  nn::ModelConfig c;
  c.family = m.family == "llama" ? nn::Family::llama : nn::Family::gpt2;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_kv_head = m.resolved_n_kv_head();
  c.n_embd = m.n_embd;
  c.block_size = m.block_size;
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : tokenizer_vocab;
  QKV_CHECK(c.vocab_size >= tokenizer_vocab, "model.vocab_size (", m.vocab_size, ") is smaller than the tokenizer's (",
            tokenizer_vocab, ")");
  c.ffn_hidden = m.resolved_ffn_hidden();
  c.dropout = m.dropout;
  c.attn_dropout = m.attn_dropout;
  c.norm_eps = m.norm_eps;
  c.rope_theta = m.rope_theta;
  c.init_std = m.init_std;
  const std::string pos = m.resolved_position();
  c.position = pos == "learned"      ? nn::Position::learned
               : pos == "rope"       ? nn::Position::rope
               : pos == "sinusoidal" ? nn::Position::sinusoidal
               : pos == "alibi"      ? nn::Position::alibi
                                     : nn::Position::none;
  c.norm = m.resolved_norm() == "rmsnorm" ? nn::NormKind::rmsnorm : nn::NormKind::layernorm;
  const std::string act = m.resolved_activation();
  c.activation = act == "gelu"     ? nn::Activation::gelu
                 : act == "swiglu" ? nn::Activation::swiglu
                 : act == "relu"   ? nn::Activation::relu
                                   : nn::Activation::gelu_tanh;
  c.bias = m.resolved_bias();
  c.tie_embeddings = m.resolved_tie_embeddings();
  c.window = m.window;
  c.attn_kernel = m.attn_kernel == "reference" ? attn::Kernel::reference : attn::Kernel::fused;
  c.recompute = cfg.train.recompute;
  c.validate();
  return c;
}

std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab) {
  return std::make_unique<nn::DecoderModel>(model_config(cfg, tokenizer_vocab));
}

}  // namespace qkv::train
