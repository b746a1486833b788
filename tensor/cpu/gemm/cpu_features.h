// What the CPU this process runs on can execute, read from the CPU itself (cpuid and xgetbv), so
// that kernels are chosen by feature, not by a table of CPU models. A feature counts only when the
// operating system also saves its registers (XCR0): AVX needs the YMM state, AVX-512 the opmask
// and ZMM states, AMX the tile states plus the kernel's per-process permission (Linux:
// arch_prctl(ARCH_REQ_XCOMP_PERM), asked once by request_amx()).
#pragma once
#include <string>
#include <vector>

namespace qkv::cpu {

struct CpuFeatures {
  std::string vendor;                       // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string brand;                        // the processor brand string, e.g. "AMD EPYC 7B13"
  int family = 0, model = 0, stepping = 0;  // display family and model (extended fields folded in)
  bool sse3 = false, ssse3 = false, sse41 = false, sse42 = false;
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512cd = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;  // present and enabled in XCR0

  // The features above that are set, by their /proc/cpuinfo names, in a fixed order.
  std::vector<std::string> names() const;
};

// Read once per process.
const CpuFeatures& cpu_features();

// AMX tile data needs the kernel's permission per process (Linux >= 5.16). Asks once; true when
// granted (always false without amx_tile, or off Linux).
bool request_amx();

}  // namespace qkv::cpu
