// qkv gradcheck [--only PATTERN] [--json]: every registered differentiable op, float64 central
// differences against the analytic backward.
// qkv gradcheck --config FILE [--set section.key=value]... [--directions K] [--elements E] [--seed S]
//               [--only PATTERN] [--json]: the whole model of a config, in float64, on a seeded batch
//   (analysis/model_gradcheck.h): K random directions over all parameters and E elements of every
//   parameter tensor. Exit 1 when a check fails.
#include <chrono>
#include <cstdio>
#include <regex>

#include "analysis/model_gradcheck.h"
#include "app/commands.h"
#include "app/options.h"
#include "app/registry.h"
#include "autograd/gradcheck.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/session.h"

namespace qkv::app {

namespace {

std::FILE* table_stream(bool json) { return json ? stderr : stdout; }

void print_row(std::FILE* f, const std::string& op, const std::string& name, double abs_err, double rel_err, bool pass,
               const std::string& note = "") {
  std::fprintf(f, "%-22s %-44s %12.3e %12.3e  %s%s\n", op.c_str(), name.c_str(), abs_err, rel_err, pass ? "ok" : "FAIL",
               note.empty() ? "" : ("  " + note).c_str());
}

nlohmann::json unravel(int64_t index, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = index % shape[d];
    index /= shape[d];
  }
  return idx;
}

// --config: the whole model.
int run_model(const std::string& config, const std::vector<std::string>& sets, analysis::ModelGradcheckOptions opt,
              bool json) {
  const auto t0 = std::chrono::steady_clock::now();
  const Config cfg = parse_config(config, sets);
  {
    // One thread unless train.threads says otherwise: the check's forwards are small (at most
    // 2 x 16 tokens), and on a busy machine a thread team's barriers cost more than they save
    // (shakespeare_char_cpu: 31 s with 2 threads, 4.7 s with 1, while another build ran).
    Config threads = cfg;
    if (threads.train.threads == 0) threads.train.threads = 1;
    train::apply_thread_setting(threads);
  }
  if (cfg.train.device != Device::cpu || cfg.train.dtype != DType::f32)
    std::fprintf(
        stderr,
        "gradcheck: train.device = %s and train.dtype = %s do not apply: the check runs on the CPU in float64\n",
        std::string(name_of(cfg.train.device)).c_str(), std::string(name_of(cfg.train.dtype)).c_str());
  const analysis::ConfigGradcheck run = analysis::run_config_gradcheck(cfg, opt);
  const nn::ModelConfig& mc = run.model;
  const analysis::ModelGradcheckReport& rep = run.report;
  const int64_t rows = run.batch.x.size(0), tokens = run.batch.x.size(1);
  std::FILE* table = table_stream(json);
  std::fprintf(table,
               "gradcheck: %s: %s, n_layer %lld, n_embd %lld, vocab %lld%s, %lld parameters in float64; batch %lld x "
               "%lld (%s); attention: %s\n",
               config.c_str(), nn::family_name(mc.family), static_cast<long long>(mc.n_layer),
               static_cast<long long>(mc.n_embd), static_cast<long long>(mc.vocab_size),
               run.vocab_stand_in ? " (model.vocab_size = 0: a stand-in for the tokenizer's)" : "",
               static_cast<long long>(run.parameters), static_cast<long long>(rows), static_cast<long long>(tokens),
               batch_mode_name(cfg.data.batching), run.attention_kernel.c_str());

  nlohmann::json checks = nlohmann::json::array();
  int passed = 0, failed = 0;
  auto count = [&](bool ok) { ok ? ++passed : ++failed; };
  std::fprintf(table, "%-22s %-44s %12s %12s  %s\n", "op", "case", "max_abs_err", "max_rel_err", "pass");
  {
    const double d = std::fabs(rep.loss - rep.loss_again);
    const double rel = rep.loss != 0 ? d / std::fabs(rep.loss) : d;
    print_row(table, "model", "deterministic loss (evaluated twice)", d, rel, rep.deterministic);
    checks.push_back({{"op", "model"},
                      {"case", "deterministic loss"},
                      {"kind", "determinism"},
                      {"max_abs_err", d},
                      {"max_rel_err", rel},
                      {"pass", rep.deterministic},
                      {"loss", rep.loss},
                      {"loss_again", rep.loss_again}});
    count(rep.deterministic);
  }
  for (size_t k = 0; k < rep.directions.size(); ++k) {
    const auto& d = rep.directions[k];
    const std::string name = "direction " + std::to_string(k) + " (all parameters)";
    print_row(table, "model", name, d.abs_err, d.rel_err, d.pass);
    checks.push_back({{"op", "model"},
                      {"case", name},
                      {"kind", "direction"},
                      {"max_abs_err", d.abs_err},
                      {"max_rel_err", d.rel_err},
                      {"pass", d.pass},
                      {"analytic", d.analytic},
                      {"numeric", d.numeric},
                      {"eps", d.step}});
    count(d.pass);
  }
  for (const auto& p : rep.params) {
    nlohmann::json jc = {{"op", "model"},
                         {"case", p.name},
                         {"kind", "parameter"},
                         {"max_abs_err", p.max_abs_err},
                         {"max_rel_err", p.max_rel_err},
                         {"pass", p.pass},
                         {"shape", p.shape},
                         {"elements", p.elements.size()}};
    std::string note;
    if (p.worst >= 0) {
      const auto& w = p.elements[static_cast<size_t>(p.worst)];
      jc["worst"] = {
          {"index", unravel(w.index, p.shape)}, {"analytic", w.analytic}, {"numeric", w.numeric}, {"eps", w.step}};
      if (!p.pass)
        note = cat("worst ", unravel(w.index, p.shape).dump(), ": analytic ", w.analytic, ", numeric ", w.numeric);
    }
    print_row(table, "model", p.name, p.max_abs_err, p.max_rel_err, p.pass, note);
    checks.push_back(jc);
    count(p.pass);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(table,
               "%d passed, %d failed (loss %.6f; %lld loss evaluations; eps %g, %lld comparisons retried at eps/10, "
               "eps/100; pass when |analytic - numeric| <= %g + %g |numeric|; %.1f s)\n",
               passed, failed, rep.loss, static_cast<long long>(rep.evaluations), opt.eps,
               static_cast<long long>(rep.retried), opt.atol, opt.rtol, seconds);
  if (json) {
    print_json({{"checks", checks},
                {"passed", passed},
                {"failed", failed},
                {"config", config},
                {"model",
                 {{"family", nn::family_name(mc.family)},
                  {"n_layer", mc.n_layer},
                  {"n_head", mc.n_head},
                  {"n_kv_head", mc.n_kv_head},
                  {"n_embd", mc.n_embd},
                  {"block_size", mc.block_size},
                  {"vocab_size", mc.vocab_size},
                  {"vocab_stand_in", run.vocab_stand_in},
                  {"parameters", run.parameters},
                  {"parameter_tensors", run.parameter_tensors}}},
                {"dtype", "float64"},
                {"device", "cpu"},
                {"attention_kernel", run.attention_kernel},
                {"attention_nodes", rep.attention_nodes},
                {"batch",
                 {{"rows", rows},
                  {"tokens", tokens},
                  {"batching", batch_mode_name(cfg.data.batching)},
                  {"targets", run.batch.n_targets}}},
                {"loss", rep.loss},
                {"deterministic", rep.deterministic},
                {"directions", opt.directions},
                {"elements", opt.elements},
                {"seed", opt.seed},
                {"eps", opt.eps},
                {"atol", opt.atol},
                {"rtol", opt.rtol},
                {"evaluations", rep.evaluations},
                {"retried", rep.retried},
                {"seconds", seconds}});
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_gradcheck_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("gradcheck",
                                  "check backward against finite differences (float64): every registered "
                                  "differentiable op, or with --config a whole model");
  static std::string only, config;
  static std::vector<std::string> sets;
  static bool json = false;
  static double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  static int directions = analysis::ModelGradcheckOptions{}.directions,
             elements = analysis::ModelGradcheckOptions{}.elements;
  static int64_t seed = static_cast<int64_t>(analysis::ModelGradcheckOptions{}.seed);
  add_text_option(cmd, "--only", only, false,
                  "run only ops whose name (or 'op case') matches this regular expression; with "
                  "--config, only parameter tensors whose name matches");
  cmd->add_flag("--json", json, "print one JSON object as the last stdout line");
  auto* eps_opt =
      add_real_option(cmd, "--eps", eps, {0, 1, true, false}, "finite-difference step (--config: default 1e-5)");
  auto* atol_opt = add_real_option(cmd, "--atol", atol, {0, 1e6}, "absolute tolerance (--config: default 1e-9)");
  auto* rtol_opt = add_real_option(cmd, "--rtol", rtol, {0, 1e6}, "relative tolerance (--config: default 1e-5)");
  add_path_option(cmd, "--config", config, "check the whole model of this config file (float64, seeded batch)");
  add_set_option(cmd, sets, "override a config key (section.key=value), with --config");
  add_int_option(cmd, "--directions", directions, {0, 10000}, "--config: random directions over all parameters");
  add_int_option(cmd, "--elements", elements, {0, 10000}, "--config: elements checked in every parameter tensor");
  add_int_option(cmd, "--seed", seed, {0, kIntMax}, "--config: batch, dropout masks, directions and element sample");
  cmd->callback([&exit_code, cmd, eps_opt, atol_opt, rtol_opt] {
    if (!config.empty()) {
      QKV_CHECK(directions + elements > 0, "[gradcheck] --directions 0 and --elements 0 check nothing");
      analysis::ModelGradcheckOptions opt;
      opt.directions = directions;
      opt.elements = elements;
      opt.seed = static_cast<uint64_t>(seed);
      if (eps_opt->count()) opt.eps = eps;
      if (atol_opt->count()) opt.atol = atol;
      if (rtol_opt->count()) opt.rtol = rtol;
      opt.only = only;
      exit_code = run_model(config, sets, opt, json);
      return;
    }
    refuse_alone(cmd, {"--set", "--directions", "--elements", "--seed"}, false, "--config");
    std::regex pattern;
    try {
      pattern = std::regex(only.empty() ? ".*" : only);
    } catch (const std::regex_error&) {
      throw Error(cat("[gradcheck] --only '", only, "' is not a valid regular expression"));
    }
    autograd::GradcheckOptions opt;
    opt.eps = eps;
    opt.atol = atol;
    opt.rtol = rtol;
    nlohmann::json checks = nlohmann::json::array();
    int passed = 0, failed = 0;
    std::FILE* table = table_stream(json);
    std::fprintf(table, "%-22s %-44s %12s %12s  %s\n", "op", "case", "max_abs_err", "max_rel_err", "pass");
    for (const auto& c : full_gradcheck_registry().cases()) {
      if (!std::regex_search(c.op, pattern) && !std::regex_search(c.op + " " + c.name, pattern)) continue;
      const auto r = autograd::run_gradcheck(c, opt);
      r.pass ? ++passed : ++failed;
      print_row(table, r.op, r.name, r.max_abs_err, r.max_rel_err, r.pass, r.error);
      nlohmann::json jc = {{"op", r.op},
                           {"case", r.name},
                           {"max_abs_err", r.max_abs_err},
                           {"max_rel_err", r.max_rel_err},
                           {"pass", r.pass}};
      if (!r.error.empty()) jc["error"] = r.error;
      checks.push_back(jc);
    }
    QKV_CHECK(passed + failed > 0, "[gradcheck] --only '", only, "' matches no registered op");
    std::fprintf(table, "%d passed, %d failed\n", passed, failed);
    if (json) print_json({{"checks", checks}, {"passed", passed}, {"failed", failed}});
    exit_code = failed ? 1 : 0;
  });
}

}  // namespace qkv::app
