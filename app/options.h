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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// A file or directory path: refused when given empty (`--resume ""` is not "no resume").
CLI::Option* add_path_option(CLI::App* cmd, const std::string& name, std::string& target, const std::string& help);

// --numerics standard|invariant (tensor/numerics.h): unset means the config's train.numerics.
CLI::Option* add_numerics_option(CLI::App* cmd, std::optional<Numerics>& target);
// The same option for a command that reads a config: it adds "train.numerics=MODE" to `sets`
// (the command's --set overrides).
CLI::Option* add_numerics_option(CLI::App* cmd, std::vector<std::string>& sets);

}  // namespace qkv::app
