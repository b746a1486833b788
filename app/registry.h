#pragma once
#include "autograd/gradcheck.h"

namespace qkv::app {
// Every registered gradcheck case: the core ops (autograd/rules/), attention
// (attention/gradchecks.cpp) and the attention probes sized past the kernels' tiles and exp's
// overflow, with each pattern at its parameters' edges (registry.cpp), assembled once. `qkv gradcheck` runs it, and so does the test case
// "every registered gradcheck case passes" (tests/autograd/test_gradcheck_registry.cpp). Whole models are
// not registered cases: `qkv gradcheck --config FILE` checks the model of any config
// (analysis/model_gradcheck.h; tests/nn/test_model_gradcheck.cpp).
const autograd::GradcheckRegistry& full_gradcheck_registry();
}  // namespace qkv::app
