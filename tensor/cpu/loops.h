// Strided N-operand loops: the one place that walks arbitrary views (non-contiguous, broadcast
// with stride 0) so that each kernel only writes its inner loop.
//
// for_each_strided<N>(shape, {strides...}, {base pointers...}, f) calls
//   f(ptrs, inner_strides, n)
// once per run of the innermost (coalesced) dimension, where ptrs[k] points at operand k's first
// element of the run and inner_strides[k] is its element stride along the run. Dims that are
// laid out back to back in every operand are merged first, so a contiguous tensor is one run.
// Runs are spread over OpenMP threads when the tensor is large enough to pay for it.
#pragma once
#include <omp.h>

#include <array>
#include <cstdint>

#include "tensor/shape.h"

namespace qkv::cpu {

constexpr int64_t kParallelGrain = 1 << 15;  // elements per thread below which we stay serial

template <int N>
struct LoopPlan {
  int ndim = 0;
  std::array<int64_t, 16> sizes{};  // coalesced sizes, innermost last
  std::array<std::array<int64_t, 16>, N> strides{};
};

template <int N>
LoopPlan<N> plan_loop(const Shape& shape, const std::array<const Strides*, N>& strides) {
  LoopPlan<N> p;
  // Drop size-1 dims, then merge dim i into i+1 when every operand is contiguous across them.
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (p.ndim > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        if ((*strides[k])[d] * shape[d] != p.strides[k][p.ndim - 1]) {
          mergeable = false;
          break;
        }
      if (mergeable) {
        p.sizes[p.ndim - 1] *= shape[d];
        for (int k = 0; k < N; ++k) p.strides[k][p.ndim - 1] = (*strides[k])[d];
        continue;
      }
    }
    p.sizes[p.ndim] = shape[d];
    for (int k = 0; k < N; ++k) p.strides[k][p.ndim] = (*strides[k])[d];
    p.ndim++;
  }
  if (p.ndim == 0) {  // scalar (or all size-1 dims): one run of length 1
    p.ndim = 1;
    p.sizes[0] = 1;
    for (int k = 0; k < N; ++k) p.strides[k][0] = 0;
  }
  return p;
}

// T: element types are the caller's business: ptrs are typed as the caller's element pointers.
template <int N, class Ptr, class F>
void for_each_strided(const Shape& shape, const std::array<const Strides*, N>& strides, const std::array<Ptr, N>& base,
                      F&& f, bool allow_parallel = true) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return;
  const LoopPlan<N> p = plan_loop<N>(shape, strides);
  const int64_t inner = p.sizes[p.ndim - 1];
  const int64_t outer = numel / inner;
  std::array<int64_t, N> inner_strides;
  for (int k = 0; k < N; ++k) inner_strides[k] = p.strides[k][p.ndim - 1];

  auto run = [&](int64_t o) {
    std::array<Ptr, N> ptrs = base;
    int64_t rem = o;
    for (int d = p.ndim - 2; d >= 0; --d) {
      int64_t i = rem % p.sizes[d];
      rem /= p.sizes[d];
      for (int k = 0; k < N; ++k) ptrs[k] = ptrs[k] + i * p.strides[k][d];
    }
    f(ptrs, inner_strides, inner);
  };
  if (allow_parallel && numel >= 2 * kParallelGrain && outer > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) run(o);
  } else if (allow_parallel && outer == 1 && inner >= 2 * kParallelGrain && !omp_in_parallel()) {
    // One long run: split it into chunks.
    const int64_t chunks = (inner + kParallelGrain - 1) / kParallelGrain;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t start = c * kParallelGrain;
      const int64_t len = std::min<int64_t>(kParallelGrain, inner - start);
      std::array<Ptr, N> ptrs = base;
      for (int k = 0; k < N; ++k) ptrs[k] = ptrs[k] + start * inner_strides[k];
      f(ptrs, inner_strides, len);
    }
  } else {
    for (int64_t o = 0; o < outer; ++o) run(o);
  }
}

}  // namespace qkv::cpu
