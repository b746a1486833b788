// cpu::adamw_update_many (adamw.h).
//
// Work split: all slices are treated as one concatenated range of elements, cut into one equal
// part per thread, so a step is a single parallel region with no barrier per parameter and no
// thread idles on a small bias while another updates the embedding. Each part is a plain
// contiguous loop the compiler vectorises (p, g, m, v are restrict, the scalars are loop
// invariants). The update is memory-bound: 4 reads and 3 writes of float32 per element.
#include "tensor/cpu/adamw.h"

#include <omp.h>

#include <algorithm>

namespace qkv::cpu {

namespace {

void adamw_update(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                  const AdamWScalars& s) {
  const AdamWScalars local = s;  // by value, so the compiler knows the stores below cannot change it
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], g[i], m[i], v[i], local);
}

}  // namespace

void adamw_update_many(const std::vector<AdamWSlice>& slices, const AdamWScalars& with_decay,
                       const AdamWScalars& without_decay) {
  int64_t total = 0;
  for (const AdamWSlice& s : slices) total += s.n;
  if (total == 0) return;
  constexpr int64_t kGrain = 1 << 14;  // elements per thread worth a fork
  const int max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int nt = static_cast<int>(std::clamp<int64_t>(total / kGrain, 1, max_threads));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    // This thread's part [lo, hi) of the concatenated range, rounded to 16 elements (one cache line).
    auto cut = [&](int k) { return std::min(total, (total * k / nth + 15) / 16 * 16); };
    const int64_t lo = tid == 0 ? 0 : cut(tid), hi = tid == nth - 1 ? total : cut(tid + 1);
    int64_t begin = 0;  // offset of slice `s` in the concatenated range
    for (const AdamWSlice& s : slices) {
      const int64_t a = std::max(lo, begin), b = std::min(hi, begin + s.n);
      if (a < b) {
        const int64_t off = a - begin;
        adamw_update(s.p + off, s.g + off, s.m + off, s.v + off, b - a, s.decay ? with_decay : without_decay);
      }
      begin += s.n;
    }
  }
}

}  // namespace qkv::cpu
