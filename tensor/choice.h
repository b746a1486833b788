// A table of spellings: each name a setting may take, with the enum value it stands for. Defined
// here, at the bottom layer, so the layer that owns an enum (data/batcher.h: the batching modes)
// keeps its one table and the config (train/config_schema.h) validates and maps through it.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace qkv {

template <class E>
struct Choice {
  std::string_view name;
  E value;
};

// The value spelt `name`, or nullptr.
template <class E, size_t N>
constexpr const E* find_choice(const std::array<Choice<E>, N>& choices, std::string_view name) {
  for (const Choice<E>& c : choices)
    if (c.name == name) return &c.value;
  return nullptr;
}

// The spelling of `value` ("?" for a value outside the table).
template <class E, size_t N>
constexpr std::string_view choice_name(const std::array<Choice<E>, N>& choices, E value) {
  for (const Choice<E>& c : choices)
    if (c.value == value) return c.name;
  return "?";
}

// The spellings as a command-line message lists them: "a, b or c".
template <class E, size_t N>
std::string names_or(const std::array<Choice<E>, N>& choices) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    out += i == 0 ? "" : i + 1 == N ? " or " : ", ";
    out += choices[i].name;
  }
  return out;
}

}  // namespace qkv
