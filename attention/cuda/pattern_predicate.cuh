// Internal to attention/cuda/: the sparse pattern's predicate on the device, one definition for
// every CUDA attention kernel (tiled, tensor-core, and the test-only simple ones). Needs the CUDA
// keywords (__device__, __forceinline__): nvcc's, or the host emulator's.
#pragma once
#include <cstdint>

#include "attention/cuda/device_pattern.h"
#include "attention/pattern/pattern.h"

namespace qkv::attn {

__device__ __forceinline__ bool is_global(const DevicePattern& t, int64_t x) {
  if (!t.globals) return x >= 0 && x < t.g;
  int64_t lo = 0, hi = t.n_globals;  // first entry >= x
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (t.globals[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo < t.n_globals && t.globals[lo] == x;
}

// The sparse pattern's predicate at position p, key j (PatternPredicate::allows, definitions in
// attention.h); positions are >= 0, so blocks are plain quotients.
__device__ __forceinline__ bool pattern_allows(const DevicePattern& t, int64_t p, int64_t j) {
  const int64_t d = p - j, ad = d < 0 ? -d : d;
  switch (t.kind) {
    case static_cast<int>(Pattern::window):
      return ad < t.l;
    case static_cast<int>(Pattern::strided):
      return ad < t.l || d % t.s == 0;
    case static_cast<int>(Pattern::global):
      return ad < t.l || is_global(t, p) || is_global(t, j);
    case static_cast<int>(Pattern::bigbird): {
      if (ad < t.l || is_global(t, p) || is_global(t, j)) return true;
      const int64_t qb = p / t.bs, kb = j / t.bs;
      for (int64_t k = 0; k < t.r; ++k)
        if (t.rand[qb * t.r + k] == kb) return true;
      return false;
    }
    case static_cast<int>(Pattern::block_sparse): {
      const int64_t qb = p / t.bs, kb = j / t.bs;
      if (t.layout == 0) return (qb - kb <= 1 && kb - qb <= 1) || kb == 0 || qb == 0;
      if (t.layout == 1) return kb == qb || kb % 4 == 3;
      return qb < t.rows && kb < t.cols && t.table[qb * t.cols + kb] != 0;
    }
    default:
      return true;
  }
}

}  // namespace qkv::attn
