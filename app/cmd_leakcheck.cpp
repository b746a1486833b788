// qkv leakcheck (--checkpoint CKPT | --config FILE [--set k=v]...) [--device cpu|cuda] [--json] [--report DIR]
//               [--self-test]
//   Runs the leakage and consistency checks (analysis/leakcheck.h) on a trained checkpoint or a
//   freshly initialised model, plus the data-leakage checks when the dataset can be loaded, in the
//   numerics mode of train.numerics / --numerics (invariant: the consistency checks must measure
//   exactly 0). With --report or --json the consistency checks also run under both modes side by
//   side ("Training vs inference consistency").
//   Exit 1 when a check fails, or with --self-test when a planted fault is missed or a clean
//   model false-alarms.
#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "app/options.h"
#include "train/config_schema.h"
#include "train/checkpoint.h"
#include "analysis/leakcheck.h"
#include "train/model_factory.h"
#include "train/output_paths.h"
#include "train/session.h"

namespace qkv::app {

namespace {

std::vector<int32_t> report_probe(const nn::DecoderModel& model, const train::RunData* data, const Tokenizer* tok,
                                  uint64_t seed) {
  const int64_t L = std::min<int64_t>(model.config().block_size, 48);
  // Only when the dataset speaks the model's tokenizer (labels are drawn with `tok`).
  if (data && data->val && data->val->size() >= L && tok && data->tokenizer &&
      data->tokenizer->serialize() == tok->serialize()) {
    // Real text reads better in a heatmap: the start of the validation split.
    std::vector<int32_t> ids(data->val->tokens.begin(), data->val->tokens.begin() + L);
    bool ok = true;
    for (int32_t id : ids) ok = ok && id >= 0 && id < model.config().vocab_size;
    if (ok) return ids;
  }
  std::vector<int32_t> ids;
  uint64_t s = seed | 1;
  for (int64_t i = 0; i < L; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids.push_back(static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(model.config().vocab_size)));
  }
  return ids;
}

// Refuses a --report directory that is or contains an input, before the model is built.
void check_report_dir(const std::string& report_dir, const std::string& ckpt, const std::string& config,
                      const Config& cfg, bool force) {
  if (report_dir.empty()) return;
  train::OutputGuard guard;
  guard.add_input("--checkpoint", ckpt);
  guard.add_input("--config", config);
  guard.add_input("data.path", cfg.data.path);
  guard.check_dir("--report", report_dir, {.replace = force, .make_parents = true, .owner = "leakcheck"});
}

}  // namespace

void add_leakcheck_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("leakcheck",
                                  "check a model for future-token leaks, train/inference mismatches, "
                                  "mask and attention errors, dropout in eval, and train/val overlap");
  static std::string ckpt, config, report_dir, device = "cpu";
  static std::vector<std::string> sets;
  static bool json = false, self_test = false, force = false;
  static int ngram = 32;
  static double max_share = 0.05;
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5) to check");
  add_path_option(cmd, "--config", config, "config file: check a freshly initialised model of it");
  add_set_option(cmd, sets, "override a config key (section.key=value), with --config");
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  add_choice_option(cmd, "--device", device, choice_names(kDevices), "where the model and the checks run");
  cmd->add_flag("--json", json, "print one JSON object as the last stdout line");
  add_path_option(cmd, "--report", report_dir, "write DIR/index.html with the tables and attention heatmaps");
  cmd->add_flag("--force", force, "--report: write into a directory that holds other files than leakcheck's");
  cmd->add_flag("--self-test", self_test, "plant each known attention bug and verify a check catches it");
  add_int_option(cmd, "--ngram", ngram, {1, 1 << 20}, "n of the val/train n-gram overlap");
  add_real_option(cmd, "--max-ngram-share", max_share, {0, 1},
                  "largest acceptable share of val n-grams found in train");
  cmd->callback([&exit_code, cmd] {
    QKV_CHECK(ckpt.empty() != config.empty(), "[leakcheck] give exactly one of --checkpoint CKPT or --config FILE",
              ckpt.empty() ? "" : " (both were given)");
    refuse_alone(cmd, {"--set"}, !config.empty(), "--config");
    refuse_alone(cmd, {"--force"}, !report_dir.empty(), "--report");
    const Device dev = device_option(device);
    std::FILE* out = json ? stderr : stdout;

    Config cfg;
    std::unique_ptr<nn::DecoderModel> model;
    std::shared_ptr<const Tokenizer> tok;
    std::optional<train::RunData> data;
    std::string data_error;
    analysis::LeakCheckReport report;
    if (!ckpt.empty()) {
      train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
      cfg = meta.config;
      check_report_dir(report_dir, ckpt, config, cfg, force);
      tok = std::shared_ptr<const Tokenizer>(std::move(meta.tokenizer));
      model = train::build_model(cfg.resolved(), tok->vocab_size());
      train::load_model_weights(ckpt, *model);
      report.subject = "checkpoint " + ckpt + " (step " + std::to_string(meta.state.step) + ")";
      try {
        data = train::load_run_data(cfg);
      } catch (const std::exception& e) {
        data_error = e.what();  // the checkpoint alone still gets every model check
      }
    } else {
      cfg = parse_config(config, sets);
      check_report_dir(report_dir, ckpt, config, cfg, force);
      data = train::load_run_data(cfg);
      tok = data->tokenizer;
      model = train::build_model(cfg, data->vocab_size);
      model->init_weights(static_cast<uint64_t>(cfg.train.seed));
      report.subject = "config " + config + " (freshly initialised, seed " + std::to_string(cfg.train.seed) + ")";
    }
    train::apply_thread_setting(cfg);
    if (numerics) cfg.train.numerics = *numerics;
    set_numerics(cfg.train.resolved_numerics());
    model->eval();
    model->to(dev);
    if (dev != Device::cpu) report.subject += ", on " + device;

    analysis::LeakCheckOptions opts;
    opts.ngram_n = ngram;
    opts.max_ngram_share = max_share;
    std::fprintf(stderr, "leakcheck: %s\n", report.subject.c_str());
    report.checks = analysis::run_model_checks(*model, opts);
    for (auto& na : analysis::not_applicable_checks(*model)) report.skipped.push_back(std::move(na));
    if (data && !cfg.data.random_tokens) {
      auto d = analysis::check_data_leakage(*data->train, *data->val, opts);
      for (auto& c : d.checks) report.checks.push_back(std::move(c));
      for (auto& na : d.skipped) report.skipped.push_back(std::move(na));
    } else {
      const std::string why = data ? "data.random_tokens: no corpus" : "dataset not loadable: " + data_error;
      report.skipped.emplace_back("data.val_ngram_share", why);
      report.skipped.emplace_back("data.duplicated_docs", why);
    }
    std::fputs(analysis::leakcheck_table(report).c_str(), out);

    // The consistency checks side by side in both numerics modes, for the report and --json.
    std::optional<analysis::NumericsComparison> cmp;
    if (json || !report_dir.empty()) {
      cmp = analysis::compare_numerics_modes(*model, opts);
      std::fputs(analysis::numerics_comparison_table(*cmp).c_str(), out);
    }

    std::optional<analysis::SelfTestResult> st;
    if (self_test) {
      st = analysis::run_self_test(*model, opts,
                                   [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
      std::fputs(analysis::self_test_table(*st).c_str(), out);
    }
    if (!report_dir.empty()) {
      const auto probe = report_probe(*model, data ? &*data : nullptr, tok.get(), opts.seed);
      train::mark_output_dir(report_dir, "leakcheck");
      analysis::write_leakcheck_report(report_dir, report, st ? &*st : nullptr, *model, probe, tok.get(),
                                       cmp ? &*cmp : nullptr);
      std::fprintf(stderr, "leakcheck: report written to %s/index.html\n", report_dir.c_str());
    }
    if (json) print_json(analysis::leakcheck_json(report, st ? &*st : nullptr, cmp ? &*cmp : nullptr));
    exit_code = report.failed() > 0 || (st && !st->pass()) ? 1 : 0;
  });
}

}  // namespace qkv::app
