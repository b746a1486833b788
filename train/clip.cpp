// Global gradient norm and clipping (see clip.h).
//
// norm^2 = sum_k sum_i x_k[i]^2 in float64: each tensor's sum of squares comes from its device's
// kernel (cpu::sum_squares or cuda::sum_squares, twins with one float64 per tensor, each
// deterministic whatever the thread count), and the per-tensor sums are added in list order.
#include "train/clip.h"

#include <omp.h>

#include <cmath>

#include "tensor/cpu/grad_norm.h"
#include "tensor/cuda/grad_norm.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace qkv::train {
namespace {

double global_norm_impl(const std::vector<Tensor>& tensors, const char* op) {
  std::vector<Tensor> on_cpu, on_device;
  std::vector<std::pair<bool, size_t>> slot;  // (on the device?, index there), in list order
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    QKV_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "[", op, "] tensors must be float32 or float64, got ",
              dtype_name(t.dtype()));
    std::vector<Tensor>& dst = t.device() == Device::cpu ? on_cpu : on_device;
    slot.emplace_back(t.device() != Device::cpu, dst.size());
    dst.push_back(t);
  }
  const std::vector<double> cpu_sums = cpu::sum_squares(on_cpu);
  const std::vector<double> device_sums = on_device.empty() ? std::vector<double>{} : cuda::sum_squares(on_device);
  double total = 0.0;
  for (const auto& [device, i] : slot) total += device ? device_sums[i] : cpu_sums[i];
  return std::sqrt(total);
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> g;
  g.reserve(params.size());
  for (const Tensor& p : params)
    if (p.defined()) g.push_back(p.grad());
  return g;
}

}  // namespace

double global_norm(const std::vector<Tensor>& tensors) { return global_norm_impl(tensors, "global_norm"); }

double global_grad_norm(const std::vector<Tensor>& params) {
  return global_norm_impl(grads_of(params), "clip_grad_norm");
}

float clip_scale(double norm, double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(norm)) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const std::vector<Tensor> grads = grads_of(params);
  const double norm = global_norm_impl(grads, "clip_grad_norm");
  const float scale = clip_scale(norm, max_norm);
  if (scale == 1.0f) return norm;
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    if (g.device() != Device::cpu) {
      mul_(g, scale);
      continue;
    }
    QKV_CHECK(g.is_contiguous(), "[clip_grad_norm] cannot scale a non-contiguous gradient in place");
    const int64_t n = g.numel();
    const bool parallel = n >= (1 << 16) && !omp_in_parallel();
    if (g.dtype() == DType::f32) {
      float* x = g.data<float>();
#pragma omp parallel for simd schedule(static) if (parallel)
      for (int64_t i = 0; i < n; ++i) x[i] *= scale;
    } else {
      double* x = g.data<double>();
      const double s = scale;
#pragma omp parallel for simd schedule(static) if (parallel)
      for (int64_t i = 0; i < n; ++i) x[i] *= s;
    }
  }
  return norm;
}

}  // namespace qkv::train
