// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. Output depends only on (key, counter), so element i of a random tensor
// is the same on any thread count and on CPU or CUDA. Usable from host and device code.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define QKV_HD __host__ __device__ __forceinline__
#else
#define QKV_HD inline
#endif

namespace qkv {

struct Philox4 {
  uint32_t v[4];
};

QKV_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float32).
QKV_HD float uniform_from_bits(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }
// Uniform in [0, 1) with 53 random bits from two words.
QKV_HD double uniform53_from_bits(uint32_t hi, uint32_t lo) {
  const uint64_t x = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(x & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace qkv
