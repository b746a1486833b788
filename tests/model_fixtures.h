// Shared by the tests: small model configurations whose sizes put every kernel on its ragged
// edges, a model built from one ready for evaluation, and reproducible token sequences. Each test
// chooses the sizes it relies on at the call site (ffn_hidden, block_size, ...), so one base
// serves cases that need different tails.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/transformer.h"

namespace qkv::test {

// A 2-layer gpt2-family model (learned positions, LayerNorm, GELU, biases, tied head) with
// n_kv_head = n_head.
inline nn::ModelConfig gpt2_config(int64_t n_head, int64_t n_embd, int64_t ffn_hidden, int64_t vocab_size,
                                   int64_t block_size) {
  nn::ModelConfig c;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_kv_head = n_head;
  c.n_embd = n_embd;
  c.ffn_hidden = ffn_hidden;
  c.vocab_size = vocab_size;
  c.block_size = block_size;
  return c;
}

// gpt2 with 4 heads of 25 (n_embd 100) and vocabulary 259: rows of 100 floats, a head size and a
// vocabulary that are no multiple of any vector width, so every kernel meets its ragged edges.
// ffn_hidden not a multiple of 8 (402) also puts elementwise kernels' vector tails mid-row.
inline nn::ModelConfig ragged_gpt2(int64_t ffn_hidden, int64_t block_size) {
  return gpt2_config(4, 100, ffn_hidden, 259, block_size);
}

// The llama family's parts on any config: RoPE, RMSNorm, SwiGLU, no biases, an untied head.
inline nn::ModelConfig llama_family(nn::ModelConfig c) {
  c.family = nn::Family::llama;
  c.position = nn::Position::rope;
  c.norm = nn::NormKind::rmsnorm;
  c.activation = nn::Activation::swiglu;
  c.bias = false;
  c.tie_embeddings = false;
  return c;
}

// ragged_gpt2's sizes in the llama family, with n_embd 96 (head size 24) and GQA 4:2.
inline nn::ModelConfig ragged_llama(int64_t ffn_hidden, int64_t block_size) {
  nn::ModelConfig c = llama_family(ragged_gpt2(ffn_hidden, block_size));
  c.n_embd = 96;
  c.n_kv_head = 2;
  return c;
}

// The model of `c` with init_weights(seed), in eval mode.
inline std::unique_ptr<nn::DecoderModel> eval_model(const nn::ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<nn::DecoderModel>(c);
  m->init_weights(seed);
  m->eval();
  return m;
}

// `n` pseudo-random token ids in [0, vocab): xorshift64 from seed * 2^64/φ + 1, one step per token.
template <class T = int32_t>
std::vector<T> tokens(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<T> t(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    v = static_cast<T>(s % static_cast<uint64_t>(vocab));
  }
  return t;
}

// `n` token ids walking the vocabulary with stride 37: (37 i + 11) mod vocab.
inline std::vector<int32_t> stride_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return t;
}

}  // namespace qkv::test
