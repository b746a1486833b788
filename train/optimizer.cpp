// AdamW: the fused CPU update and the bookkeeping around it (see optimizer.h for the formula).
//
// Work split: all parameters are treated as one concatenated range of elements, cut into one
// equal slice per thread, so a step is a single parallel region with no barrier per parameter
// and no thread idles on a small bias while another updates the embedding. Each slice is a plain
// contiguous loop the compiler vectorises (p, g, m, v are restrict, the scalars are loop
// invariants). The update is memory-bound: 4 reads and 3 writes of float32 per element.
#include "train/optimizer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "tensor/cuda/adamw_multi.h"
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

namespace cpu {
void adamw_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n, const AdamWScalars& s) {
  const AdamWScalars local = s;  // by value, so the compiler knows the stores below cannot change it
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], g[i], m[i], v[i], local);
}
}  // namespace cpu

AdamW::AdamW(std::vector<OptimParam> params, AdamWOptions opts)
    : params_(std::move(params)), opts_(opts) {
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
    QKV_CHECK(op.param.dtype() == DType::f32, "[adamw] parameter ", op.name, " is ",
              dtype_name(op.param.dtype()), " but must be float32");
    QKV_CHECK(op.param.device() == params_[0].param.device(), "[adamw] parameter ", op.name, " is on ",
              device_name(op.param.device()), " but ", params_[0].name, " is on ",
              device_name(params_[0].param.device()), ": one device per optimizer");
    QKV_CHECK(op.param.is_contiguous(), "[adamw] parameter ", op.name, " must be contiguous");
    QKV_CHECK(index_.emplace(op.name, i).second, "[adamw] parameter name ", op.name, " appears twice");
    QKV_CHECK(op.param.numel() == 0 || seen.insert(op.param.raw_data()).second, "[adamw] parameter ",
              op.name, " shares its data with an earlier parameter (a tied weight must be listed once)");
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
  cpu::AdamWScalars base{};
  base.beta1 = static_cast<float>(opts_.beta1);
  base.one_minus_beta1 = static_cast<float>(1.0 - opts_.beta1);
  base.beta2 = static_cast<float>(opts_.beta2);
  base.one_minus_beta2 = static_cast<float>(1.0 - opts_.beta2);
  base.step_size = static_cast<float>(lr / bc1);
  base.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  base.eps = static_cast<float>(opts_.eps);
  base.grad_scale = grad_scale;
  cpu::AdamWScalars with_decay = base, without_decay = base;
  with_decay.decay_factor = static_cast<float>(1.0 - lr * opts_.weight_decay);
  without_decay.decay_factor = 1.0f;

  // Gather the work: pointers for every parameter that has a gradient.
  std::vector<WorkItem>& items = work_;
  items.clear();
  std::vector<Tensor> keep;  // contiguous copies of strided gradients (rare), alive for the loop
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimParam& op = params_[i];
    Tensor g = op.param.grad();
    if (!g.defined() || op.param.numel() == 0) continue;
    QKV_CHECK(g.shape() == op.param.shape(), "[adamw] gradient of ", op.name, " has shape ",
              shape_str(g.shape()), " but the parameter is ", shape_str(op.param.shape()));
    QKV_CHECK(g.dtype() == DType::f32 && g.device() == op.param.device(), "[adamw] gradient of ", op.name,
              " must be float32 on ", device_name(op.param.device()), ", got ", dtype_name(g.dtype()), " on ",
              device_name(g.device()));
    if (!g.is_contiguous()) {
      g = g.contiguous();
      keep.push_back(g);
    }
    items.push_back({op.param.data<float>(), states_[i].exp_avg.data<float>(),
                     states_[i].exp_avg_sq.data<float>(), g.data<float>(), op.param.numel(), total,
                     op.decay});
    total += op.param.numel();
  }
  if (total == 0) return;
  if (params_[0].param.device() == Device::cuda) {
    // Every parameter in one launch (tensor/cuda/adamw_multi.h).
    std::vector<cuda::AdamWSlice> slices;
    slices.reserve(items.size());
    for (const WorkItem& it : items) slices.push_back({it.p, it.g, it.m, it.v, it.n, it.decay});
    cuda::adamw_update_many(slices, with_decay, without_decay);
    return;
  }

  constexpr int64_t kGrain = 1 << 14;  // elements per thread worth a fork
  const int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int nt = static_cast<int>(std::clamp<int64_t>(total / kGrain, 1, max_threads));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    // This thread's slice [lo, hi) of the concatenated range, rounded to 16 elements (one cache line).
    auto cut = [&](int k) { return std::min(total, (total * k / nth + 15) / 16 * 16); };
    const int64_t lo = tid == 0 ? 0 : cut(tid), hi = tid == nth - 1 ? total : cut(tid + 1);
    for (const WorkItem& it : items) {
      const int64_t a = std::max(lo, it.begin), b = std::min(hi, it.begin + it.n);
      if (a >= b) continue;
      const int64_t off = a - it.begin;
      cpu::adamw_update(it.p + off, it.g + off, it.m + off, it.v + off, b - a,
                        it.decay ? with_decay : without_decay);
    }
  }
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
    QKV_CHECK(src.dtype() == DType::f32 || src.dtype() == DType::f64, "[adamw] ", name, ".", what,
              " is ", dtype_name(src.dtype()), "; expected float32");
    copy_(dst, src);  // any device, float32 or float64 in
  };
  load(st.exp_avg, exp_avg, "exp_avg");
  load(st.exp_avg_sq, exp_avg_sq, "exp_avg_sq");
}

}  // namespace qkv::train
