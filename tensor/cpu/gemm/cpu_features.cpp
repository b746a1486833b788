#include "tensor/cpu/gemm/cpu_features.h"

#include <cstdint>
#include <cstring>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define QKV_X86 1
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qkv::cpu {

namespace {

#if QKV_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}
uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

CpuFeatures read_features() {
  CpuFeatures f;
  const Regs r0 = cpuid(0);
  const unsigned max_leaf = r0.a;
  char vendor[13] = {};
  std::memcpy(vendor, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string s = brand;
    const size_t first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
    f.brand = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  }
  if (max_leaf < 1) return f;
  const Regs r1 = cpuid(1);
  const unsigned base_family = (r1.a >> 8) & 0xf, base_model = (r1.a >> 4) & 0xf;
  f.family = int(base_family == 0xf ? base_family + ((r1.a >> 20) & 0xff) : base_family);
  f.model = int(base_family == 0x6 || base_family == 0xf ? base_model + (((r1.a >> 16) & 0xf) << 4) : base_model);
  f.stepping = int(r1.a & 0xf);
  f.sse3 = bit(r1.c, 0);
  f.ssse3 = bit(r1.c, 9);
  f.sse41 = bit(r1.c, 19);
  f.sse42 = bit(r1.c, 20);
  const bool osxsave = bit(r1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  // XCR0: 1 SSE, 2 AVX (YMM upper halves), 5-7 AVX-512 (opmask, ZMM0-15 upper, ZMM16-31),
  // 17-18 AMX (tile config, tile data).
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0;
  const bool amx_os = (xcr0 & 0x60000) == 0x60000;
  f.avx = bit(r1.c, 28) && ymm_os;
  f.fma = bit(r1.c, 12) && ymm_os;
  f.f16c = bit(r1.c, 29) && ymm_os;
  if (max_leaf >= 7) {
    const Regs r7 = cpuid(7, 0);
    f.avx2 = bit(r7.b, 5) && ymm_os;
    f.avx512f = bit(r7.b, 16) && zmm_os;
    f.avx512dq = bit(r7.b, 17) && zmm_os;
    f.avx512cd = bit(r7.b, 28) && zmm_os;
    f.avx512bw = bit(r7.b, 30) && zmm_os;
    f.avx512vl = bit(r7.b, 31) && zmm_os;
    f.avx512_vnni = bit(r7.c, 11) && zmm_os;
    f.avx512_fp16 = bit(r7.d, 23) && zmm_os;
    f.amx_bf16 = bit(r7.d, 22) && amx_os;
    f.amx_tile = bit(r7.d, 24) && amx_os;
    f.amx_int8 = bit(r7.d, 25) && amx_os;
    if (r7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5) && zmm_os;
  }
  return f;
}
#else
CpuFeatures read_features() { return {}; }
#endif

}  // namespace

std::vector<std::string> CpuFeatures::names() const {
  const std::pair<bool, const char*> all[] = {{sse3, "sse3"},
                                              {ssse3, "ssse3"},
                                              {sse41, "sse4_1"},
                                              {sse42, "sse4_2"},
                                              {avx, "avx"},
                                              {avx2, "avx2"},
                                              {fma, "fma"},
                                              {f16c, "f16c"},
                                              {avx512f, "avx512f"},
                                              {avx512bw, "avx512bw"},
                                              {avx512dq, "avx512dq"},
                                              {avx512vl, "avx512vl"},
                                              {avx512cd, "avx512cd"},
                                              {avx512_vnni, "avx512_vnni"},
                                              {avx512_bf16, "avx512_bf16"},
                                              {avx512_fp16, "avx512_fp16"},
                                              {amx_tile, "amx_tile"},
                                              {amx_bf16, "amx_bf16"},
                                              {amx_int8, "amx_int8"}};
  std::vector<std::string> out;
  for (const auto& [on, name] : all)
    if (on) out.emplace_back(name);
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_features();
  return features;
}

bool request_amx() {
  static const bool granted = [] {
    if (!cpu_features().amx_tile) return false;
#if defined(__linux__) && QKV_X86
    constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl code (asm/prctl.h)
    constexpr long kXfeatureXtiledata = 18;     // XCR0 bit of the tile data state
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}

}  // namespace qkv::cpu
