// qkv's bf16 GEMM on VDPBF16PS (AVX512-BF16): a 12 x 32 block of C in 24 ZMM accumulators, each
// step a broadcast pair of A against two ZMM of B pairs (32 columns x 2 k). Compiled with
// -mavx512f -mavx512bf16 (CMakeLists.txt); it runs only where cpu_features() reports AVX512-BF16.
#include "tensor/cpu/gemm/bf16_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace qkv::cpu::gemm_detail {

#if defined(__AVX512F__) && defined(__AVX512BF16__)
namespace {
struct DotPairInstruction {
  typedef float F __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
  static F dot(F acc, U a, U b) { return (F)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b); }
};
}  // namespace
const Bf16KernelTable kAvx512Bf16Kernel = {"avx512_bf16", 12,   32, 384,
                                           192,           3072, 1,  &dot_pair_tile<DotPairInstruction, 12, 2>};
#else
const Bf16KernelTable kAvx512Bf16Kernel = {};
#endif

}  // namespace qkv::cpu::gemm_detail
