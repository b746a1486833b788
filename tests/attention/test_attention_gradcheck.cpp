// The gradcheck is only evidence if it can fail: a planted attention case whose backward does not
// match its forward must be rejected. (The whole registry runs in test_gradcheck_registry.cpp.)
#include <catch2/catch.hpp>

#include <cstdio>

#include "attention/attention.h"
#include "tensor/ops.h"

using namespace qkv;

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
