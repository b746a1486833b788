// Gradient checking, a user-facing feature (`qkv gradcheck`): every differentiable op registers
// cases; each is checked in float64 by central differences against the analytic vjp with a random
// upstream gradient u: numeric d<u, f(x)>/dx_e = (<u,f(x+eps e)> - <u,f(x-eps e)>) / 2eps.
// Pass when |analytic - numeric| <= atol + rtol * |numeric| for every element (PyTorch's rule).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::autograd {

struct GradcheckCase {
  std::string op;                                    // the primitive's name, e.g. "matmul"
  std::string name;                                  // the case, e.g. "batched broadcast [2,3,4]x[4,5]"
  std::function<std::vector<Tensor>()> make_inputs;  // float64 values for differentiable inputs
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<bool> wrt = {};  // which inputs to differentiate; empty = every float64 input
};

struct GradcheckOptions {
  double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  uint64_t seed = 1234;  // for the upstream gradient u
};

struct GradcheckResult {
  std::string op, name;
  double max_abs_err = 0, max_rel_err = 0;
  bool pass = false;
  std::string error = {};  // set when the case threw
};

GradcheckResult run_gradcheck(const GradcheckCase& c, const GradcheckOptions& opt = {});

class GradcheckRegistry {
 public:
  void add(GradcheckCase c) { cases_.push_back(std::move(c)); }
  const std::vector<GradcheckCase>& cases() const { return cases_; }

 private:
  std::vector<GradcheckCase> cases_;
};

// Each rules file registers its own cases (explicit calls: a static library drops
// self-registering objects nobody references). The app assembles the full registry from these
// and from attention's (app/registry.h); whole models are checked by `qkv gradcheck --config`
// (analysis/model_gradcheck.h), not by registered cases.
void register_view_gradchecks(GradcheckRegistry& r);         // rules/views.cpp
void register_elementwise_gradchecks(GradcheckRegistry& r);  // rules/elementwise.cpp
void register_reduce_gradchecks(GradcheckRegistry& r);       // rules/reduce.cpp
void register_shape_gradchecks(GradcheckRegistry& r);        // rules/shape.cpp
void register_matmul_gradchecks(GradcheckRegistry& r);       // rules/matmul.cpp
void register_nn_gradchecks(GradcheckRegistry& r);           // rules/nn.cpp
inline void register_core_gradchecks(GradcheckRegistry& r) {
  register_view_gradchecks(r);
  register_elementwise_gradchecks(r);
  register_reduce_gradchecks(r);
  register_shape_gradchecks(r);
  register_matmul_gradchecks(r);
  register_nn_gradchecks(r);
}

}  // namespace qkv::autograd
