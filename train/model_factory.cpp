#include "train/model_factory.h"

#include "tensor/error.h"
#include "train/config_schema.h"

namespace qkv::train {

nn::ModelConfig model_config(const Config& cfg, int64_t tokenizer_vocab) {
  const ModelSettings& m = cfg.model;
  nn::ModelConfig c;
  c.family = choose(kFamilies, m.family, "model.family");
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
  c.position = choose(kPositions, m.resolved_position(), "model.position");
  c.norm = choose(kNorms, m.resolved_norm(), "model.norm");
  c.activation = choose(kActivations, m.resolved_activation(), "model.activation");
  c.bias = m.resolved_bias();
  c.tie_embeddings = m.resolved_tie_embeddings();
  c.window = m.window;
  c.attn_kernel = choose(kAttnKernels, m.attn_kernel, "model.attn_kernel");
  c.recompute = cfg.train.recompute;
  c.validate();
  return c;
}

std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab) {
  return std::make_unique<nn::DecoderModel>(model_config(cfg, tokenizer_vocab));
}

}  // namespace qkv::train
