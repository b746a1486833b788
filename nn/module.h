// Module and parameters: a tree of named submodules, each owning named parameter tensors, so a
// model's parameters have stable dotted names (the Hugging Face names checkpoints use) and a fixed
// order (the order of registration), which the optimizer and checkpoints rely on.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::nn {

struct NamedParameter {
  std::string name;  // full dotted name, e.g. "transformer.h.0.attn.c_attn.weight"
  Tensor tensor;
  bool decay = true;  // AdamW weight decay applies (false for norms, biases, 1-d tensors)
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t parameter_count() const;
  void train(bool on = true);
  // Moves every parameter to `device` in place (handles held by layers follow); gradients are
  // dropped. Modules with buffers besides parameters extend it.
  virtual void to(Device device);
  void eval() { train(false); }
  bool is_training() const { return training_; }

 protected:
  Tensor register_parameter(const std::string& name, Tensor t, bool decay = true);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<NamedParameter>& out) const;
  std::vector<NamedParameter> params_;  // local names
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace qkv::nn
