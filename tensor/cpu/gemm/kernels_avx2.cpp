// qkv's packed GEMM on 256-bit vectors with FMA: 6 x 16 register tile (12 accumulators of the 16
// YMM registers, 2 for the B row, 1 broadcast). Compiled with -mavx2 -mfma (CMakeLists.txt).
#include "tensor/cpu/gemm/micro_kernel.h"

namespace qkv::cpu::gemm_detail {

#if defined(__AVX2__) && defined(__FMA__)
typedef float v8 __attribute__((vector_size(32)));
const KernelTable kAvx2Kernel = {"avx2", 6, 16, 384, 96, 3072, &micro_tile<v8, 6, 2>};
// The avx512 kernel's tile and blocking, its 512-bit vectors split in two by the compiler: the
// same lane arithmetic, so the same bits as kAvx512Kernel, on a CPU without AVX-512 (tests).
typedef float v16 __attribute__((vector_size(64)));
const KernelTable kAvx512LayoutOnAvx2 = {"avx512-layout", 12, 32, 256, 192, 3072, &micro_tile<v16, 12, 2>};
#else
const KernelTable kAvx2Kernel = {};
const KernelTable kAvx512LayoutOnAvx2 = {};
#endif

}  // namespace qkv::cpu::gemm_detail
