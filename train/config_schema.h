// What each enumerated setting may be, and how two configs compare: the one place both are
// defined.
//
// Enumerated settings. Each enum has one table of spellings (name <-> value): the enum's owner
// keeps it where one exists (nn/transformer.h: family, position, norm, activation; data/: batching,
// padding side, separator, tokenizer), the rest are here. Everything that turns a spelling into a
// value or back goes through that table: config parsing (at load, so Config holds enums), to_toml
// and first_difference (name_of), the "must be one of" messages, model_difference, and the
// checkpoint's config text, so a spelling can never be accepted by one and unknown to another.
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

using nn::kActivations;
using nn::kFamilies;
using nn::kNorms;
using nn::kPositions;
inline constexpr std::array kAttnKernels = {Choice<attn::Kernel>{"fused", attn::Kernel::fused},
                                            Choice<attn::Kernel>{"reference", attn::Kernel::reference}};
// model.attention_pattern: full, the sparse patterns (attention/pattern/pattern.h: softmax attention under
// that pattern) and linear.
inline constexpr std::array kAttentionPatterns = {
    Choice<AttentionChoice>{"full", {nn::AttentionPattern::full, attn::Pattern::full}},
    Choice<AttentionChoice>{"window", {nn::AttentionPattern::full, attn::Pattern::window}},
    Choice<AttentionChoice>{"strided", {nn::AttentionPattern::full, attn::Pattern::strided}},
    Choice<AttentionChoice>{"global", {nn::AttentionPattern::full, attn::Pattern::global}},
    Choice<AttentionChoice>{"bigbird", {nn::AttentionPattern::full, attn::Pattern::bigbird}},
    Choice<AttentionChoice>{"block_sparse", {nn::AttentionPattern::full, attn::Pattern::block_sparse}},
    Choice<AttentionChoice>{"linear", {nn::AttentionPattern::linear, attn::Pattern::full}}};
inline constexpr std::array kLinearFeatures = {Choice<attn::LinearFeature>{"elu1", attn::LinearFeature::elu1},
                                               Choice<attn::LinearFeature>{"relu", attn::LinearFeature::relu},
                                               Choice<attn::LinearFeature>{"favor", attn::LinearFeature::favor}};
inline constexpr std::array kDevices = {Choice<Device>{"cpu", Device::cpu}, Choice<Device>{"cuda", Device::cuda}};
inline constexpr std::array kDtypes = {Choice<DType>{"float32", DType::f32}, Choice<DType>{"bf16", DType::bf16}};
inline constexpr std::array kLrSchedules = {Choice<train::LrScheduleKind>{"cosine", train::LrScheduleKind::cosine},
                                            Choice<train::LrScheduleKind>{"constant", train::LrScheduleKind::constant}};
// data.batching, data.padding_side, data.separator, data.tokenizer: kBatchModes, kPaddingSides
// (data/batcher.h), kDocSeparators (data/dataset.h), kTokenizerKinds (data/tokenizer.h).

// The table of an enumerated setting's type (overloads on the value's type).
constexpr const auto& spellings(nn::Family) { return kFamilies; }
constexpr const auto& spellings(nn::Position) { return kPositions; }
constexpr const auto& spellings(nn::NormKind) { return kNorms; }
constexpr const auto& spellings(nn::Activation) { return kActivations; }
constexpr const auto& spellings(attn::Kernel) { return kAttnKernels; }
constexpr const auto& spellings(AttentionChoice) { return kAttentionPatterns; }
constexpr const auto& spellings(attn::LinearFeature) { return kLinearFeatures; }
constexpr const auto& spellings(TokenizerKind) { return kTokenizerKinds; }
constexpr const auto& spellings(DocSeparator) { return kDocSeparators; }
constexpr const auto& spellings(BatchMode) { return kBatchModes; }
constexpr const auto& spellings(Padding) { return kPaddingSides; }
constexpr const auto& spellings(Device) { return kDevices; }
constexpr const auto& spellings(DType) { return kDtypes; }
constexpr const auto& spellings(train::LrScheduleKind) { return kLrSchedules; }
constexpr const auto& spellings(Numerics) { return kNumericsModes; }

// The spelling of an enumerated setting's value, as config files and checkpoints write it.
template <class E>
constexpr std::string_view name_of(E value) {
  return choice_name(spellings(value), value);
}

// train.zero: 0 = replicated optimizer, 1 = moments sharded across ranks (ZeRO stage 1).
inline constexpr int64_t kMaxZeroStage = 1;

template <class E, size_t N>
std::vector<std::string_view> names_of(const std::array<Choice<E>, N>& choices) {
  std::vector<std::string_view> out;
  for (const Choice<E>& c : choices) out.push_back(c.name);
  return out;
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
