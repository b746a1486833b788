// Each `qkv` subcommand lives in its own app/cmd_<name>.cpp and registers itself on the root
// parser here. A command's callback sets `exit_code` (0 ok, 1 a check failed); bad input throws
// qkv::Error, which main() prints as one line and turns into exit status 2 (with --json, also
// the error JSON line on stdout).
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tensor/dtype.h"

namespace qkv::app {

void add_gradcheck_command(CLI::App& root, int& exit_code);
void add_train_command(CLI::App& root, int& exit_code);
void add_sample_command(CLI::App& root, int& exit_code);
void add_eval_command(CLI::App& root, int& exit_code);
void add_prepare_command(CLI::App& root, int& exit_code);
void add_plot_command(CLI::App& root, int& exit_code);
void add_bench_command(CLI::App& root, int& exit_code);
void add_inspect_command(CLI::App& root, int& exit_code);
void add_leakcheck_command(CLI::App& root, int& exit_code);
void add_attention_map_command(CLI::App& root, int& exit_code);
void add_export_command(CLI::App& root, int& exit_code);
void add_import_command(CLI::App& root, int& exit_code);
void add_cost_command(CLI::App& root, int& exit_code);
void add_heads_command(CLI::App& root, int& exit_code);
void add_study_command(CLI::App& root, int& exit_code);
void add_keys_command(CLI::App& root, int& exit_code);
// Every command above, in the order `qkv --help` lists them: main() and the tests build the same
// parser from this one list.
void add_all_commands(CLI::App& root, int& exit_code);

// "unknown command 'trian' (did you mean 'train'?); ..." when `word`, the first argument, is a bare
// word that names no subcommand of `root`; nullopt otherwise.
std::optional<std::string> unknown_command(const CLI::App& root, const std::string& word);

// The one line that answers a command line CLI11 refused (argv as main() got it): an option the
// command does not have is named first, in argv's order, with the nearest option's name ("unknown
// option --confg for `qkv train` (did you mean --config?)"), even where CLI11 stopped earlier at a
// required option; arguments nothing consumed are listed in argv's order; any other refusal is
// CLI11's text. Each ends pointing at the command's --help.
std::string parse_error_line(const CLI::App& root, const CLI::ParseError& error, int argc, char** argv);

// Prints `j` as the single JSON line that ends stdout (the `--json` contract). Strings that are
// not valid UTF-8 are written with each invalid sequence replaced by U+FFFD (never an exception).
void print_json(const nlohmann::json& j);
// The JSON line of a failed command: {"error": message, "exit": exit_status}. main() prints it
// for every command run with --json that ends in an error; a data-parallel train rank 0 prints it
// itself before it ends the job.
void print_error_json(const std::string& message, int exit_status);

// The value of `--device cpu|cuda` (sample, eval, leakcheck), checked before any work: an unknown
// name, or cuda when no device is visible, is refused with one line.
Device device_option(const std::string& name);

}  // namespace qkv::app
