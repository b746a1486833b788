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

}  // namespace qkv::app
