// Internal to tensor/cpu/gemm/: the blocks of the bf16 kernels, written once over an `Ops` type that
// is either the instructions themselves (kernels_avx512_bf16.cpp, kernels_amx.cpp) or their
// definitions in plain vector code (kernels_bf16_emulated.cpp).
//
// The units' arithmetic, as Intel's definitions state it (bf16 inputs below the normal range read
// as zero, each float32 result below it written as zero, round to nearest even):
//   VDPBF16PS  acc = acc + a_odd * b_odd, then acc = acc + a_even * b_even, per lane, where each
//              32-bit lane of a and b is a pair (even k in bits 0-15, odd k in bits 16-31);
//   TDPBF16PS  for each k pair in turn: acc = acc + a_even * b_even, then acc = acc + a_odd * b_odd.
// Each product of two bf16 values is exact in float32, so each step is one rounding: a fused
// multiply-add.
#pragma once
#include <cstdint>
#include <cstring>

#include "tensor/cpu/gemm/bf16_kernel_table.h"
#include "tensor/cpu/gemm/micro_kernel.h"

namespace qkv::cpu::gemm_detail {

// bits in every 32-bit lane (as broadcast<V> in micro_kernel.h, on an integer vector).
template <class U>
inline U broadcast_bits(uint32_t bits) {
  typedef int Mask __attribute__((vector_size(sizeof(U))));
  U v = {bits};
  return __builtin_shuffle(v, Mask{});
}

// The VDPBF16PS kernel's block: C[MR x NR] over kp pairs, NR = NV * 16 columns.
//   acc[r][j] = dot-pair steps over p < kp of (ap[p * MR + r], bp[p * NR + j])
template <class Ops, int MR, int NV>
void dot_pair_tile(int64_t kp, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* c, int64_t ldc,
                   int mr, int nr, float alpha, float beta, bool first) {
  using F = typename Ops::F;
  using U = typename Ops::U;
  constexpr int L = int(sizeof(F) / sizeof(float));
  constexpr int NR = NV * L;
  for (int r = 0; r < mr; ++r) {
    __builtin_prefetch(c + r * ldc, 1);
    __builtin_prefetch(c + r * ldc + nr - 1, 1);
  }
  F acc[MR][NV];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = F{};
  for (int64_t p = 0; p < kp; ++p) {
    U b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], bp + p * NR + v * L, sizeof(U));
    __builtin_prefetch(bp + (p + 8) * NR);
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const U a = broadcast_bits<U>(ap[p * MR + r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Ops::dot(acc[r][v], a, b[v]);
    }
  }
  store_tile<F, MR, NV>(acc, c, ldc, mr, nr, alpha, beta, first);
}

// The AMX kernel's block: C[32 x 32] in four 16 x 16 float32 tiles, k in steps of 16 pairs.
// Ops: zero() clears the four C tiles; step(a, b) loads A rows 0-15 and 16-31 of the step (16
// pairs each, 64 bytes apart) and B's pair rows for columns 0-15 and 16-31 (128 bytes apart) and
// multiplies the four ways; store(acc) writes the C tiles to acc[32][32].
template <class Ops>
void amx_tile(int64_t kp, const uint32_t* __restrict ap, const uint32_t* __restrict bp, float* c, int64_t ldc, int mr,
              int nr, float alpha, float beta, bool first) {
  Ops::zero();
  for (int64_t s = 0; s < kp / 16; ++s) Ops::step(ap + s * 32 * 16, bp + s * 16 * 32);
  alignas(64) float acc[32][32];
  Ops::store(&acc[0][0]);
  typedef float F __attribute__((vector_size(64)));
  F v[32][2];
  std::memcpy(v, acc, sizeof(acc));
  store_tile<F, 32, 2>(v, c, ldc, mr, nr, alpha, beta, first);
}

}  // namespace qkv::cpu::gemm_detail
