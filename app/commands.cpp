#include "app/commands.h"

#include <iostream>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/error.h"
#include "train/config_schema.h"
#include "train/did_you_mean.h"

namespace qkv::app {

// Invalid UTF-8 in a string (generated text, a file name given on the command line) is written
// with each bad sequence replaced by U+FFFD: printing the JSON line must never be what fails.
void print_json(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

void print_error_json(const std::string& message, int exit_status) {
  print_json({{"error", message}, {"exit", exit_status}});
}

Device device_option(const std::string& name) {
  const Device* dev = find_choice(kDevices, name);
  QKV_CHECK(dev, "--device must be ", names_or(kDevices), ", got '", name, "'");
  if (*dev == Device::cpu) return Device::cpu;
  QKV_CHECK(cuda::device_count() > 0, "--device cuda: no CUDA device is visible (or this build has no CUDA backend)");
  return Device::cuda;
}

void add_all_commands(CLI::App& root, int& exit_code) {
  add_train_command(root, exit_code);
  add_sample_command(root, exit_code);
  add_eval_command(root, exit_code);
  add_gradcheck_command(root, exit_code);
  add_prepare_command(root, exit_code);
  add_plot_command(root, exit_code);
  add_bench_command(root, exit_code);
  add_inspect_command(root, exit_code);
  add_leakcheck_command(root, exit_code);
  add_attention_map_command(root, exit_code);
  add_export_command(root, exit_code);
  add_import_command(root, exit_code);
  add_cost_command(root, exit_code);
  add_heads_command(root, exit_code);
  add_study_command(root, exit_code);
  add_keys_command(root, exit_code);
}

std::optional<std::string> unknown_command(const CLI::App& root, const std::string& word) {
  // An option ("--help", "-h") or an empty word is CLI11's to answer; only a bare word that names
  // no subcommand is a mistyped command.
  if (word.empty() || word.front() == '-') return std::nullopt;
  std::vector<std::string> names;
  for (const CLI::App* sub : root.get_subcommands(std::function<bool(const CLI::App*)>{})) {
    if (sub->get_name() == word) return std::nullopt;
    names.push_back(sub->get_name());
  }
  const std::string near = closest_name(word, names, 2);
  return "unknown command '" + word + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
         "; `qkv --help` lists the commands";
}

namespace {

// "--name" of an option, its first long name, else its first short one.
std::string option_spelling(const CLI::Option& option) {
  if (!option.get_lnames().empty()) return "--" + option.get_lnames().front();
  if (!option.get_snames().empty()) return "-" + option.get_snames().front();
  return "";
}

// Whether `word` reads as a number ("-3", "-1e-4"): a value given to an option, not an option.
bool numeric_word(const std::string& word) {
  if (word.size() < 2 || word.front() != '-') return false;
  const char c = word[1];
  return (c >= '0' && c <= '9') || c == '.';
}

}  // namespace

std::string parse_error_line(const CLI::App& root, const CLI::ParseError& error, int argc, char** argv) {
  const CLI::App* command = nullptr;
  if (argc > 1)
    for (const CLI::App* sub : root.get_subcommands(std::function<bool(const CLI::App*)>{}))
      if (sub->get_name() == argv[1]) command = sub;
  const CLI::App& scope = command ? *command : root;
  const std::string help =
      command ? "; `qkv " + command->get_name() + " --help` lists the options" : "; `qkv --help` lists the commands";
  const std::string where = command ? " for `qkv " + command->get_name() + "`" : "";
  // Without a command first, that is the fault, whatever options came with it (--json belongs to each
  // command); where a later word names a command, the line shows them in the order qkv reads.
  if (!command) {
    for (int i = 2; i < argc; ++i)
      for (const CLI::App* sub : root.get_subcommands(std::function<bool(const CLI::App*)>{}))
        if (sub->get_name() == argv[i]) {
          std::string line = "qkv " + sub->get_name();
          for (int j = 1; j < argc; ++j)
            if (j != i) line += std::string(" ") + argv[j];
          return "the command goes first, its options after it: `" + line + "`" + help;
        }
  }
  if (!command && dynamic_cast<const CLI::RequiredError*>(&error) != nullptr) return "a command is required" + help;
  // Words of argv that look like options of which the command (or qkv itself) has none, in order.
  std::vector<std::string> unknown, names;
  for (const CLI::Option* option : scope.get_options()) names.push_back(option_spelling(*option));
  for (int i = command ? 2 : 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (word.size() < 2 || word.front() != '-' || numeric_word(word)) continue;
    const std::string name = word.substr(0, word.find('='));
    if (scope.get_option_no_throw(name) == nullptr) unknown.push_back(name);
  }
  if (!unknown.empty()) {
    std::string line = unknown.size() == 1 ? "unknown option " : "unknown options ";
    for (size_t i = 0; i < unknown.size(); ++i) line += (i ? ", " : "") + unknown[i];
    line += where;
    if (unknown.size() == 1) {
      const std::string near = closest_name(unknown.front(), names, 3);
      if (!near.empty()) line += " (did you mean " + near + "?)";
    }
    return line + help;
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    // CLI11 lists the extras last to first; the command's own list is in argv's order.
    const std::vector<std::string> extras = scope.remaining();
    std::string line = extras.size() == 1 ? "unexpected argument " : "unexpected arguments ";
    for (size_t i = 0; i < extras.size(); ++i) line += (i ? " " : "") + extras[i];
    return line + where + help;
  }
  return std::string(error.what()) + where + help;
}

}  // namespace qkv::app
