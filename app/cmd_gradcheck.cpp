// qkv gradcheck [--only PATTERN] [--json]: every registered differentiable op, float64 central
// differences against the analytic backward.
#include <cstdio>
#include <regex>

#include "app/commands.h"
#include "app/registry.h"
#include "autograd/gradcheck.h"

namespace qkv::app {

void add_gradcheck_command(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("gradcheck", "check every differentiable op's backward against finite differences (float64)");
  static std::string only;
  static bool json = false;
  static double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  cmd->add_option("--only", only, "run only ops whose name (or 'op case') matches this regular expression");
  cmd->add_flag("--json", json, "print one JSON object as the last stdout line");
  cmd->add_option("--eps", eps, "finite-difference step")->capture_default_str();
  cmd->add_option("--atol", atol, "absolute tolerance")->capture_default_str();
  cmd->add_option("--rtol", rtol, "relative tolerance")->capture_default_str();
  cmd->callback([&exit_code] {
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
    std::FILE* table = json ? stderr : stdout;
    std::fprintf(table, "%-22s %-44s %12s %12s  %s\n", "op", "case", "max_abs_err", "max_rel_err", "pass");
    for (const auto& c : full_gradcheck_registry().cases()) {
      if (!std::regex_search(c.op, pattern) && !std::regex_search(c.op + " " + c.name, pattern)) continue;
      const auto r = autograd::run_gradcheck(c, opt);
      r.pass ? ++passed : ++failed;
      std::fprintf(table, "%-22s %-44s %12.3e %12.3e  %s%s\n", r.op.c_str(), r.name.c_str(), r.max_abs_err,
                   r.max_rel_err, r.pass ? "ok" : "FAIL", r.error.empty() ? "" : ("  " + r.error).c_str());
      nlohmann::json jc = {{"op", r.op}, {"case", r.name}, {"max_abs_err", r.max_abs_err},
                           {"max_rel_err", r.max_rel_err}, {"pass", r.pass}};
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
