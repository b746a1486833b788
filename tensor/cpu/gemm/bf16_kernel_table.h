// Internal to tensor/cpu/gemm/: what the bf16 driver (bf16_gemm.cpp) needs of one kernel on bf16
// pairs. A "pair" is a uint32 holding two bf16 values adjacent along k: bits 0-15 the even k,
// bits 16-31 the odd k, the layout VDPBF16PS and TDPBF16PS read.
#pragma once
#include <cstdint>

namespace qkv::cpu::gemm_detail {

// One register (or tile-register) block: C[mr x nr] (+)= alpha * Ap · Bp over kp pairs, stored as
// store_tile (micro_kernel.h) does.
using Bf16TileFn = void (*)(int64_t kp, const uint32_t* ap, const uint32_t* bp, float* c, int64_t ldc, int mr, int nr,
                            float alpha, float beta, bool first);

struct Bf16KernelTable {
  const char* name = nullptr;  // nullptr: not compiled for this target
  int mr = 0, nr = 0;          // block of C per tile call
  int64_t kc = 0;              // k per packed block (even; a multiple of 2 * k_step)
  int64_t mc = 0, nc = 0;      // rows of op(A) / columns of op(B) packed at a time (multiples of mr / nr)
  // Packed layouts. B: panels of nr columns, pair-major: bp[p * nr + j] = (op(B)[2p, j], op(B)[2p+1, j]).
  // A: panels of mr rows; k_step == 1: pair-major, ap[p * mr + r]; k_step > 1 (AMX): in steps of
  // k_step pairs, each step row-major: ap[s * mr * k_step + r * k_step + (p - s * k_step)]. The
  // pairs of a panel are padded with zeros to a multiple of k_step.
  int k_step = 1;
  Bf16TileFn tile = nullptr;
  // Called by each thread around its part of a product (AMX: configure and release the tiles).
  void (*begin)() = nullptr;
  void (*end)() = nullptr;
};

// Defined in kernels_avx512_bf16.cpp and kernels_amx.cpp; `name` nullptr where not compiled.
extern const Bf16KernelTable kAvx512Bf16Kernel;
extern const Bf16KernelTable kAmxKernel;
// The same tiles with the instructions emulated in vector code as their definitions state them
// (kernels_bf16_emulated.cpp, AVX2 + FMA): for tests of the packing, blocking and store on CPUs
// without the units, and for comparing the units with their definitions where they exist.
extern const Bf16KernelTable kAvx512Bf16Emulated;
extern const Bf16KernelTable kAmxEmulated;

// The packed driver on one table (bf16_gemm.cpp).
void packed_sbgemm(const Bf16KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// invariant_sbgemm_nt (bf16_gemm.h) on one dot-pair table (k_step 1): the unit's or its
// definition's (tests run the packing and the checks on CPUs without the unit).
void invariant_pair_product(const Bf16KernelTable& kt, const float* x, int64_t ldx, const float* w, int64_t ldw,
                            const float* bias, float* y, int64_t ldy, int64_t m, int64_t n, int64_t k);

}  // namespace qkv::cpu::gemm_detail
