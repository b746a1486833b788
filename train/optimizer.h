// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"), with the exact update
// order of PyTorch's torch.optim.AdamW (1.13, single-tensor path), per element:
//   p  <- p * (1 - lr * wd)                      (decoupled decay, first; wd = 0 when !decay)
//   m  <- b1 * m + (1 - b1) * g
//   v  <- b2 * v + (1 - b2) * g * g
//   p  <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where t is the 1-based step count. Scalars are formed in double and applied in float32, as
// PyTorch does with Python floats.
//
// The update is one fused pass per parameter (read p, g, m, v once, write p, m, v once; no
// temporaries), spread over OpenMP threads inside a single parallel region for all parameters.
// `grad_scale` multiplies g on the fly, so global-norm clipping needs no extra pass over the
// gradients (see clip.h: clip_scale).
//
// Differences from PyTorch, on purpose: one step count for all parameters (checkpoints store one
// `step`), and a parameter whose .grad is undefined at step() is left untouched (moments too).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "autograd/optim_param.h"
#include "tensor/adamw_scalars.h"
#include "tensor/tensor.h"

namespace qkv {
struct TrainSettings;
}

namespace qkv::train {

struct AdamWOptions {
  double lr = 1e-3;  // used by step() without an explicit lr
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied only to parameters with decay = true

  static AdamWOptions from(const TrainSettings& t);  // train.lr, beta1, beta2, eps, weight_decay
};

// One parameter the optimizer updates (autograd/optim_param.h). The caller decides `decay`.
using autograd::OptimParam;

struct AdamWState {
  Tensor exp_avg;     // m, same shape as the parameter, float32
  Tensor exp_avg_sq;  // v
};

class AdamW {
 public:
  // Allocates zeroed moments for every parameter, on its device. Throws on duplicate names, a
  // parameter listed twice (same storage and offset), a non-float32 / non-contiguous parameter,
  // or parameters on different devices.
  AdamW(std::vector<OptimParam> params, AdamWOptions opts);

  // One update of every parameter that has a gradient, at learning rate `lr`, with each gradient
  // multiplied by `grad_scale` first. Increments step_count() before use (t starts at 1).
  void step(double lr, float grad_scale = 1.0f);
  void step() { step(opts_.lr); }

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t t);  // checkpoint restore

  const AdamWOptions& options() const { return opts_; }
  const std::vector<OptimParam>& params() const { return params_; }
  const std::vector<AdamWState>& states() const { return states_; }  // index-aligned with params()
  const AdamWState& state(const std::string& name) const;            // throws for an unknown name
  // The moments as tensors shaped like the parameters, [parameter][m, v]: handles onto the state
  // itself (what DataParallel gathers and spreads for ZeRO-1 checkpoints).
  std::vector<std::vector<Tensor>> element_state() const;
  bool has_param(const std::string& name) const { return index_.count(name) != 0; }

  // Copies the given moments into the state of `name` bitwise (shapes must match exactly; float32
  // or float64 sources; float64 is rounded to float32).
  void load_state(const std::string& name, const Tensor& exp_avg, const Tensor& exp_avg_sq);

 private:
  std::vector<OptimParam> params_;
  std::vector<AdamWState> states_;
  std::unordered_map<std::string, size_t> index_;
  AdamWOptions opts_;
  int64_t step_ = 0;
  std::vector<AdamWSlice> work_;  // one parameter's pointers each, reused every step (no allocation)
};

}  // namespace qkv::train
