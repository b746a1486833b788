#include "train/model_factory.h"

#include <algorithm>
#include <string>
#include <variant>

#include "tensor/error.h"
#include "train/config_schema.h"
#include "train/memory_budget.h"

namespace qkv::train {
namespace {

using nn::ModelConfig;
using Member =
    std::variant<int64_t ModelConfig::*, double ModelConfig::*, bool ModelConfig::*, nn::Family ModelConfig::*,
                 nn::Position ModelConfig::*, nn::NormKind ModelConfig::*, nn::Activation ModelConfig::*,
                 attn::Kernel ModelConfig::*, attn::LinearFeature ModelConfig::*>;

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
    {"model.linear_feature", &ModelConfig::linear_feature},
    {"model.linear_features", &ModelConfig::linear_features},
    {"model.linear_chunk", &ModelConfig::linear_chunk},
};

// A value as to_toml writes it.
std::string toml_text(int64_t v) { return std::to_string(v); }
std::string toml_text(double v) { return format_double(v); }
std::string toml_text(bool v) { return v ? "true" : "false"; }
template <class E>
std::string toml_text(E v) {
  std::string out(1, '"');  // appended, not "\"" + name: g++ 12 warns falsely (-Wrestrict) on that
  out += name_of(v);
  return out += '"';
}

// The pattern's first differing setting, named by its model.pattern_* key (values as TOML text).
std::optional<ConfigDifference> pattern_difference(const attn::SparsePattern& a, const attn::SparsePattern& b) {
  auto q = [](const std::string& s) { return '"' + s + '"'; };
  auto tokens = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  if (a.kind != b.kind)
    return ConfigDifference{"model.attention_pattern", toml_text(AttentionChoice{nn::AttentionPattern::full, a.kind}),
                            toml_text(AttentionChoice{nn::AttentionPattern::full, b.kind})};
  auto num = [](const char* key, int64_t x, int64_t y) -> std::optional<ConfigDifference> {
    if (x == y) return std::nullopt;
    return ConfigDifference{key, std::to_string(x), std::to_string(y)};
  };
  if (auto d = num("model.pattern_stride", a.stride, b.stride)) return d;
  if (auto d = num("model.pattern_local", a.local, b.local)) return d;
  if (auto d = num("model.pattern_global", a.global, b.global)) return d;
  if (a.global_tokens != b.global_tokens)
    return ConfigDifference{"model.pattern_global_tokens", q(tokens(a.global_tokens)), q(tokens(b.global_tokens))};
  if (auto d = num("model.pattern_random_blocks", a.random_blocks, b.random_blocks)) return d;
  if (auto d = num("model.pattern_block_size", a.block_size, b.block_size)) return d;
  // Two tables are compared by their contents (a checkpoint holds its table inline, a config may
  // name the file it came from); a generator by its name.
  const bool tables = !a.layout_table.empty() && !b.layout_table.empty();
  if (!tables && a.layout != b.layout) return ConfigDifference{"model.pattern_layout", q(a.layout), q(b.layout)};
  if (a.layout_table != b.layout_table || a.layout_rows != b.layout_rows)
    return ConfigDifference{"model.pattern_layout", q(attn::inline_layout(a)), q(attn::inline_layout(b))};
  if (auto d = num("model.pattern_seed", static_cast<int64_t>(a.seed), static_cast<int64_t>(b.seed))) return d;
  return std::nullopt;
}

int64_t ceil_sqrt(int64_t n) {
  int64_t s = 1;
  while (s * s < n) ++s;
  return s;
}

// model.attention_pattern and its model.pattern_* keys as the resolved pattern every layer passes
// to attention: "auto" stride and block size fixed from block_size (so decode keeps them), a
// layout file read.
attn::SparsePattern sparse_pattern(const ModelSettings& m) {
  attn::SparsePattern p;
  // Linear attention forms no weights to mask: its pattern is full. A key of another pattern is
  // refused before this by the config's validator (the key table's used_by, train/config.cpp).
  p.kind = m.attention_pattern.sparse;
  const bool strided = p.kind == attn::Pattern::strided;
  p.stride = strided && m.pattern_stride == 0 ? ceil_sqrt(m.block_size) : m.pattern_stride;
  p.local = m.pattern_local;
  p.global = m.pattern_global;
  p.random_blocks = m.pattern_random_blocks;
  p.block_size = m.pattern_block_size > 0 ? m.pattern_block_size : std::clamp<int64_t>(m.block_size / 4, 1, 64);
  p.layout = m.pattern_layout;
  p.seed = static_cast<uint64_t>(m.pattern_seed);
  // "0, 17,33" -> {0, 17, 33}
  std::string tok;
  auto flush = [&] {
    if (tok.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) { used = 0; }
    QKV_CHECK(used == tok.size(), "model.pattern_global_tokens must be positions separated by commas, got \"",
              m.pattern_global_tokens, "\"");
    QKV_CHECK(v >= 0, "model.pattern_global_tokens: position ", v, " is negative; positions count from 0, got \"",
              m.pattern_global_tokens, "\"");
    p.global_tokens.push_back(v);
    tok.clear();
  };
  for (char ch : m.pattern_global_tokens) {
    if (ch == ',' || ch == ' ') flush();
    else tok += ch;
  }
  flush();
  if (p.kind == attn::Pattern::block_sparse) {
    try {
      attn::load_layout(p);
    } catch (const Error& e) { fail("model.pattern_layout: ", e.what()); }
  }
  return p;
}

}  // namespace

nn::ModelConfig model_config(const Config& cfg, int64_t tokenizer_vocab) {
  const ModelSettings& m = cfg.model;
  nn::ModelConfig c;
  c.family = m.family;
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
  c.position = m.resolved_position();
  c.norm = m.resolved_norm();
  c.activation = m.resolved_activation();
  c.bias = m.resolved_bias();
  c.tie_embeddings = m.resolved_tie_embeddings();
  c.window = m.window;
  c.attn_kernel = m.attn_kernel;
  c.attention_pattern = m.attention_pattern.attention;
  c.linear_feature = m.linear_feature;
  c.linear_features = m.linear_features > 0 ? m.linear_features : (c.n_head > 0 ? c.head_dim() : 0);
  c.linear_chunk = m.linear_chunk;
  c.pattern = sparse_pattern(m);
  c.recompute = cfg.train.recompute;
  c.validate();
  return c;
}

std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab, ModelUse use) {
  const nn::ModelConfig mc = model_config(cfg, tokenizer_vocab);
  check_memory_budget(cfg, tokenizer_vocab, use);  // before a byte of the model is allocated
  return std::make_unique<nn::DecoderModel>(mc);
}

std::optional<ConfigDifference> model_difference(const nn::ModelConfig& a, const nn::ModelConfig& b) {
  // model.attention_pattern is two fields (softmax or linear; the sparse pattern): named as written.
  auto pattern_text = [](const ModelConfig& c) {
    return toml_text(AttentionChoice{c.attention_pattern, c.pattern.kind});
  };
  if (a.attention_pattern != b.attention_pattern)
    return ConfigDifference{"model.attention_pattern", pattern_text(a), pattern_text(b)};
  for (const ModelField& f : kModelFields) {
    std::optional<ConfigDifference> d = std::visit(
        [&](auto member) -> std::optional<ConfigDifference> {
          if (a.*member == b.*member) return std::nullopt;
          return ConfigDifference{f.key, toml_text(a.*member), toml_text(b.*member)};
        },
        f.member);
    if (d) return d;
  }
  if (auto d = pattern_difference(a.pattern, b.pattern)) return d;
  // A field added to ModelConfig but not to kModelFields would make two different models "the same".
  ModelConfig a_as_b = a;
  a_as_b.recompute = b.recompute;
  QKV_CHECK(a_as_b == b,
            "internal error: nn::ModelConfig has a field that model_difference (train/model_factory.cpp) "
            "does not compare");
  return std::nullopt;
}

}  // namespace qkv::train
