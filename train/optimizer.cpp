// AdamW: the bookkeeping around the fused update (see optimizer.h for the formula), whose kernels
// are cpu::adamw_update_many (tensor/cpu/adamw.cpp) and its twin cuda::adamw_update_many
// (tensor/cuda/adamw.cu).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "tensor/cpu/adamw.h"
#include "tensor/cuda/adamw.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "train/config.h"

namespace qkv::train {

AdamWOptions AdamWOptions::from(const TrainSettings& t) {
  AdamWOptions o;
  o.lr = t.lr;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  return o;
}

AdamW::AdamW(std::vector<OptimParam> params, AdamWOptions opts) : params_(std::move(params)), opts_(opts) {
  QKV_CHECK(opts_.beta1 >= 0 && opts_.beta1 < 1, "[adamw] beta1 must be in [0, 1), got ", opts_.beta1);
  QKV_CHECK(opts_.beta2 >= 0 && opts_.beta2 < 1, "[adamw] beta2 must be in [0, 1), got ", opts_.beta2);
  QKV_CHECK(opts_.eps >= 0, "[adamw] eps must be >= 0, got ", opts_.eps);
  QKV_CHECK(opts_.weight_decay >= 0, "[adamw] weight_decay must be >= 0, got ", opts_.weight_decay);
  std::unordered_set<const void*> seen;
  states_.reserve(params_.size());
  work_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimParam& op = params_[i];
    QKV_CHECK(op.param.defined(), "[adamw] parameter ", op.name, " is undefined");
    QKV_CHECK(op.param.dtype() == DType::f32, "[adamw] parameter ", op.name, " is ", dtype_name(op.param.dtype()),
              " but must be float32");
    QKV_CHECK(op.param.device() == params_[0].param.device(), "[adamw] parameter ", op.name, " is on ",
              device_name(op.param.device()), " but ", params_[0].name, " is on ",
              device_name(params_[0].param.device()), ": one device per optimizer");
    QKV_CHECK(op.param.is_contiguous(), "[adamw] parameter ", op.name, " must be contiguous");
    QKV_CHECK(index_.emplace(op.name, i).second, "[adamw] parameter name ", op.name, " appears twice");
    QKV_CHECK(op.param.numel() == 0 || seen.insert(op.param.raw_data()).second, "[adamw] parameter ", op.name,
              " shares its data with an earlier parameter (a tied weight must be listed once)");
    // Moments live with the parameter (zeroed on the host, copied once for a device).
    AdamWState st{zeros(op.param.shape(), DType::f32, op.param.device()),
                  zeros(op.param.shape(), DType::f32, op.param.device())};
    states_.push_back(std::move(st));
  }
}

std::vector<std::vector<Tensor>> AdamW::element_state() const {
  std::vector<std::vector<Tensor>> out;
  out.reserve(states_.size());
  for (const AdamWState& s : states_) out.push_back({s.exp_avg, s.exp_avg_sq});
  return out;
}

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  const double t = static_cast<double>(step_);
  const double bc1 = 1.0 - std::pow(opts_.beta1, t);
  const double bc2 = 1.0 - std::pow(opts_.beta2, t);
  AdamWScalars base{};
  base.beta1 = static_cast<float>(opts_.beta1);
  base.one_minus_beta1 = static_cast<float>(1.0 - opts_.beta1);
  base.beta2 = static_cast<float>(opts_.beta2);
  base.one_minus_beta2 = static_cast<float>(1.0 - opts_.beta2);
  base.step_size = static_cast<float>(lr / bc1);
  base.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  base.eps = static_cast<float>(opts_.eps);
  base.grad_scale = grad_scale;
  AdamWScalars with_decay = base, without_decay = base;
  with_decay.decay_factor = static_cast<float>(1.0 - lr * opts_.weight_decay);
  without_decay.decay_factor = 1.0f;

  // Gather the work: pointers for every parameter that has a gradient.
  std::vector<AdamWSlice>& slices = work_;
  slices.clear();
  std::vector<Tensor> keep;  // contiguous copies of strided gradients (rare), alive for the update
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimParam& op = params_[i];
    Tensor g = op.param.grad();
    if (!g.defined() || op.param.numel() == 0) continue;
    QKV_CHECK(g.shape() == op.param.shape(), "[adamw] gradient of ", op.name, " has shape ", shape_str(g.shape()),
              " but the parameter is ", shape_str(op.param.shape()));
    QKV_CHECK(g.dtype() == DType::f32 && g.device() == op.param.device(), "[adamw] gradient of ", op.name,
              " must be float32 on ", device_name(op.param.device()), ", got ", dtype_name(g.dtype()), " on ",
              device_name(g.device()));
    if (!g.is_contiguous()) {
      g = g.contiguous();
      keep.push_back(g);
    }
    slices.push_back({op.param.data<float>(), g.data<float>(), states_[i].exp_avg.data<float>(),
                      states_[i].exp_avg_sq.data<float>(), op.param.numel(), op.decay});
    total += op.param.numel();
  }
  if (total == 0) return;
  if (params_[0].param.device() == Device::cuda)
    cuda::adamw_update_many(slices, with_decay, without_decay);    // every parameter in one launch
  else cpu::adamw_update_many(slices, with_decay, without_decay);  // one parallel region
}

void AdamW::set_step_count(int64_t t) {
  QKV_CHECK(t >= 0, "[adamw] step count must be >= 0, got ", t);
  step_ = t;
}

const AdamWState& AdamW::state(const std::string& name) const {
  auto it = index_.find(name);
  QKV_CHECK(it != index_.end(), "[adamw] no parameter named ", name);
  return states_[it->second];
}

void AdamW::load_state(const std::string& name, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  auto it = index_.find(name);
  QKV_CHECK(it != index_.end(), "[adamw] no parameter named ", name);
  AdamWState& st = states_[it->second];
  auto load = [&](Tensor& dst, const Tensor& src, const char* what) {
    QKV_CHECK(src.defined(), "[adamw] ", name, ".", what, " is undefined");
    QKV_CHECK(src.shape() == dst.shape(), "[adamw] ", name, ".", what, " has shape ", shape_str(src.shape()),
              " but the parameter is ", shape_str(dst.shape()));
    QKV_CHECK(src.dtype() == DType::f32 || src.dtype() == DType::f64, "[adamw] ", name, ".", what, " is ",
              dtype_name(src.dtype()), "; expected float32");
    copy_(dst, src);  // any device, float32 or float64 in
  };
  load(st.exp_avg, exp_avg, "exp_avg");
  load(st.exp_avg_sq, exp_avg_sq, "exp_avg_sq");
}

}  // namespace qkv::train
