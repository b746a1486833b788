// Grad mode: when off (inside a NoGradGuard), differentiable ops record nothing.
#pragma once

namespace qkv::autograd {

bool grad_enabled();
void set_grad_enabled(bool on);

// bf16 autocast (train.dtype = "bf16"): while on, ag::linear, ag::matmul and attention compute
// with their float32 inputs rounded to bfloat16 and their incoming gradients rounded likewise —
// matmuls and attention "in bf16 with fp32 accumulation" — while parameters, optimizer state and
// every other op stay float32 (the master weights).
bool autocast_bf16();
void set_autocast_bf16(bool on);

class AutocastGuard {
 public:
  explicit AutocastGuard(bool on) : prev_(autocast_bf16()) { set_autocast_bf16(on); }
  ~AutocastGuard() { set_autocast_bf16(prev_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_;
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace qkv::autograd
