// qkv heads --checkpoint CKPT --data TEXT [--windows N] [--length T] [--separators CHARS]
//           [--local-span K] [--report DIR] [--json]
//   What each layer's heads attend to over a sample of real text: scores (diagonal, previous
//   token, first token, separators, local, distance, entropy) and a label per head
//   (analysis/heads.h states the rules and thresholds).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "analysis/heads.h"
#include "app/commands.h"
#include "app/options.h"
#include "tensor/numerics.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "train/output_paths.h"
#include "train/session.h"

namespace qkv::app {

void add_heads_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("heads", "score and label every attention head's pattern over real text");
  static std::string ckpt, data, separators, report;
  static int64_t windows = 16, local_span = 4;
  static std::optional<int64_t> length;
  static double peak = 0.5, local = 0.7, broad = 0.8;
  static bool json = false, force = false;
  constexpr RealRange kThreshold{0, 1, true, false};
  add_path_option(cmd, "--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  add_path_option(cmd, "--data", data, "a text file to sample windows from")->required();
  add_int_option(cmd, "--windows", windows, {1, 100000}, "windows of text to average over");
  add_int_option(cmd, "--length", length, {2, 1 << 20}, "tokens per window (default and most: the model's block_size)");
  add_text_option(cmd, "--separators", separators, false,
                  "characters whose tokens count as separators (default: newline, space, tab, ASCII punctuation)");
  add_int_option(cmd, "--local-span", local_span, {1, 1 << 20}, "keys within this distance count as local");
  add_real_option(cmd, "--peak-threshold", peak, kThreshold, "score a single kind of key needs for its label");
  add_real_option(cmd, "--local-threshold", local, kThreshold, "local mass for the label 'local'");
  add_real_option(cmd, "--broad-threshold", broad, kThreshold, "entropy / max entropy for the label 'broad'");
  add_path_option(cmd, "--report", report, "directory for index.html and heads.png");
  cmd->add_flag("--force", force, "--report: write into a directory that holds other files than heads'");
  cmd->add_flag("--json", json, "print {heads: [...]} as one JSON line");
  static std::optional<Numerics> numerics;
  add_numerics_option(cmd, numerics);
  cmd->callback([&exit_code, cmd] {
    refuse_alone(cmd, {"--force"}, !report.empty(), "--report");
    train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
    if (!report.empty()) {
      train::OutputGuard guard;
      guard.add_input("--checkpoint", ckpt);
      guard.add_input("--data", data);
      guard.add_input("data.path", meta.config.data.path);  // the checkpoint's corpus
      guard.check_dir("--report", report, {.replace = force, .make_parents = true, .owner = "heads"});
    }
    auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
    train::load_model_weights(ckpt, *model);
    model->eval();
    train::apply_thread_setting(meta.config);
    set_numerics(numerics.value_or(meta.config.train.resolved_numerics()));
    const std::vector<int32_t> ids = meta.tokenizer->encode(read_text_file(data));
    QKV_CHECK(ids.size() >= 2, "[heads] --data ", data, " encodes to ", ids.size(), " tokens; need at least 2");
    const int64_t block = model->config().block_size;
    QKV_CHECK(length.value_or(block) <= block, "[heads] --length ", *length, " exceeds the model's block_size ", block);
    const int64_t len = length.value_or(block);
    QKV_CHECK(len >= 2, "[heads] windows of ", len, " tokens (the model's block_size) are too short; need at least 2");
    // Without --length a text shorter than the block is analysed whole; a length asked for is kept.
    QKV_CHECK(!length || int64_t(ids.size()) >= len, "[heads] --data ", data, " encodes to ", ids.size(),
              " tokens; --length ", len, " needs at least ", len);
    analysis::HeadsOptions o;
    o.local_span = local_span;
    o.peak_threshold = peak;
    o.local_threshold = local;
    o.broad_threshold = broad;
    const std::string seps = separators.empty() ? analysis::default_separators() : separators;
    const std::vector<bool> is_sep = analysis::separator_ids(*meta.tokenizer, seps);
    QKV_CHECK(separators.empty() || std::count(is_sep.begin(), is_sep.end(), true) > 0, "[heads] --separators \"",
              separators, "\": no token of the checkpoint's tokenizer is made of these characters");
    analysis::HeadsReport r =
        analysis::analyze_heads(*model, analysis::sample_windows(ids, len, windows), is_sep, o, meta.tokenizer.get());
    r.separators = seps;
    std::fputs(analysis::heads_table(r).c_str(), json ? stderr : stdout);
    if (!report.empty()) {
      train::mark_output_dir(report, "heads");
      analysis::write_heads_report(report, r, ckpt);
      std::fprintf(json ? stderr : stdout, "heads: report -> %s/index.html\n", report.c_str());
    }
    if (json) {
      nlohmann::json j = analysis::heads_json(r);
      j["checkpoint"] = ckpt;
      if (!report.empty()) j["report"] = report + "/index.html";
      print_json(j);
    }
    exit_code = 0;
  });
}

}  // namespace qkv::app
