// The decoder-only Transformer: pre-norm blocks (norm -> attention -> residual, norm -> MLP ->
// residual), a final norm and an LM head. Two families are presets over the same parts:
//   gpt2:  learned positions, LayerNorm with bias, GELU (tanh), tied head, fused c_attn;
//   llama: RoPE (rotate-half), RMSNorm, SwiGLU, no bias, GQA, separate q/k/v projections.
// Every part can be switched independently (position, norm, activation, bias, tie, window).
//
// Legend: B batch, T tokens in this call, C n_embd, Hq/Hkv query/kv heads, hd = C/Hq, V vocab.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "attention/attention.h"
#include "attention/kv_cache.h"
#include "attention/linear/linear_attention.h"
#include "nn/layers.h"
#include "tensor/choice.h"
#include "tensor/value_range.h"

namespace qkv::nn {

enum class Family { gpt2, llama };
enum class Position { learned, rope, sinusoidal, alibi, none };
enum class NormKind { layernorm, rmsnorm };
enum class Activation { gelu_tanh, gelu, swiglu, relu };
// full: softmax attention (attention/attention.h); linear: attention/linear/linear_attention.h.
enum class AttentionPattern { full, linear };

// The spellings of the enums above: the names the config keys model.family, model.position,
// model.norm and model.activation take (train/config_schema.h), and that checkpoints store.
inline constexpr std::array kFamilies = {Choice<Family>{"gpt2", Family::gpt2}, Choice<Family>{"llama", Family::llama}};
inline constexpr std::array kPositions = {
    Choice<Position>{"learned", Position::learned}, Choice<Position>{"rope", Position::rope},
    Choice<Position>{"sinusoidal", Position::sinusoidal}, Choice<Position>{"alibi", Position::alibi},
    Choice<Position>{"none", Position::none}};
inline constexpr std::array kNorms = {Choice<NormKind>{"layernorm", NormKind::layernorm},
                                      Choice<NormKind>{"rmsnorm", NormKind::rmsnorm}};
inline constexpr std::array kActivations = {
    Choice<Activation>{"gelu_tanh", Activation::gelu_tanh}, Choice<Activation>{"gelu", Activation::gelu},
    Choice<Activation>{"swiglu", Activation::swiglu}, Choice<Activation>{"relu", Activation::relu}};

struct ModelConfig {
  Family family = Family::gpt2;
  int64_t n_layer = 4, n_head = 4, n_kv_head = 4, n_embd = 128, block_size = 64, vocab_size = 65;
  int64_t ffn_hidden = 512;  // resolved (not 0)
  double dropout = 0.0, attn_dropout = 0.0, norm_eps = 1e-5, rope_theta = 10000.0, init_std = 0.02;
  Position position = Position::learned;
  NormKind norm = NormKind::layernorm;
  Activation activation = Activation::gelu_tanh;
  bool bias = true, tie_embeddings = true;
  int64_t window = 0;
  attn::Kernel attn_kernel = attn::Kernel::fused;
  attn::SparsePattern pattern;  // resolved (stride, block size; a layout file read): passed to every attention call
  bool recompute = false;       // activation recomputation per block
  AttentionPattern attention_pattern = AttentionPattern::full;
  attn::LinearFeature linear_feature = attn::LinearFeature::elu1;
  int64_t linear_features = 32;  // favor's m (resolved: the head size unless set)
  int64_t linear_chunk = 64;

  int64_t head_dim() const { return n_embd / n_head; }
  bool operator==(const ModelConfig&) const = default;
  // The rules of a model's shape and numbers, written once: sizes > 0, n_embd % n_head == 0,
  // n_head % n_kv_head == 0, dropouts in [0, 1), norm_eps and rope_theta > 0, window and init_std
  // >= 0, an even head size for RoPE and an even n_embd for sinusoidal positions; linear attention
  // with linear_features and linear_chunk > 0 and none of ALiBi, attn_dropout, window or the
  // reference kernel (each is defined on softmax weights, which linear attention never forms). Throws
  // qkv::Error naming the config key at fault ("model.n_head ..."); the config's validator
  // (train/config.cpp) runs the same check on the model a config describes.
  void validate() const;
};

// The range ModelConfig::validate holds a size or number to, by its config key ("model.n_layer"):
// the one statement of it, which the config reference (train/config.h, config_reference) shows.
// nullopt for a key the model gives no range (linear_features and linear_chunk are checked
// only under linear attention and have their range in the config's key table).
std::optional<std::variant<IntRange, RealRange>> model_key_range(std::string_view key);

struct ModelCache;

// What a layer's attention step calls, as one replaceable object: RoPE, a last word on the options
// of the attention call, and the attention op (plain, packed, or with its weights for inspection).
// The library's ops (the default) call attention/rope.h and attention/attention.h as documented
// there. A tool that must run a model with a known bug installs its own (leakcheck's self-test,
// analysis/leakcheck_selftest.cpp), so the model carries no test switch of its own.
class AttentionOps {
 public:
  virtual ~AttentionOps() = default;
  // x [B, H, T, hd] rotated by absolute `positions`; `cached` keys of the layer precede this
  // call's tokens in its KV cache (0 without one).
  virtual Tensor rope(const Tensor& x, const Tensor& positions, double theta, int64_t cached) const;
  // The options of one layer's call as the layer built them (`cfg` its model's config, `training`
  // its mode, `rng` the forward's dropout stream); the library's returns them unchanged.
  virtual attn::AttentionOptions options(attn::AttentionOptions o, const ModelConfig& cfg, bool training,
                                         RngContext& rng) const;
  virtual Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& o) const;
  virtual Tensor attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                                  const attn::AttentionOptions& o) const;
  // model.attention_pattern = linear: the layer's causal linear attention (whole sequences; decoding
  // steps the layer's LinearState instead).
  virtual Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const attn::LinearAttentionOptions& o) const;
  virtual attn::AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                        const attn::AttentionOptions& o) const;
  // Continuous batching (ForwardArgs::row_caches): the cache row `row` appends to and attends over.
  // The library's is row_caches[row], the row's own; replaceable so that leakcheck's self-test can
  // plant a row that reads another row's cache.
  virtual ModelCache& row_cache(const std::vector<ModelCache*>& row_caches, size_t row) const;
  // The library's ops (one shared instance).
  static std::shared_ptr<const AttentionOps> library();
};

// One incremental-decoding cache per layer: the KV cache of softmax attention, or for
// attention_pattern = linear the recurrent state (S, z) of each layer, whose size does not grow
// with the length (`linear`; `layers` is then empty).
struct ModelCache {
  std::vector<attn::KVCache> layers;
  std::vector<attn::LinearState> linear;
  int64_t length() const;
  void clear();  // every layer back to length 0
  // Bytes held by the cache's buffers (KV: capacity-sized; linear: the states).
  int64_t bytes() const;
};

// What one layer's attention saw and produced, for inspection tools (leakcheck's reference check,
// attention maps): the projections BEFORE RoPE (this call's tokens only) and the output before
// the output projection.
struct AttentionCapture {
  Tensor q, k, v;  // [B, Hq, T, hd], [B, Hkv, T, hd], [B, Hkv, T, hd]
  Tensor out;      // [B, Hq, T, hd]
};

struct ForwardArgs {
  Tensor ids;                             // [B, T] int64 (or int32)
  Tensor positions;                       // optional [B, T] int64 absolute positions; default: cache length + t
  Tensor key_padding;                     // optional bool [B, Nk] true = real token (Nk = cache length + T)
  Tensor segment_ids;                     // optional [B, T] document index (packed rows): block-diagonal attention
  ModelCache* cache = nullptr;            // append this call's K/V and attend over all cached keys
  std::vector<Tensor>* hidden = nullptr;  // if set, receives every block's output [B,T,C]
  std::vector<AttentionCapture>* attention = nullptr;  // if set, receives every layer's attention
  RngContext rng;                                      // dropout masks (training mode only)
  // Per-row caches (continuous batching): row b of ids appends to and attends over
  // *row_caches[b] alone, a cache of batch 1 (make_cache(1, capacity)); the rows' caches may hold
  // different lengths, and row b's default positions are row_caches[b]->length() + t. The
  // projections, norms, MLP and LM head run once on the whole [B, T, C] batch; only attention
  // loops over the rows, each exactly the call a batch-1 forward with `cache` makes (so under
  // numerics = invariant row b's logits are bitwise those of decoding it alone). Excludes
  // `cache`, key_padding and segment_ids.
  std::vector<ModelCache*> row_caches;
  // Logits of each row's last position only ([B, 1, V]): what a sampler reads after a prefill.
  // The final norm and LM head are row-wise, so under numerics = invariant these are bitwise that
  // row of the full [B, T, V]; the other T - 1 rows' head GEMM is skipped (V·C FMAs per token).
  bool last_logits_only = false;
};

class Block;

class DecoderModel : public Module {
 public:
  explicit DecoderModel(const ModelConfig& cfg);
  const ModelConfig& config() const { return cfg_; }
  // GPT-2 initialisation: N(0, init_std) for weights and embeddings, zero biases, residual output
  // projections scaled by 1/sqrt(2 n_layer); norms weight 1.
  void init_weights(uint64_t seed);
  Tensor forward(ForwardArgs& args) const;  // logits [B, T, V]; inputs on another device are moved
  void to(Device device) override;
  Device device() const { return tok_emb_->weight.device(); }
  ModelCache make_cache(int64_t batch, int64_t capacity) const;
  int64_t non_embedding_parameter_count() const;
  // The attention ops every layer calls (AttentionOps::library() unless replaced; nullptr restores it).
  const std::shared_ptr<const AttentionOps>& attention_ops() const { return attention_ops_; }
  void set_attention_ops(std::shared_ptr<const AttentionOps> ops);
  // bf16 inference (a model trained with train.dtype = "bf16"): every forward runs under bf16
  // autocast, as the trainer's did, whether or not the caller turned it on. load_for_inference
  // sets it from the checkpoint's config.
  void set_bf16_autocast(bool on) { bf16_autocast_ = on; }
  bool bf16_autocast() const { return bf16_autocast_; }

 private:
  ModelConfig cfg_;
  bool bf16_autocast_ = false;
  std::shared_ptr<const AttentionOps> attention_ops_ = AttentionOps::library();  // read by every layer
  std::shared_ptr<Module> root_;  // "transformer" (gpt2) or "model" (llama)
  std::shared_ptr<Embedding> tok_emb_, pos_emb_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<Module> final_norm_;
  std::shared_ptr<Linear> lm_head_;
  Tensor sinusoid_;  // [block_size, C] when position == sinusoidal
};

// The family's spelling in kFamilies ("gpt2", "llama").
inline const char* family_name(Family f) { return choice_name(kFamilies, f).data(); }

}  // namespace qkv::nn
