// qkv train --config FILE [--set key=value]... [--resume CKPT | --init-from CKPT|HF_DIR] [--plot] [--json]
// Under `mpirun -np N` every process runs this command as one rank of a data-parallel job
// (distributed/distributed.h): only rank 0 prints; an error on any rank prints one line naming the
// rank and ends the whole job (MPI_Abort), so no rank waits forever in a collective.
#include <cmath>
#include <cstdio>
#include <exception>

#include "analysis/plot.h"
#include "app/commands.h"
#include "app/options.h"
#include "train/config.h"
#include "distributed/distributed.h"
#include "train/output_paths.h"
#include "train/trainer.h"

namespace qkv::app {

namespace {

nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

struct TrainArgs {
  std::string config, resume, init_from;
  std::vector<std::string> sets;
  bool json = false, plot = false, quiet = false, overwrite = false, change_global_batch = false;
};

void train_once(const TrainArgs& a, bool root) {
  QKV_CHECK(!a.change_global_batch || !a.resume.empty(), "[train] --change-global-batch needs --resume");
  const Config cfg = parse_config(a.config, a.sets);
  const std::string plot_path = cfg.train.out_dir + "/loss.svg";
  if (a.plot) {
    // Checked before the run, so a bad path costs no training. The file belongs to the run in
    // out_dir (whose ownership run_training settles), so an existing one is replaced.
    train::OutputGuard guard;
    guard.add_input("--config", a.config);
    guard.add_input("--resume", a.resume);
    guard.add_input("--init-from", a.init_from);
    guard.add_input("data.path", cfg.data.path);
    guard.check_file("--plot", plot_path, {.replace = true, .make_parents = true});
  }
  train::TrainOptions o;
  o.resume = a.resume;
  o.init_from = a.init_from;
  o.overwrite = a.overwrite;
  o.change_global_batch = a.change_global_batch;
  o.progress = !a.quiet;
  const train::TrainSummary s = train::run_training(cfg, o);
  if (!root) return;
  // The loss curve is drawn here, after the run, so training never depends on the analysis tools.
  if (a.plot) analysis::plot_metrics(cfg.train.out_dir + "/metrics.jsonl", plot_path);
  if (s.nothing_to_do)
    std::fprintf(a.json ? stderr : stdout, "nothing to do: checkpoint is at step %lld >= train.max_steps %lld\n",
                 static_cast<long long>(s.step), static_cast<long long>(cfg.train.max_steps));
  else
    std::fprintf(a.json ? stderr : stdout,
                 "step %lld  loss %.4f  val_loss %.4f  best_val_loss %.4f  %.1f s  %.0f tok/s  checkpoint %s\n",
                 static_cast<long long>(s.step), s.loss, s.val_loss, s.best_val_loss, s.seconds, s.tokens_per_s,
                 s.checkpoint.c_str());
  if (a.json)
    print_json({{"step", s.step},
                {"loss", number_or_null(s.loss)},
                {"val_loss", number_or_null(s.val_loss)},
                {"best_val_loss", number_or_null(s.best_val_loss)},
                {"checkpoint", s.checkpoint},
                {"seconds", s.seconds},
                {"tokens_per_s", s.tokens_per_s},
                {"skipped_steps", s.skipped_steps}});
}

}  // namespace

void add_train_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("train", "train a model from a TOML config (data-parallel under mpirun -np N)");
  static TrainArgs args;
  add_path_option(cmd, "--config", args.config, "config file (TOML)")->required();
  add_set_option(cmd, args.sets, "override a config key, e.g. --set train.max_steps=50 (repeatable)");
  add_numerics_option(cmd, args.sets);
  add_path_option(cmd, "--resume", args.resume, "continue a run from its checkpoint, bitwise as if it never stopped");
  add_path_option(cmd, "--init-from", args.init_from,
                  "start a new run from a checkpoint's weights (or a Hugging Face model directory's)");
  cmd->add_flag("--overwrite", args.overwrite,
                "replace the run files (metrics.jsonl, checkpoints, best.h5) already in train.out_dir");
  cmd->add_flag("--change-global-batch", args.change_global_batch,
                "let --resume continue with another global batch (world x batch_size x grad_accum rows) than "
                "the checkpoint's");
  cmd->add_flag("--plot", args.plot, "write OUT_DIR/loss.svg at the end");
  cmd->add_flag("--quiet", args.quiet, "no progress lines on stderr");
  cmd->add_flag("--json", args.json, "print the final metrics as one JSON line");
  cmd->callback([&exit_code] {
    dist::init(nullptr, nullptr);  // MPI only when an MPI launcher started this process
    dist::Communicator& comm = dist::world();
    try {
      train_once(args, comm.is_root());
    } catch (const std::exception& e) {
      if (comm.world() > 1) {
        // MPI_Abort ends every process here, so main() never sees this error: rank 0 prints the
        // error JSON itself (an error on another rank ends the job with its stderr line only).
        if (args.json && comm.is_root()) print_error_json(e.what(), 2);
        comm.abort(e.what(), 2);
      }
      dist::finalize();
      throw;  // one process: main() prints it and exits 2
    }
    dist::finalize();
    exit_code = 0;
  });
}

}  // namespace qkv::app
