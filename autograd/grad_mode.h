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

// Grad mode set to `on` for a scope, then restored (NoGradGuard below is GradModeGuard(false)); a
// backward rule that replays a forward, or a check that differentiates, turns recording on.
class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : prev_(grad_enabled()) { set_grad_enabled(on); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

}  // namespace qkv::autograd
