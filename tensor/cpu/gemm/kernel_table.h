// Internal to tensor/cpu/gemm/: what gemm.cpp's driver needs of one instruction set's kernel.
#pragma once
#include <cstdint>
#include <functional>

namespace qkv::cpu::gemm_detail {

// One register tile (micro_kernel.h): C[mr x nr] (+)= alpha * Ap · Bp over kc.
using TileFn = void (*)(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int mr, int nr,
                        float alpha, float beta, bool first);

struct KernelTable {
  const char* name = nullptr;  // nullptr: not compiled for this target
  int mr = 0, nr = 0;          // register tile
  int64_t kc = 0;              // depth of a packed block: Ap (mr x kc) and Bp (kc x nr) panels stay in L1
  int64_t mc = 0;              // rows of op(A) packed at a time (a multiple of mr): mc x kc stays in L2
  int64_t nc = 0;              // columns of op(B) packed at a time (a multiple of nr): kc x nc in L2/L3
  TileFn tile = nullptr;
};

// Defined in kernels_<isa>.cpp; `name` is nullptr where the target cannot compile that kernel.
extern const KernelTable kSseKernel;
extern const KernelTable kAvx2Kernel;
extern const KernelTable kAvx512Kernel;
// kAvx512Kernel's tile and blocking compiled for AVX2 (kernels_avx2.cpp): same bits, for tests on
// CPUs without AVX-512.
extern const KernelTable kAvx512LayoutOnAvx2;

// The packed driver on one table (gemm.cpp); for tests of a table that is not a GemmKernel.
void packed_sgemm(const KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Runs band(i0, mi, j0, nj) for each band of C [m x n] that one thread computes (rows i0 .. i0+mi,
// columns j0 .. j0+nj; band edges at multiples of mr and nr), through run_split (gemm.cpp).
void for_each_band(int64_t m, int64_t n, int64_t k, int mr, int nr,
                   const std::function<void(int64_t i0, int64_t mi, int64_t j0, int64_t nj)>& band);

}  // namespace qkv::cpu::gemm_detail
