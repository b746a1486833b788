// What each enumerated setting may be, and how two configs compare: the one place both are
// defined.
//
// Enumerated settings. Each key's spellings are listed once, with the enum value each one stands
// for: here, or for data.batching and data.padding_side in data/batcher.h (data/ owns that enum
// and checkpoints read it too). validate() (config.cpp) accepts exactly these names; the string
// -> enum mapping goes through the same table: at use through choose() (model_factory: the
// model's family, position, norm, activation, attention kernel), or at load (data.batching and
// data.padding_side are enum-typed in config.h), so a spelling can never be accepted by one and
// unknown to the other. Keys whose value is not turned into an enum type (data.tokenizer,
// data.separator, train.device, train.dtype, train.lr_schedule) have a list of names only.
//
// Comparison. first_difference() walks the one key table (config.cpp) and compares values with
// their types' ==, so anything asking "did this setting change?" uses the same field list
// instead of its own field-by-field code. Whether two configs describe the same model is asked
// of the models they build (model_difference, train/model_factory.h): checkpoint saving and
// --resume (train/session.h) share it.
#pragma once
#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attention/attention.h"
#include "data/batcher.h"
#include "nn/transformer.h"
#include "tensor/choice.h"
#include "tensor/error.h"
#include "train/config.h"

namespace qkv {

inline constexpr std::array kFamilies = {Choice<nn::Family>{"gpt2", nn::Family::gpt2},
                                         Choice<nn::Family>{"llama", nn::Family::llama}};
inline constexpr std::array kPositions = {
    Choice<nn::Position>{"learned", nn::Position::learned}, Choice<nn::Position>{"rope", nn::Position::rope},
    Choice<nn::Position>{"sinusoidal", nn::Position::sinusoidal}, Choice<nn::Position>{"alibi", nn::Position::alibi},
    Choice<nn::Position>{"none", nn::Position::none}};
inline constexpr std::array kNorms = {Choice<nn::NormKind>{"layernorm", nn::NormKind::layernorm},
                                      Choice<nn::NormKind>{"rmsnorm", nn::NormKind::rmsnorm}};
inline constexpr std::array kActivations = {Choice<nn::Activation>{"gelu_tanh", nn::Activation::gelu_tanh},
                                            Choice<nn::Activation>{"gelu", nn::Activation::gelu},
                                            Choice<nn::Activation>{"swiglu", nn::Activation::swiglu},
                                            Choice<nn::Activation>{"relu", nn::Activation::relu}};
inline constexpr std::array kAttnKernels = {Choice<attn::Kernel>{"fused", attn::Kernel::fused},
                                            Choice<attn::Kernel>{"reference", attn::Kernel::reference}};
// model.attention_pattern: full, the sparse patterns (attention/patterns.h, attn::parse_pattern's
// names) and linear. Every name but linear is softmax attention (nn::AttentionPattern::full) whose
// mask the resolved attn::SparsePattern (nn::ModelConfig::pattern) carries.
inline constexpr std::array kAttentionPatterns = {
    Choice<nn::AttentionPattern>{"full", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"window", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"strided", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"global", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"bigbird", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"block_sparse", nn::AttentionPattern::full},
    Choice<nn::AttentionPattern>{"linear", nn::AttentionPattern::linear}};
inline constexpr std::array kLinearFeatures = {Choice<attn::LinearFeature>{"elu1", attn::LinearFeature::elu1},
                                               Choice<attn::LinearFeature>{"relu", attn::LinearFeature::relu},
                                               Choice<attn::LinearFeature>{"favor", attn::LinearFeature::favor}};
// data.batching and data.padding_side: kBatchModes and kPaddingSides, owned by data/batcher.h
// (which checkpoints and the batcher read too).
inline constexpr std::array<std::string_view, 4> kTokenizers = {"char", "byte", "bpe", "gpt2_bpe"};
inline constexpr std::array<std::string_view, 3> kSeparators = {"blank_line", "percent_line", "none"};
inline constexpr std::array<std::string_view, 2> kDevices = {"cpu", "cuda"};
inline constexpr std::array<std::string_view, 2> kDtypes = {"float32", "bf16"};
inline constexpr std::array<std::string_view, 2> kLrSchedules = {"cosine", "constant"};
// train.zero: 0 = replicated optimizer, 1 = moments sharded across ranks (ZeRO stage 1).
inline constexpr int64_t kMaxZeroStage = 1;

template <class E, size_t N>
std::vector<std::string_view> names_of(const std::array<Choice<E>, N>& choices) {
  std::vector<std::string_view> out;
  for (const Choice<E>& c : choices) out.push_back(c.name);
  return out;
}
template <size_t N>
std::vector<std::string_view> names_of(const std::array<std::string_view, N>& names) {
  return {names.begin(), names.end()};
}

// A double as to_toml writes it: the shortest text that reads back to the same value, plain
// decimals while they stay short (0.0003 rather than 3e-04), always with a '.' or an exponent so
// TOML reads a float.
std::string format_double(double v);

// `key must be one of "a", "b"[ (or "" for the family default)]; got "v"` (without an origin).
std::string not_one_of(std::string_view key, std::string_view value, const std::vector<std::string_view>& names,
                       bool empty_ok);

// The value spelt `name`; throws not_one_of(key, ...) for any other spelling.
template <class E, size_t N>
E choose(const std::array<Choice<E>, N>& choices, std::string_view name, std::string_view key) {
  for (const Choice<E>& c : choices)
    if (c.name == name) return c.value;
  fail(not_one_of(key, name, names_of(choices), false));
}

// The first key, in declaration order, among those selected by `keys` ("section.key", or
// "section." for a whole section) whose value differs between `a` and `b` (compared as stored:
// resolve both first when family defaults matter). Values come back as TOML text.
struct ConfigDifference {
  std::string key, a, b;
};
std::optional<ConfigDifference> first_difference(const Config& a, const Config& b,
                                                 std::initializer_list<std::string_view> keys);

}  // namespace qkv
