// qkv cost --config FILE [--set k=v]... [--context N] [--vocab V] [--json]
//   What the config's model costs, from the config alone: parameters, FLOPs per token (training,
//   prefill, decode) by part, activation / attention-weight / KV-cache bytes, the attention
//   pattern's kept pairs and the peak tensor bytes of a training step (analysis/cost.h).
#include <cstdio>

#include "analysis/cost.h"
#include "app/commands.h"
#include "app/options.h"

namespace qkv::app {

void add_cost_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("cost", "count a config's parameters, FLOPs and memory (no training)");
  static std::string config;
  static std::vector<std::string> sets;
  static int64_t context = 0, vocab = 0;
  static bool json = false;
  add_path_option(cmd, "--config", config, "config file (.toml)")->required();
  cmd->add_option("--set", sets, "override a config key (repeatable)");
  add_int_option(cmd, "--context", context, {0, 1 << 20},
                 "inference context N for prefill, decode and the KV cache; 0 = block_size");
  add_int_option(cmd, "--vocab", vocab, {0, 1 << 24},
                 "vocabulary when model.vocab_size is 0; 0 = the tokenizer's, from data.path");
  cmd->add_flag("--json", json, "print the figures as one JSON line");
  cmd->callback([&exit_code] {
    const Config cfg = parse_config(config, sets);
    analysis::CostOptions o;
    o.context = context;
    o.vocab = vocab;
    const analysis::CostReport r = analysis::estimate_cost(cfg, o);
    std::fputs(analysis::cost_table(r).c_str(), json ? stderr : stdout);
    if (json) {
      nlohmann::json j = analysis::cost_json(r);
      j["config"] = config;
      print_json(j);
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
