#include "app/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "tensor/error.h"

namespace qkv::app {
namespace {

std::string with_range(const std::string& help, const std::string& range) {
  return help.empty() ? range : help + " (" + range + ")";
}

}  // namespace

int64_t parse_int(std::string_view name, std::string_view text, IntRange r) {
  int64_t v = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  // from_chars takes '-' but not '+': a '+' is dropped when a digit follows it (never before a
  // '-', which would read "+-5" as -5).
  if (last - first >= 2 && *first == '+' && first[1] >= '0' && first[1] <= '9') ++first;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (text.empty() || ec != std::errc() || end != last || !r.contains(v))
    fail(name, " must be ", describe(r), "; got \"", text, "\"");
  return v;
}

double parse_real(std::string_view name, std::string_view text, const RealRange& r) {
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() || std::isspace(static_cast<unsigned char>(s[0])) ? NAN : std::strtod(s.c_str(), &end);
  const bool whole = end == s.c_str() + s.size();  // an embedded NUL ends strtod early
  if (!whole || !r.contains(v)) fail(name, " must be ", describe(r), "; got \"", text, "\"");
  return v;
}

CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, int64_t& target, IntRange r,
                            const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name, r](const std::string& s) { target = parse_int(name, s, r); },
          with_range(help, describe(r)))
      ->type_name(kIntType)
      ->default_str(std::to_string(target));
}

CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, int& target, IntRange r, const std::string& help) {
  QKV_CHECK(r.lo >= std::numeric_limits<int>::min() && r.hi <= std::numeric_limits<int>::max(),
            "internal error: the range of ", name, " does not fit an int");
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name, r](const std::string& s) { target = static_cast<int>(parse_int(name, s, r)); },
          with_range(help, describe(r)))
      ->type_name(kIntType)
      ->default_str(std::to_string(target));
}

CLI::Option* add_int_option(CLI::App* cmd, const std::string& name, std::optional<int64_t>& target, IntRange r,
                            const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name, r](const std::string& s) { target = parse_int(name, s, r); },
          with_range(help, describe(r)))
      ->type_name(kIntType);
}

CLI::Option* add_int_list_option(CLI::App* cmd, const std::string& name, std::vector<int64_t>& target, IntRange r,
                                 const std::string& help) {
  return cmd
      ->add_option_function<std::vector<std::string>>(
          name,
          [&target, name, r](const std::vector<std::string>& values) {
            target.clear();
            for (const std::string& s : values) target.push_back(parse_int(name, s, r));
          },
          with_range(help, "each " + describe(r)))
      ->type_name(kIntType);
}

CLI::Option* add_real_option(CLI::App* cmd, const std::string& name, double& target, const RealRange& r,
                             const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name, r](const std::string& s) { target = parse_real(name, s, r); },
          with_range(help, describe(r)))
      ->type_name(kRealType)
      ->default_str(cat(target));
}

CLI::Option* add_real_option(CLI::App* cmd, const std::string& name, std::optional<double>& target, const RealRange& r,
                             const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&target, name, r](const std::string& s) { target = parse_real(name, s, r); },
          with_range(help, describe(r)))
      ->type_name(kRealType);
}

CLI::Option* add_path_option(CLI::App* cmd, const std::string& name, std::string& target, const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name,
          [&target, name](const std::string& s) {
            if (s.empty()) fail(name, " is an empty path; it must name a file or directory");
            target = s;
          },
          help)
      ->type_name(kPathType);
}

CLI::Option* add_text_option(CLI::App* cmd, const std::string& name, std::string& target, bool allow_empty,
                             const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name,
          [&target, name, allow_empty](const std::string& s) {
            if (s.empty() && !allow_empty) fail(name, " is empty; give it some text");
            target = s;
          },
          help)
      ->type_name(kTextType);
}

CLI::Option* add_choice_option(CLI::App* cmd, const std::string& name, std::string& target,
                               std::vector<std::string> names, const std::string& help) {
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return cmd
      ->add_option_function<std::string>(
          name,
          [&target, name, names, list](const std::string& s) {
            if (std::find(names.begin(), names.end(), s) == names.end())
              fail(name, " must be ", list, "; got \"", s, "\"");
            target = s;
          },
          help)
      ->type_name(kChoiceType)
      ->default_str(target);
}

CLI::Option* add_list_option(CLI::App* cmd, const std::string& name, std::string& target,
                             std::function<void(const std::string&)> parse, const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name,
          [&target, parse](const std::string& s) {
            parse(s);
            target = s;
          },
          help)
      ->type_name(kListType);
}

void refuse_alone(const CLI::App* cmd, std::initializer_list<const char*> options, bool active, std::string_view needs,
                  std::string_view got) {
  if (active) return;
  for (const char* option : options)
    if (cmd->count(option) > 0)
      fail("[", cmd->get_name(), "] ", option, " only acts with ", needs,
           got.empty() ? std::string() : cat("; got ", got));
}

CLI::Option* add_numerics_option(CLI::App* cmd, std::optional<Numerics>& target) {
  return cmd
      ->add_option_function<std::string>(
          "--numerics",
          [&target](const std::string& s) {
            const Numerics* mode = find_choice(kNumericsModes, s);
            if (!mode) fail("--numerics must be ", names_or(kNumericsModes), "; got \"", s, "\"");
            target = *mode;
          },
          "standard | invariant: the kernels' numerics (default: the config's train.numerics)")
      ->type_name(kChoiceType);
}

CLI::Option* add_numerics_option(CLI::App* cmd, std::vector<std::string>& sets) {
  return cmd
      ->add_option_function<std::string>(
          "--numerics",
          [&sets](const std::string& s) {
            QKV_CHECK(find_choice(kNumericsModes, s), "--numerics must be ", names_or(kNumericsModes), "; got \"", s,
                      "\"");
            sets.push_back("train.numerics=" + s);
          },
          "standard | invariant: the kernels' numerics (sets train.numerics)")
      ->type_name(kChoiceType);
}

}  // namespace qkv::app
