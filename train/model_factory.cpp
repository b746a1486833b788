#include "train/model_factory.h"

#include <string>
#include <variant>

#include "tensor/error.h"
#include "train/config_schema.h"

namespace qkv::train {
namespace {

using nn::ModelConfig;
using Member = std::variant<int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*, nn::Family ModelConfig::*,
                            nn::Position ModelConfig::*, nn::NormKind ModelConfig::*, nn::Activation ModelConfig::*,
                            attn::Kernel ModelConfig::*, nn::AttentionPattern ModelConfig::*,
                            attn::LinearFeature ModelConfig::*>;

// Each [model] key with the ModelConfig field it becomes, in the config's declaration order.
struct ModelField {
  const char* key;
  Member member;
};
const ModelField kModelFields[] = {
    {"model.family", &ModelConfig::family},
    {"model.n_layer", &ModelConfig::n_layer},
    {"model.n_head", &ModelConfig::n_head},
    {"model.n_kv_head", &ModelConfig::n_kv_head},
    {"model.n_embd", &ModelConfig::n_embd},
    {"model.block_size", &ModelConfig::block_size},
    {"model.vocab_size", &ModelConfig::vocab_size},
    {"model.dropout", &ModelConfig::dropout},
    {"model.attn_dropout", &ModelConfig::attn_dropout},
    {"model.norm_eps", &ModelConfig::norm_eps},
    {"model.rope_theta", &ModelConfig::rope_theta},
    {"model.ffn_hidden", &ModelConfig::ffn_hidden},
    {"model.position", &ModelConfig::position},
    {"model.norm", &ModelConfig::norm},
    {"model.activation", &ModelConfig::activation},
    {"model.bias", &ModelConfig::bias},
    {"model.tie_embeddings", &ModelConfig::tie_embeddings},
    {"model.window", &ModelConfig::window},
    {"model.init_std", &ModelConfig::init_std},
    {"model.attn_kernel", &ModelConfig::attn_kernel},
    {"model.attention_pattern", &ModelConfig::attention_pattern},
    {"model.linear_feature", &ModelConfig::linear_feature},
    {"model.linear_features", &ModelConfig::linear_features},
    {"model.linear_chunk", &ModelConfig::linear_chunk},
};

// A value as to_toml writes it.
std::string toml_text(int64_t v) { return std::to_string(v); }
std::string toml_text(double v) { return format_double(v); }
std::string toml_text(bool v) { return v ? "true" : "false"; }
template <class E, size_t N>
std::string toml_text(const std::array<Choice<E>, N>& table, E v) {
  std::string out(1, '"');  // appended, not "\"" + name: g++ 12 warns falsely (-Wrestrict) on that
  out += choice_name(table, v);
  return out += '"';
}
std::string toml_text(nn::Family v) { return toml_text(kFamilies, v); }
std::string toml_text(nn::Position v) { return toml_text(kPositions, v); }
std::string toml_text(nn::NormKind v) { return toml_text(kNorms, v); }
std::string toml_text(nn::Activation v) { return toml_text(kActivations, v); }
std::string toml_text(attn::Kernel v) { return toml_text(kAttnKernels, v); }
std::string toml_text(nn::AttentionPattern v) { return toml_text(kAttentionPatterns, v); }
std::string toml_text(attn::LinearFeature v) { return toml_text(kLinearFeatures, v); }

}  // namespace

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
  c.attention_pattern = choose(kAttentionPatterns, m.attention_pattern, "model.attention_pattern");
  c.linear_feature = choose(kLinearFeatures, m.linear_feature, "model.linear_feature");
  c.linear_features = m.linear_features > 0 ? m.linear_features : (c.n_head > 0 ? c.head_dim() : 0);
  c.linear_chunk = m.linear_chunk;
  c.recompute = cfg.train.recompute;
  c.validate();
  return c;
}

std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab) {
  return std::make_unique<nn::DecoderModel>(model_config(cfg, tokenizer_vocab));
}

std::optional<ConfigDifference> model_difference(const nn::ModelConfig& a, const nn::ModelConfig& b) {
  for (const ModelField& f : kModelFields) {
    std::optional<ConfigDifference> d = std::visit(
        [&](auto member) -> std::optional<ConfigDifference> {
          if (a.*member == b.*member) return std::nullopt;
          return ConfigDifference{f.key, toml_text(a.*member), toml_text(b.*member)};
        },
        f.member);
    if (d) return d;
  }
  // A field added to ModelConfig but not to kModelFields would make two different models "the same".
  ModelConfig a_as_b = a;
  a_as_b.recompute = b.recompute;
  QKV_CHECK(a_as_b == b, "internal error: nn::ModelConfig has a field that model_difference (train/model_factory.cpp) "
            "does not compare");
  return std::nullopt;
}

}  // namespace qkv::train
