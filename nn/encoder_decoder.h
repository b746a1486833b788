// A small encoder–decoder Transformer (Vaswani et al. 2017) built from qkv's own parts: the
// attention op, nn::CrossAttention, Linear, LayerNorm, Embedding. Pre-norm blocks:
//   encoder layer:  x += SelfAttn(LN(x))  (bidirectional: no causal mask, source key padding)
//                   x += MLP(LN(x))
//   decoder layer:  y += CausalSelfAttn(LN(y))
//                   y += CrossAttn(LN(y), memory)   (memory = LN(encoder output), source padding)
//                   y += MLP(LN(y))
//   logits = LN(y)·Eᵀ                                 (head tied to the shared token embedding E)
// MLP = fc2(gelu_tanh(fc1(·))). Token embeddings are shared by both sides; positions are learned per
// side (or none). The encoder's self-attention IS a CrossAttention whose memory is its own input.
// Parameter names follow Hugging Face's BART layout: shared.weight, encoder.embed_positions.weight,
// encoder.layers.i.{self_attn.{q,k,v,o}_proj, self_attn_layer_norm, fc1, fc2, final_layer_norm},
// encoder.layer_norm, decoder.layers.i.{self_attn, self_attn_layer_norm, encoder_attn,
// encoder_attn_layer_norm, fc1, fc2, final_layer_norm}, decoder.layer_norm.
//
// Legend: B batch, S source tokens, T target tokens, C n_embd, V vocab_size.
// Padding: the source's padding is a bool [B, S] (true = real token); padded source rows are never
// read (not as encoder keys, not as cross-attention memory), so their tokens change no output.
// Target rows are right-padded; the causal mask keeps pads from reaching earlier positions, and the
// loss ignores them (ignore_index).
#pragma once
#include <memory>
#include <vector>

#include "nn/cross_attention.h"
#include "nn/transformer.h"

namespace qkv::nn {

struct EncoderDecoderConfig {
  int64_t vocab_size = 16;
  int64_t n_embd = 64, n_head = 4, n_kv_head = 4, ffn_hidden = 128;
  int64_t enc_layers = 2, dec_layers = 2;
  int64_t max_len = 32;                   // longest source and target (learned position tables)
  Position position = Position::learned;  // learned | none
  double norm_eps = 1e-5, init_std = 0.02;
  // Sizes > 0, n_embd % n_head == 0, n_head % n_kv_head == 0, position learned or none. Throws
  // qkv::Error naming the field ("encoder_decoder.n_head ...").
  void validate() const;
};

class EncoderDecoder : public Module {
 public:
  explicit EncoderDecoder(const EncoderDecoderConfig& cfg);
  const EncoderDecoderConfig& config() const { return cfg_; }
  // N(0, init_std) weights and embeddings, residual output projections (o_proj, fc2) scaled by
  // 1/sqrt(2·layers), zero biases, norm gains 1.
  void init_weights(uint64_t seed);
  // src [B, S] ids, src_padding optional bool [B, S] -> memory [B, S, C] (after the final norm)
  Tensor encode(const Tensor& src, const Tensor& src_padding = {}) const;
  // tgt [B, T] decoder input ids (start token first) -> logits [B, T, V]
  Tensor decode(const Tensor& tgt, const Tensor& memory, const Tensor& src_padding = {}) const;
  Tensor forward(const Tensor& src, const Tensor& src_padding, const Tensor& tgt) const {
    return decode(tgt, encode(src, src_padding), src_padding);
  }
  // Greedy decoding from `bos` for up to max_new tokens (no cache: the decoder reruns on the prefix);
  // each row stops at `eos` (kept) and the rest of it is eos. Returns [B][max_new].
  std::vector<std::vector<int64_t>> greedy(const Tensor& src, const Tensor& src_padding, int64_t bos, int64_t eos,
                                           int64_t max_new) const;

 private:
  class EncoderLayer;
  class DecoderLayer;
  Tensor embed(const std::shared_ptr<Embedding>& pos, const Tensor& ids) const;
  EncoderDecoderConfig cfg_;
  std::shared_ptr<Embedding> shared_, enc_pos_, dec_pos_;
  std::vector<std::shared_ptr<EncoderLayer>> enc_;
  std::vector<std::shared_ptr<DecoderLayer>> dec_;
  std::shared_ptr<LayerNorm> enc_norm_, dec_norm_;
};

}  // namespace qkv::nn
