// Numeric command-line options: the one parser every command's numbers go through, and the one
// place each option states its range (beside its name, where it is declared).
//
// A config key's option takes the key's range (int_key_range, train/config.h).
// A value is the whole argument, read exactly: an integer in decimal (a sign, then digits) or a
// finite decimal number. Refused, with one line naming the option, the range and the text given:
// an empty string (never read as 0 or as "unset"), trailing text ("12abc", "1e3" for an integer),
// a value past int64 (never wrapped), NaN and ±inf, and anything outside the option's range.
// The range is appended to the option's help text, so `--help` shows what is accepted.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/choice.h"
#include "tensor/numerics.h"
#include "tensor/value_range.h"

namespace qkv::app {

// `text` read as the value of option `name`; throws qkv::Error
// "<name> must be <describe(r)>; got \"<text>\"".
int64_t parse_int(std::string_view name, std::string_view text, IntRange r);
double parse_real(std::string_view name, std::string_view text, const RealRange& r);

// Options whose values go through parse_int / parse_real. An int target takes a range inside
// int's. The non-optional ones show their initial value as the default.
CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, int64_t& target, IntRange r,
                            const std::string& help);
CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, int& target, IntRange r, const std::string& help);
CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, std::optional<int64_t>& target, IntRange r,
                            const std::string& help);
// One or more values after the option (`--n 256 1024`).
CLI::Option* add_int_list_option(CLI::App* cmd, const std::string& name, std::vector<int64_t>& target, IntRange r,
                                 const std::string& help);
CLI::Option* add_real_option(CLI::App* cmd, const std::string& name, double& target, const RealRange& r,
                             const std::string& help);
CLI::Option* add_real_option(CLI::App* cmd, const std::string& name, std::optional<double>& target, const RealRange& r,
                             const std::string& help);

// The kinds of value an option takes, as each option's CLI11 type name records it: what the
// walk over every option (tests/app/test_cli_properties.cpp) reads to know which answer a value
// deserves. Every option that takes a value is declared through one of the functions below.
// (Names CLI11 itself never gives, so an option declared around these functions stands out.)
inline constexpr const char* kPathType = "PATH";      // any non-empty text names a file or directory
inline constexpr const char* kTextType = "STRING";    // free text (a prompt, a regular expression)
inline constexpr const char* kChoiceType = "CHOICE";  // one of a fixed list of names
inline constexpr const char* kListType = "LIST";      // a comma-separated list, read at parse time
inline constexpr const char* kIntType = "INTEGER";
inline constexpr const char* kRealType = "NUMBER";
inline constexpr const char* kSetType = "KEY=VALUE";  // --set: a config key and its value

// A file or directory path: refused when given empty (`--resume ""` is not "no resume").
CLI::Option* add_path_option(CLI::App* cmd, const std::string& name, std::string& target, const std::string& help);
// Free text. `allow_empty`: "" is a meaningful value (an empty prompt); otherwise it is refused.
CLI::Option* add_text_option(CLI::App* cmd, const std::string& name, std::string& target, bool allow_empty,
                             const std::string& help);
// One of `names`, checked when the command line is parsed (before any file is opened).
CLI::Option* add_choice_option(CLI::App* cmd, const std::string& name, std::string& target,
                               std::vector<std::string> names, const std::string& help);
// The spellings of a table (tensor/choice.h), for add_choice_option.
template <class E, size_t N>
std::vector<std::string> choice_names(const std::array<Choice<E>, N>& choices) {
  std::vector<std::string> out;
  for (const Choice<E>& c : choices) out.emplace_back(c.name);
  return out;
}

// A comma-separated list: `parse` reads (and refuses) the text when the command line is parsed.
CLI::Option* add_list_option(CLI::App* cmd, const std::string& name, std::string& target,
                             std::function<void(const std::string&)> parse, const std::string& help);
// --set section.key=value (repeatable): the key and the value's type are checked when the command
// line is parsed (train/config.h apply_override on the defaults); ranges and the rules between
// keys when the config is read.
CLI::Option* add_set_option(CLI::App* cmd, std::vector<std::string>& sets, const std::string& help);

// An option that only acts together with another setting, given without it: refused naming both
// ("[bench] --pattern-stride only acts with --what attention; got --what step"). `active`: whether
// what the options need is there; `needs`: it, in words; `got`: what was given instead ("" if
// nothing was).
void refuse_alone(const CLI::App* cmd, std::initializer_list<const char*> options, bool active, std::string_view needs,
                  std::string_view got = "");

// --numerics standard|invariant (tensor/numerics.h): unset means the config's train.numerics.
CLI::Option* add_numerics_option(CLI::App* cmd, std::optional<Numerics>& target);
// The same option for a command that reads a config: it adds "train.numerics=MODE" to `sets`
// (the command's --set overrides).
CLI::Option* add_numerics_option(CLI::App* cmd, std::vector<std::string>& sets);

}  // namespace qkv::app
