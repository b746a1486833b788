// qkv cost --config FILE [--set k=v]... [--context N] [--vocab V] [--json]
//   What the config's model costs, from the config alone: parameters, FLOPs per token (training,
//   prefill, decode) by part, activation / attention-weight / KV-cache bytes, the attention
//   pattern's kept pairs and the peak tensor bytes of a training step (analysis/cost.h). It builds
//   nothing, so it states the figures of a config too big for this machine (and says so); a figure
//   past int64 is refused naming it and the keys it grows with.
#include <cstdio>

#include "analysis/cost.h"
#include "app/commands.h"
#include "app/options.h"
#include "tensor/error.h"
#include "train/memory_budget.h"

namespace qkv::app {

void add_cost_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("cost", "count a config's parameters, FLOPs and memory (no training)");
  static std::string config;
  static std::vector<std::string> sets;
  static std::optional<int64_t> context, vocab;
  static bool json = false;
  add_path_option(cmd, "--config", config, "config file (.toml)")->required();
  add_set_option(cmd, sets, "override a config key (repeatable)");
  add_int_option(cmd, "--context", context, {1, 1 << 20},
                 "inference context N for prefill, decode and the KV cache (default: model.block_size)");
  add_int_option(cmd, "--vocab", vocab, {1, 1 << 24},
                 "vocabulary when model.vocab_size is 0 (default: the tokenizer's, from data.path)");
  cmd->add_flag("--json", json, "print the figures as one JSON line");
  cmd->callback([&exit_code, cmd] {
    const Config cfg = parse_config(config, sets);
    // The config's own vocabulary wins: a --vocab beside it would be silently ignored.
    refuse_alone(cmd, {"--vocab"}, cfg.model.vocab_size == 0, "model.vocab_size = 0 (the tokenizer's)",
                 cat("model.vocab_size = ", cfg.model.vocab_size));
    analysis::CostOptions o;
    o.context = context.value_or(0);
    o.vocab = vocab.value_or(0);
    const analysis::CostReport r = analysis::estimate_cost(cfg, o);
    std::FILE* table = json ? stderr : stdout;
    std::fputs(analysis::cost_table(r).c_str(), table);
    // cost states the figures of any config in range, however big; this says whether `qkv train`
    // would run it here (its budget check, train/memory_budget.h, refuses what does not fit).
    const train::MachineMemory mem = train::machine_memory();
    const bool fits = r.peak_step_bytes <= mem.bytes;
    if (!fits)
      std::fprintf(table, "\ndoes not fit: a training step needs ~%s, %s %s (qkv train refuses it)\n",
                   train::gib_text(static_cast<double>(r.peak_step_bytes)).c_str(), mem.what.c_str(),
                   train::gib_text(static_cast<double>(mem.bytes)).c_str());
    if (json) {
      nlohmann::json j = analysis::cost_json(r);
      j["config"] = config;
      j["machine_memory_bytes"] = mem.bytes;
      j["training_step_fits"] = fits;
      print_json(j);
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
