// qkv train --config FILE [--set key=value]... [--resume CKPT | --init-from CKPT] [--plot] [--json]
#include <cmath>
#include <cstdio>

#include "app/commands.h"
#include "train/config.h"
#include "train/trainer.h"

namespace qkv::app {

static nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

void add_train_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("train", "train a model from a TOML config");
  static std::string config, resume, init_from;
  static std::vector<std::string> sets;
  static bool json = false, plot = false, quiet = false;
  cmd->add_option("--config", config, "config file (TOML)")->required();
  cmd->add_option("--set", sets, "override a config key, e.g. --set train.max_steps=50 (repeatable)");
  cmd->add_option("--resume", resume, "continue a run from its checkpoint, bitwise as if it never stopped");
  cmd->add_option("--init-from", init_from, "start a new run from a checkpoint's weights");
  cmd->add_flag("--plot", plot, "write OUT_DIR/loss.svg at the end");
  cmd->add_flag("--quiet", quiet, "no progress lines on stderr");
  cmd->add_flag("--json", json, "print the final metrics as one JSON line");
  cmd->callback([&exit_code] {
    const Config cfg = parse_config(config, sets);
    train::TrainOptions o;
    o.resume = resume;
    o.init_from = init_from;
    o.plot = plot;
    o.progress = !quiet;
    const train::TrainSummary s = train::run_training(cfg, o);
    std::fprintf(json ? stderr : stdout, "step %lld  loss %.4f  val_loss %.4f  best_val_loss %.4f  %.1f s  %.0f tok/s  checkpoint %s\n",
                 static_cast<long long>(s.step), s.loss, s.val_loss, s.best_val_loss, s.seconds, s.tokens_per_s,
                 s.checkpoint.c_str());
    if (json)
      print_json({{"step", s.step},
                  {"loss", number_or_null(s.loss)},
                  {"val_loss", number_or_null(s.val_loss)},
                  {"best_val_loss", number_or_null(s.best_val_loss)},
                  {"checkpoint", s.checkpoint},
                  {"seconds", s.seconds},
                  {"tokens_per_s", s.tokens_per_s},
                  {"skipped_steps", s.skipped_steps}});
    exit_code = 0;
  });
}

}  // namespace qkv::app
