// cpu::sum_squares (grad_norm.h). Inside a block `omp simd reduction` lets the compiler keep
// several vector accumulators: that order is fixed by the binary, not by scheduling.
#include "tensor/cpu/grad_norm.h"

#include <omp.h>

#include <algorithm>

#include "tensor/error.h"

namespace qkv::cpu {
namespace {

constexpr int64_t kBlock = 8192;

template <class T>
double block_sum_squares(const T* __restrict x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
  return s;
}

}  // namespace

std::vector<double> sum_squares(const std::vector<Tensor>& xs) {
  struct Span {
    const void* data;
    DType dtype;
    int64_t n;
  };
  std::vector<Span> spans(xs.size(), Span{nullptr, DType::f32, 0});
  std::vector<Tensor> keep;  // contiguous copies of strided inputs
  std::vector<int64_t> first_block(xs.size() + 1, 0);
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor& t0 = xs[k];
    first_block[k + 1] = first_block[k];
    if (!t0.defined() || t0.numel() == 0) continue;
    QKV_CHECK(t0.dtype() == DType::f32 || t0.dtype() == DType::f64,
              "[sum_squares] tensors must be float32 or float64, got ", dtype_name(t0.dtype()));
    QKV_CHECK(t0.device() == Device::cpu, "[sum_squares] cpu::sum_squares takes CPU tensors");
    Tensor t = t0.is_contiguous() ? t0 : t0.contiguous();
    if (!t.same(t0)) keep.push_back(t);
    spans[k] = {t.raw_data(), t.dtype(), t.numel()};
    first_block[k + 1] += (t.numel() + kBlock - 1) / kBlock;
  }
  const int64_t blocks = first_block.back();
  // Block b of the whole list -> (tensor, start). Built serially; tiny next to the data.
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
    part[b] = sp.dtype == DType::f32 ? block_sum_squares(static_cast<const float*>(sp.data) + start, n)
                                     : block_sum_squares(static_cast<const double*>(sp.data) + start, n);
  }
  std::vector<double> out(xs.size(), 0.0);
  for (size_t k = 0; k < xs.size(); ++k)
    for (int64_t b = first_block[k]; b < first_block[k + 1]; ++b) out[k] += part[b];
  return out;
}

}  // namespace qkv::cpu
