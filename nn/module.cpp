#include "nn/module.h"

namespace qkv::nn {

Tensor Module::register_parameter(const std::string& name, Tensor t, bool decay) {
  t.set_requires_grad(true);
  params_.push_back({name, t, decay});
  return t;
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>& out) const {
  for (const auto& p : params_) out.push_back({prefix + p.name, p.tensor, p.decay});
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

void Module::to(Device device) {
  for (auto& p : named_parameters()) {
    if (p.tensor.device() == device) continue;
    Tensor moved = p.tensor.to(device);
    Tensor handle = p.tensor;
    handle.set_data(moved);
    handle.set_grad(Tensor());
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

}  // namespace qkv::nn
