#pragma once
#include "autograd/gradcheck.h"

namespace qkv::app {
// Core ops + attention + model checks, assembled once (app/registry.cpp).
const autograd::GradcheckRegistry& full_gradcheck_registry();
}
