// qkv's packed GEMM on 128-bit vectors without FMA: 6 x 8 register tile (12 accumulators of the
// 16 XMM registers). Compiled with -mno-avx (CMakeLists.txt): it runs on any x86-64.
#include "tensor/cpu/gemm/micro_kernel.h"

namespace qkv::cpu::gemm_detail {

typedef float v4 __attribute__((vector_size(16)));
const KernelTable kSseKernel = {"sse", 6, 8, 256, 96, 2048, &micro_tile<v4, 6, 2>};

}  // namespace qkv::cpu::gemm_detail
