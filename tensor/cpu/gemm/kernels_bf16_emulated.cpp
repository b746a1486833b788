// The bf16 kernels' blocks with VDPBF16PS and TDPBF16PS written out as their definitions state
// them (bf16_tile.h), compiled for AVX2 + FMA (CMakeLists.txt): the packing, blocking and store of
// kAvx512Bf16Kernel and kAmxKernel run on CPUs without the units, and where the units exist the
// tests compare them with these.
#include <cfloat>

#include "tensor/cpu/gemm/bf16_tile.h"

namespace qkv::cpu::gemm_detail {

#if defined(__AVX2__) && defined(__FMA__)
namespace {

typedef float F16 __attribute__((vector_size(64)));
typedef uint32_t U16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

// A vector cast between vector types of one size reinterprets the bits.
inline F16 even_of(U16 pairs) { return (F16)(pairs << 16); }
inline F16 odd_of(U16 pairs) { return (F16)(pairs & 0xffff0000u); }
// Inputs below the normal range read as zero (keeping the sign).
inline U16 daz(U16 pairs) {
  const U16 even_tiny = (U16)((pairs & 0x7f80u) == 0), odd_tiny = (U16)((pairs & 0x7f800000u) == 0);
  return pairs & ~((even_tiny & 0x7fffu) | (odd_tiny & 0x7fff0000u));
}
// A result below the normal range is written as zero (keeping the sign).
inline F16 ftz(F16 x) {
  const U16 bits = (U16)x;
  const U16 tiny = (U16)((bits & 0x7fffffffu) < 0x00800000u);
  return (F16)(bits & ~(tiny & 0x7fffffffu));
}

struct DotPairDefinition {
  typedef F16 F;
  typedef U16 U;
  static F dot(F acc, U a, U b) {
    a = daz(a);
    b = daz(b);
    acc = ftz(acc + odd_of(a) * odd_of(b));
    return ftz(acc + even_of(a) * even_of(b));
  }
};

float widen(uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float flush(float x) { return (x != 0.0f && x > -FLT_MIN && x < FLT_MIN) ? (x < 0.0f ? -0.0f : 0.0f) : x; }

// The eight tile registers of the AMX kernel: 0-3 C (float32), 4-5 A, 6-7 B (bf16 pairs).
struct TileDefinition {
  static thread_local uint32_t reg[8][16][16];
  static void load(int t, const uint32_t* p, int64_t stride_bytes) {
    for (int r = 0; r < 16; ++r) std::memcpy(reg[t][r], reinterpret_cast<const char*>(p) + r * stride_bytes, 64);
  }
  // C tile c += A tile a · B tile b, as TDPBF16PS: per row m and column n, pair k by pair k.
  static void dot(int c, int a, int b) {
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float acc;
        std::memcpy(&acc, &reg[c][m][n], 4);
        for (int k = 0; k < 16; ++k) {
          const uint32_t x = reg[a][m][k], y = reg[b][k][n];
          acc = flush(acc + widen(uint16_t(x)) * widen(uint16_t(y)));
          acc = flush(acc + widen(uint16_t(x >> 16)) * widen(uint16_t(y >> 16)));
        }
        std::memcpy(&reg[c][m][n], &acc, 4);
      }
  }
  static void zero() { std::memset(reg, 0, sizeof(reg[0]) * 4); }
  static void step(const uint32_t* a, const uint32_t* b) {
    load(4, a, 64);
    load(5, a + 16 * 16, 64);
    load(6, b, 128);
    load(7, b + 16, 128);
    dot(0, 4, 6);
    dot(1, 4, 7);
    dot(2, 5, 6);
    dot(3, 5, 7);
  }
  static void store(float* acc) {
    const int at[4] = {0, 16, 16 * 32, 16 * 32 + 16};
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 16; ++r) std::memcpy(acc + at[t] + r * 32, reg[t][r], 64);
  }
};
thread_local uint32_t TileDefinition::reg[8][16][16];

}  // namespace

const Bf16KernelTable kAvx512Bf16Emulated = {
    "avx512_bf16-definition", 12, 32, 384, 192, 3072, 1, &dot_pair_tile<DotPairDefinition, 12, 2>};
const Bf16KernelTable kAmxEmulated = {"amx-definition", 32, 32, 512, 128, 2048, 16, &amx_tile<TileDefinition>};
#else
const Bf16KernelTable kAvx512Bf16Emulated = {};
const Bf16KernelTable kAmxEmulated = {};
#endif

}  // namespace qkv::cpu::gemm_detail
