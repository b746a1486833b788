#include "app/registry.h"

#include "attention/attention.h"
#include "nn/cross_attention.h"

namespace qkv::app {

const autograd::GradcheckRegistry& full_gradcheck_registry() {
  static const autograd::GradcheckRegistry registry = [] {
    autograd::GradcheckRegistry r;
    autograd::register_core_gradchecks(r);
    attn::register_attention_gradchecks(r);
    nn::register_cross_attention_gradchecks(r);
    return r;
  }();
  return registry;
}

}  // namespace qkv::app
