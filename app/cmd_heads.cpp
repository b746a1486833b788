// qkv heads --checkpoint CKPT --data TEXT [--windows N] [--length T] [--separators CHARS]
//           [--local-span K] [--report DIR] [--json]
//   What each layer's heads attend to over a sample of real text: scores (diagonal, previous
//   token, first token, separators, local, distance, entropy) and a label per head
//   (analysis/heads.h states the rules and thresholds).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "analysis/heads.h"
#include "app/commands.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "train/session.h"

namespace qkv::app {

void add_heads_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("heads", "score and label every attention head's pattern over real text");
  static std::string ckpt, data, separators, report;
  static int64_t windows = 16, length = 0, local_span = 4;
  static double peak = 0.5, local = 0.7, broad = 0.8;
  static bool json = false, no_sep = false;
  cmd->add_option("--checkpoint", ckpt, "checkpoint file (.h5)")->required();
  cmd->add_option("--data", data, "a text file to sample windows from")->required();
  cmd->add_option("--windows", windows, "windows of text to average over")->capture_default_str();
  cmd->add_option("--length", length, "tokens per window (default block_size)");
  cmd->add_option("--separators", separators,
                  "characters whose tokens count as separators (default: newline, space, tab, ASCII punctuation)");
  cmd->add_option("--local-span", local_span, "keys within this distance count as local")->capture_default_str();
  cmd->add_option("--peak-threshold", peak, "score a single kind of key needs for its label")->capture_default_str();
  cmd->add_option("--local-threshold", local, "local mass for the label 'local'")->capture_default_str();
  cmd->add_option("--broad-threshold", broad, "entropy / max entropy for the label 'broad'")->capture_default_str();
  cmd->add_option("--report", report, "directory for index.html and heads.png");
  cmd->add_flag("--json", json, "print {heads: [...]} as one JSON line");
  cmd->callback([&exit_code] {
    QKV_CHECK(windows >= 1, "[heads] --windows must be >= 1, got ", windows);
    QKV_CHECK(length >= 0, "[heads] --length must be >= 2, got ", length);
    QKV_CHECK(local_span >= 1, "[heads] --local-span must be >= 1, got ", local_span);
    for (double t : {peak, local, broad}) QKV_CHECK(t > 0 && t <= 1, "[heads] thresholds must be in (0, 1], got ", t);
    train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
    auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
    train::load_model_weights(ckpt, *model);
    model->eval();
    train::apply_thread_setting(meta.config);
    std::ifstream in(data, std::ios::binary);
    QKV_CHECK(in.good(), "[heads] cannot read --data ", data);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::vector<int32_t> ids = meta.tokenizer->encode(ss.str());
    QKV_CHECK(ids.size() >= 2, "[heads] --data ", data, " encodes to ", ids.size(), " tokens; need at least 2");
    const int64_t len = length > 0 ? std::min(length, model->config().block_size) : model->config().block_size;
    QKV_CHECK(len >= 2, "[heads] --length must be >= 2, got ", length);
    analysis::HeadsOptions o;
    o.local_span = local_span;
    o.peak_threshold = peak;
    o.local_threshold = local;
    o.broad_threshold = broad;
    const std::string seps = separators.empty() ? analysis::default_separators() : separators;
    analysis::HeadsReport r =
        analysis::analyze_heads(*model, analysis::sample_windows(ids, len, windows),
                                analysis::separator_ids(*meta.tokenizer, seps), o, meta.tokenizer.get());
    r.separators = seps;
    std::fputs(analysis::heads_table(r).c_str(), json ? stderr : stdout);
    if (!report.empty()) {
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
