// Every registered attention gradcheck case (the fused op's mask × heads × lengths × dropout
// grid, ALiBi, the reference path with a learned bias, RoPE) passes in float64.
#include <catch2/catch.hpp>

#include <cstdio>

#include "attention/attention.h"
#include "tensor/ops.h"

using namespace qkv;

TEST_CASE("attention gradchecks pass over the whole grid in float64", "[attention][gradcheck]") {
  autograd::GradcheckRegistry reg;
  attn::register_attention_gradchecks(reg);
  int fused = 0, passed = 0;
  double worst = 0;
  for (const auto& c : reg.cases()) {
    const autograd::GradcheckResult r = autograd::run_gradcheck(c);
    INFO(c.op << ": " << c.name << " max_abs_err " << r.max_abs_err << " " << r.error);
    CHECK(r.error.empty());
    CHECK(r.pass);
    passed += r.pass;
    fused += c.op == "attention" && c.name.rfind("fused ", 0) == 0;
    worst = std::max(worst, r.max_abs_err);
  }
  std::printf("[attention] gradcheck: %d/%zu cases pass (%d on the fused grid), max abs err %.2e\n", passed,
              reg.cases().size(), fused, worst);
  CHECK(fused == 8 * 3 * 2 * 2 + 1);
}

TEST_CASE("gradcheck catches a wrong attention backward", "[attention][gradcheck]") {
  // The checker is only evidence if it can fail: a case whose forward is scaled differently from
  // what its backward assumes must be rejected.
  autograd::GradcheckCase c{"attention", "planted mismatch",
                            [] {
                              return std::vector<Tensor>{randn({1, 1, 3, 2}, 1, 0, 0.0, 1.0, DType::f64),
                                                         randn({1, 1, 3, 2}, 2, 0, 0.0, 1.0, DType::f64),
                                                         randn({1, 1, 3, 2}, 3, 0, 0.0, 1.0, DType::f64)};
                            },
                            [](const std::vector<Tensor>& x) {
                              // Upstream of the op the inputs are detached copies, so the numeric
                              // derivative sees q while the analytic one does not.
                              const Tensor qd = x[0].clone();
                              return attn::attention(qd, x[1], x[2]);
                            }};
  const autograd::GradcheckResult r = autograd::run_gradcheck(c);
  CHECK_FALSE(r.pass);
}
