// The whole gradcheck registry — the one `qkv gradcheck` runs: every backward rule (views,
// elementwise, reductions, shapes, matmul/linear, nn ops) and the attention grid (fused kernel:
// mask kind x heads x lengths x dropout, ALiBi, the reference path with a learned bias, RoPE),
// each against central differences in float64.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <string>

#include "app/registry.h"
#include "autograd/gradcheck.h"

using namespace qkv;

TEST_CASE("every registered gradcheck case passes", "[autograd][attention][gradcheck][long]") {
  const autograd::GradcheckRegistry& reg = app::full_gradcheck_registry();
  std::map<std::string, int> per_op;
  int passed = 0, fused_grid = 0;
  double worst = 0;
  for (const auto& c : reg.cases()) {
    const autograd::GradcheckResult r = autograd::run_gradcheck(c);
    INFO(c.op << " / " << c.name << ": max_abs_err " << r.max_abs_err << " max_rel_err " << r.max_rel_err << " "
              << r.error);
    CHECK(r.error.empty());
    CHECK(r.pass);
    passed += r.pass;
    ++per_op[c.op];
    fused_grid += c.op == "attention" && c.name.rfind("fused ", 0) == 0;
    worst = std::max(worst, r.max_abs_err);
  }
  std::printf("gradcheck registry: %d/%zu cases pass over %zu ops, max abs err %.2e\n", passed, reg.cases().size(),
              per_op.size(), worst);
  // What the registry must hold, so a family dropped from registration fails here.
  CHECK(reg.cases().size() >= 210);
  CHECK(per_op.size() >= 47);
  for (const char* op :
       {"narrow", "transpose", "matmul", "linear", "layer_norm", "cross_entropy", "softmax", "attention"}) {
    INFO(op);
    CHECK(per_op.count(op) == 1);
  }
  CHECK(fused_grid == 8 * 3 * 2 * 2 + 1);  // the fused kernel's grid: mask x heads x lengths x dropout, plus one
}
