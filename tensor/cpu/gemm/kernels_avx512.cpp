// qkv's packed GEMM on 512-bit vectors with FMA: 12 x 32 register tile (24 accumulators of the 32
// ZMM registers, 2 for the B row, 1 broadcast). Compiled with -mavx512f (CMakeLists.txt) whatever
// the build host has; it runs only where cpu_features() reports AVX-512F. It holds no constant
// vectors but zero (the -mno-avx512f note in CMakeLists.txt).
#include "tensor/cpu/gemm/micro_kernel.h"

namespace qkv::cpu::gemm_detail {

#if defined(__AVX512F__)
typedef float v16 __attribute__((vector_size(64)));
const KernelTable kAvx512Kernel = {"avx512", 12, 32, 256, 192, 3072, &micro_tile<v16, 12, 2>};
#else
const KernelTable kAvx512Kernel = {};
#endif

}  // namespace qkv::cpu::gemm_detail
