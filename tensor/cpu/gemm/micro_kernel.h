// Internal to tensor/cpu/gemm/: the register tile of qkv's packed GEMM, written once over a GCC
// vector type and compiled once per instruction set (kernels_sse.cpp, kernels_avx2.cpp,
// kernels_avx512.cpp, each with its own target flags in CMakeLists.txt).
//
//   acc[r][j] = sum_{k < kc} ap[k * MR + r] * bp[k * NR + j]     (k by k, one accumulator each)
//   first block:  C[r][j] = alpha * acc[r][j] + beta * C[r][j]   (beta == 0: C is not read)
//   later blocks: C[r][j] = C[r][j] + alpha * acc[r][j]
//
// ap is a packed panel of MR rows of op(A) (k-major), bp a packed panel of NR = NV * lanes columns
// of op(B) (k-major); rows >= mr and columns >= nr of the tile are padding and are not written.
#pragma once
#include <cstdint>
#include <cstring>

#include "tensor/cpu/gemm/kernel_table.h"

namespace qkv::cpu::gemm_detail {

// s in every lane: a lane-0 insert and an all-zero shuffle, which compiles to one vbroadcastss.
// (V{} + s would be an addition, which -0.0 survives only as +0.0.)
template <class V>
inline V broadcast(float s) {
  typedef int Mask __attribute__((vector_size(sizeof(V))));
  V v = {s};
  return __builtin_shuffle(v, Mask{});
}

// The tile's accumulators into C, as every kernel of the room ends:
//   first block:  C[r][j] = alpha * acc[r][j] + beta * C[r][j]   (beta == 0: C is not read)
//   later blocks: C[r][j] = C[r][j] + alpha * acc[r][j]
// rows >= mr and columns >= nr are padding and are not written.
// (Always inlined: the accumulators stay in registers.)
template <class V, int MR, int NV>
__attribute__((always_inline)) inline void store_tile(const V (&acc)[MR][NV], float* c, int64_t ldc, int mr, int nr,
                                                      float alpha, float beta, bool first) {
  constexpr int L = int(sizeof(V) / sizeof(float));
  constexpr int NR = NV * L;
  // Writes the tile into rows of `dst` (ld apart). An edge tile goes through a full-size copy of
  // its part of C, so every element takes the same vector arithmetic as in an interior tile.
  auto write = [&](float* dst, int64_t ld) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      float* row = dst + r * ld;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        V out;
        if (!first) {
          std::memcpy(&out, row + v * L, sizeof(V));
          out += alpha * acc[r][v];
        } else if (beta == 0.0f) {
          out = alpha * acc[r][v];
        } else {
          std::memcpy(&out, row + v * L, sizeof(V));
          out = alpha * acc[r][v] + beta * out;
        }
        std::memcpy(row + v * L, &out, sizeof(V));
      }
    }
  };
  if (mr == MR && nr == NR) {
    write(c, ldc);
    return;
  }
  alignas(64) float tile[MR * NR] = {};
  if (!first || beta != 0.0f)
    for (int r = 0; r < mr; ++r) std::memcpy(tile + r * NR, c + r * ldc, sizeof(float) * size_t(nr));
  write(tile, NR);
  for (int r = 0; r < mr; ++r) std::memcpy(c + r * ldc, tile + r * NR, sizeof(float) * size_t(nr));
}

template <class V, int MR, int NV>
void micro_tile(int64_t kc, const float* __restrict ap, const float* __restrict bp, float* c, int64_t ldc, int mr,
                int nr, float alpha, float beta, bool first) {
  constexpr int L = int(sizeof(V) / sizeof(float));
  constexpr int NR = NV * L;
  // C's rows are needed only after the k loop: ask for them now so that their misses overlap it.
  for (int r = 0; r < mr; ++r) {
    __builtin_prefetch(c + r * ldc, 1);
    __builtin_prefetch(c + r * ldc + nr - 1, 1);
  }
  V acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], bp + k * NR + v * L, sizeof(V));
    __builtin_prefetch(bp + (k + 8) * NR);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const V a = broadcast<V>(ap[k * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  store_tile<V, MR, NV>(acc, c, ldc, mr, nr, alpha, beta, first);
}

}  // namespace qkv::cpu::gemm_detail
