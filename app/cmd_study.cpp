// qkv study --config BASE [--set k=v]... --variants full,window:64,... [--lengths 256,1024,4096]
//           [--budget-tokens T] [--decode-tokens N] [--no-checks] [--report DIR] [--json]
//   Trains BASE once per attention variant (same data, seed, budget, schedule) and compares them:
//   val loss and its gap to full, tokens/s, wall time, peak RSS, inference latency and memory per
//   length, loss at longer lengths, leakcheck's consistency checks, edge inputs (analysis/study.h).
//   Progress on stderr; DIR/index.html is the report; a second run skips finished variants.
#include <cstdio>
#include <sstream>

#include "analysis/study.h"
#include "app/commands.h"
#include "app/options.h"
#include "train/config.h"
#include "train/output_paths.h"

namespace qkv::app {

namespace {

// Every comma-separated item is a length: an empty list or item ("", "256,,1024") is refused.
std::vector<int64_t> parse_lengths(const std::string& text) {
  std::vector<int64_t> out;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    out.push_back(parse_int("--lengths", std::string_view(text).substr(start, comma - start), {1, 1 << 20}));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

void add_study_command(CLI::App& root, int& exit_code) {
  auto* cmd =
      root.add_subcommand("study", "train one config per attention variant and compare quality, speed and memory");
  static std::string config, variants, lengths = "256,1024,4096", report = "runs/study";
  static std::vector<std::string> sets;
  static std::optional<int64_t> budget;
  static int64_t decode_tokens = 16, eval_tokens = 8192;
  static bool json = false, no_checks = false, force = false;
  add_path_option(cmd, "--config", config, "base config file (.toml)")->required();
  add_set_option(cmd, sets, "override a base config key (repeatable)");
  add_list_option(
      cmd, "--variants", variants, [](const std::string& s) { (void)analysis::parse_variants(s); },
      "comma-separated variants: full, window:W, strided[:S], global[:G], bigbird[:B], block_sparse[:B], "
      "linear (a parameter in brackets is optional)")
      ->required();
  add_list_option(
      cmd, "--lengths", lengths, [](const std::string& s) { (void)parse_lengths(s); },
      "comma-separated inference lengths, each in [1, 1048576]")
      ->capture_default_str();
  add_int_option(cmd, "--budget-tokens", budget, {1, int64_t{1} << 40},
                 "training tokens per variant (default: the config's max_steps)");
  add_int_option(cmd, "--decode-tokens", decode_tokens, {1, 1 << 20}, "decoded tokens timed per length");
  add_int_option(cmd, "--eval-tokens", eval_tokens, {1, int64_t{1} << 30}, "validation tokens scored per length");
  cmd->add_flag("--no-checks", no_checks, "skip leakcheck's model checks");
  add_path_option(cmd, "--report", report, "work and report directory (index.html, variants/<name>/)")
      ->capture_default_str();
  cmd->add_flag("--force", force, "--report: write into a directory that holds other files than study's");
  cmd->add_flag("--json", json, "print {variants: [...]} as one JSON line");
  cmd->callback([&exit_code] {
    analysis::StudyOptions o;
    o.dir = report;
    o.lengths = parse_lengths(lengths);
    o.budget_tokens = budget.value_or(0);
    o.decode_tokens = decode_tokens;
    o.eval_tokens = eval_tokens;
    o.run_checks = !no_checks;
    o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    const auto specs = analysis::parse_variants(variants);
    train::OutputGuard guard;
    guard.add_input("--config", config);
    guard.add_input("data.path", parse_config(config, sets).data.path);
    guard.check_dir("--report", report, {.replace = force, .make_parents = true, .owner = "study"});
    train::mark_output_dir(report, "study");
    const analysis::StudyResult r = analysis::run_study(config, sets, specs, o);
    analysis::write_study_report(r);
    std::fputs(analysis::study_table(r).c_str(), json ? stderr : stdout);
    std::fprintf(json ? stderr : stdout, "study: report -> %s/index.html\n", report.c_str());
    if (json) print_json(analysis::study_json(r));
    exit_code = 0;
  });
}

}  // namespace qkv::app
