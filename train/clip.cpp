// Global gradient norm and clipping (see clip.h).
//
// norm^2 = sum_k sum_i x_k[i]^2, accumulated in double. Each tensor is cut into blocks of
// kBlock elements; the blocks of all tensors are summed in parallel (one double per block, in a
// reused buffer) and then added in block order, so the result does not depend on how many
// threads ran. Inside a block `omp simd reduction` lets the compiler keep several vector
// accumulators: that order is fixed by the binary, not by scheduling. Device tensors are reduced
// on the device (cuda::sum_squares: one float64 sum of squares per tensor, gathered to the host
// in one copy).
#include "train/clip.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "tensor/cuda/grad_norm.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace qkv::train {
namespace {

constexpr int64_t kBlock = 8192;

template <class T>
double sum_squares(const T* __restrict x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
  return s;
}

double global_norm_impl(const std::vector<Tensor>& tensors, const char* op) {
  struct Span {
    const void* data;
    DType dtype;
    int64_t n;
  };
  std::vector<Span> spans;
  std::vector<Tensor> keep;  // contiguous copies of strided inputs
  std::vector<Tensor> on_device;  // reduced on the device, one float64 per tensor
  spans.reserve(tensors.size());
  int64_t blocks = 0;
  for (const Tensor& t0 : tensors) {
    if (!t0.defined() || t0.numel() == 0) continue;
    QKV_CHECK(t0.dtype() == DType::f32 || t0.dtype() == DType::f64, "[", op, "] tensors must be float32 or float64, got ",
              dtype_name(t0.dtype()));
    if (t0.device() != Device::cpu) {
      on_device.push_back(t0);
      continue;
    }
    Tensor t = t0;
    if (!t.is_contiguous()) t = t.contiguous();
    if (!t.same(t0)) keep.push_back(t);
    spans.push_back({t.raw_data(), t.dtype(), t.numel()});
    blocks += (t.numel() + kBlock - 1) / kBlock;
  }
  double device_total = 0.0;
  for (double v : cuda::sum_squares(on_device)) device_total += v;  // tensor order
  if (blocks == 0) return std::sqrt(device_total);

  // Block b of the whole list -> (span, start). Built serially; tiny next to the data.
  static thread_local std::vector<double> partial;
  static thread_local std::vector<std::pair<int32_t, int64_t>> where;
  partial.assign(blocks, 0.0);
  where.clear();
  where.reserve(blocks);
  for (size_t k = 0; k < spans.size(); ++k)
    for (int64_t s = 0; s < spans[k].n; s += kBlock) where.emplace_back(static_cast<int32_t>(k), s);

  double* part = partial.data();
  const auto* loc = where.data();
  const bool parallel = blocks >= 4 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const Span& sp = spans[loc[b].first];
    const int64_t start = loc[b].second, n = std::min(kBlock, sp.n - start);
    part[b] = sp.dtype == DType::f32 ? sum_squares(static_cast<const float*>(sp.data) + start, n)
                                     : sum_squares(static_cast<const double*>(sp.data) + start, n);
  }
  double total = device_total;
  for (int64_t b = 0; b < blocks; ++b) total += part[b];
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
