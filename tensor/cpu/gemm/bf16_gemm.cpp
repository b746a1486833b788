// The bf16 dispatch point (bf16_gemm.h) and the packed driver of the units' kernels.
//
// The driver blocks as the float32 one does (gemm.cpp): columns of op(B) in blocks of nc, k in
// blocks of kc, rows of op(A) in blocks of mc, one band of C per thread. Packing rounds each value
// to bf16 (nearest, ties to even; exact on the values autocast produced), flushes values below
// bf16's normal range to zero, and pairs k with k + 1 in one uint32, so the packed operands take
// half the bytes of float32 ones.
#include "tensor/cpu/gemm/bf16_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "tensor/cpu/gemm/bf16_kernel_table.h"
#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cpu/gemm/kernel_table.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace qkv::cpu {

namespace gemm_detail {

namespace {

struct PairScratch {
  uint32_t* data = nullptr;
  size_t capacity = 0;
  ~PairScratch() { std::free(data); }
  uint32_t* get(size_t pairs) {
    if (pairs > capacity) {
      std::free(data);
      const size_t bytes = (pairs * sizeof(uint32_t) + 63) / 64 * 64;
      data = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
      if (!data) fail("[gemm] out of memory for a ", bytes, "-byte packing buffer");
      capacity = bytes / sizeof(uint32_t);
    }
    return data;
  }
};

// x as the units read it: bf16, nearest even, zero below the normal range (sign kept).
inline uint32_t unit_bf16(float x) {
  uint16_t h = float_to_bf16(x);
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  return h;
}

// Pairs of k for kb values of k, padded with zeros to kpp pairs: pair p = (at(2p), at(2p + 1)).
template <class At>
inline uint32_t pair_at(const At& at, int64_t p, int64_t kb) {
  const int64_t k0 = 2 * p;
  const uint32_t even = k0 < kb ? unit_bf16(at(k0)) : 0, odd = k0 + 1 < kb ? unit_bf16(at(k0 + 1)) : 0;
  return even | (odd << 16);
}

// ceil(kb / 2) pairs, rounded up to a multiple of the kernel's step.
inline int64_t padded_pairs(int64_t kb, int step) { return ((kb + 1) / 2 + step - 1) / step * step; }

// Panels of mr rows of op(A) over k in [p0, p0 + kb), as Bf16KernelTable describes; rows past mb
// are zero.
void pack_a_pairs(const Bf16KernelTable& kt, bool ta, const float* a, int64_t lda, int64_t i0, int64_t mb, int64_t p0,
                  int64_t kb, uint32_t* dst) {
  const int mr = kt.mr, step = kt.k_step;
  const int64_t kpp = padded_pairs(kb, step);
  for (int64_t q = 0; q < mb; q += mr, dst += mr * kpp) {
    const int rows = int(std::min<int64_t>(mr, mb - q));
    for (int r = 0; r < mr; ++r) {
      const int64_t i = i0 + q + r;
      auto at = [&](int64_t kk) { return ta ? a[(p0 + kk) * lda + i] : a[i * lda + p0 + kk]; };
      for (int64_t p = 0; p < kpp; ++p) {
        const uint32_t v = r < rows ? pair_at(at, p, kb) : 0;
        if (step == 1) dst[p * mr + r] = v;
        else dst[(p / step) * mr * step + r * step + p % step] = v;
      }
    }
  }
}

// Panels of nr columns of op(B) over k in [p0, p0 + kb), pair-major; columns past nb are zero.
void pack_b_pairs(const Bf16KernelTable& kt, bool tb, const float* b, int64_t ldb, int64_t p0, int64_t kb, int64_t j0,
                  int64_t nb, uint32_t* dst) {
  const int nr = kt.nr;
  const int64_t kpp = padded_pairs(kb, kt.k_step);
  for (int64_t q = 0; q < nb; q += nr, dst += nr * kpp) {
    const int cols = int(std::min<int64_t>(nr, nb - q));
    for (int j = 0; j < nr; ++j) {
      const int64_t col = j0 + q + j;
      auto at = [&](int64_t kk) { return tb ? b[col * ldb + p0 + kk] : b[(p0 + kk) * ldb + col]; };
      for (int64_t p = 0; p < kpp; ++p) dst[p * nr + j] = j < cols ? pair_at(at, p, kb) : 0;
    }
  }
}

void packed_serial(const Bf16KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local PairScratch a_buf, b_buf;
  const int64_t nc = std::min(kt.nc, (n + kt.nr - 1) / kt.nr * kt.nr);
  const int64_t mc = std::min(kt.mc, (m + kt.mr - 1) / kt.mr * kt.mr);
  const int64_t kc = std::min(kt.kc, k);
  const int64_t kpp_max = padded_pairs(kc, kt.k_step);
  uint32_t* bp = b_buf.get(size_t(kpp_max * nc));
  uint32_t* ap = a_buf.get(size_t(kpp_max * mc));
  if (kt.begin) kt.begin();
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t nb = std::min(nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t kb = std::min(kc, k - pc), kpp = padded_pairs(kb, kt.k_step);
      const bool first = pc == 0;
      pack_b_pairs(kt, tb, b, ldb, pc, kb, jc, nb, bp);
      for (int64_t ic = 0; ic < m; ic += mc) {
        const int64_t mb = std::min(mc, m - ic);
        pack_a_pairs(kt, ta, a, lda, ic, mb, pc, kb, ap);
        for (int64_t jr = 0; jr < nb; jr += kt.nr)
          for (int64_t ir = 0; ir < mb; ir += kt.mr)
            kt.tile(kpp, ap + ir * kpp, bp + jr * kpp, c + (ic + ir) * ldc + jc + jr, ldc,
                    int(std::min<int64_t>(kt.mr, mb - ir)), int(std::min<int64_t>(kt.nr, nb - jr)), alpha, beta, first);
      }
    }
  }
  if (kt.end) kt.end();
}

}  // namespace

void packed_sbgemm(const Bf16KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // the empty sum: C = beta * C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  for_each_band(m, n, k, kt.mr, kt.nr, [&](int64_t i0, int64_t mi, int64_t j0, int64_t nj) {
    const float* ai = ta ? a + i0 : a + i0 * lda;
    const float* bj = tb ? b + j0 * ldb : b + j0;
    packed_serial(kt, ta, tb, mi, nj, k, alpha, ai, lda, bj, ldb, beta, c + i0 * ldc + j0, ldc);
  });
}

}  // namespace gemm_detail

namespace {

const gemm_detail::Bf16KernelTable* table_of(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::avx512_bf16:
      return &gemm_detail::kAvx512Bf16Kernel;
    case Bf16Kernel::amx:
      return &gemm_detail::kAmxKernel;
    default:
      return nullptr;
  }
}

Bf16Kernel by_features() {
  if (bf16_kernel_supported(Bf16Kernel::amx)) return Bf16Kernel::amx;
  if (bf16_kernel_supported(Bf16Kernel::avx512_bf16)) return Bf16Kernel::avx512_bf16;
  return Bf16Kernel::emulated;
}

Bf16Kernel kernel_from_environment() {
  const char* env = std::getenv("QKV_GEMM_BF16");
  if (!env || !*env) return Bf16Kernel::automatic;
  const Bf16Kernel kernel = parse_bf16_kernel(env, "QKV_GEMM_BF16");
  if (!bf16_kernel_supported(kernel)) {
    std::string has;
    for (const auto& f : cpu_features().names()) has += (has.empty() ? "" : " ") + f;
    fail("[gemm] QKV_GEMM_BF16=", env,
         ": this CPU cannot execute that kernel (it has: ", has.empty() ? "no vector extensions" : has, ")",
         kernel == Bf16Kernel::amx && cpu_features().amx_bf16 ? "; the OS refused the AMX tile state" : "");
  }
  return kernel;
}

std::atomic<int> g_requested{-1};  // -1: QKV_GEMM_BF16 not read yet

Bf16Kernel requested_now() {
  int r = g_requested.load(std::memory_order_acquire);
  if (r < 0) {
    const Bf16Kernel from_env = kernel_from_environment();
    int expected = -1;
    g_requested.compare_exchange_strong(expected, int(from_env), std::memory_order_acq_rel);
    r = g_requested.load(std::memory_order_acquire);
  }
  return Bf16Kernel(r);
}

}  // namespace

const char* bf16_kernel_name(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::automatic:
      return "auto";
    case Bf16Kernel::emulated:
      return "emulated";
    case Bf16Kernel::avx512_bf16:
      return "avx512_bf16";
    case Bf16Kernel::amx:
      return "amx";
  }
  return "?";
}

Bf16Kernel parse_bf16_kernel(const std::string& name, const char* what) {
  for (Bf16Kernel k : {Bf16Kernel::automatic, Bf16Kernel::emulated, Bf16Kernel::avx512_bf16, Bf16Kernel::amx})
    if (name == bf16_kernel_name(k)) return k;
  fail("[gemm] ", what, " must be auto, emulated, avx512_bf16 or amx, got '", name, "'");
}

bool bf16_kernel_supported(Bf16Kernel kernel) {
  const CpuFeatures& f = cpu_features();
  switch (kernel) {
    case Bf16Kernel::automatic:
    case Bf16Kernel::emulated:
      return true;
    case Bf16Kernel::avx512_bf16:
      return gemm_detail::kAvx512Bf16Kernel.name != nullptr && f.avx512f && f.avx512_bf16 && f.fma;
    case Bf16Kernel::amx:
      return gemm_detail::kAmxKernel.name != nullptr && f.amx_tile && f.amx_bf16 && f.avx512f && f.fma && request_amx();
  }
  return false;
}

Bf16Kernel requested_bf16_kernel() { return requested_now(); }

Bf16Kernel active_bf16_kernel() {
  static const Bf16Kernel automatic_choice = by_features();
  const Bf16Kernel requested = requested_now();
  return requested == Bf16Kernel::automatic ? automatic_choice : requested;
}

void set_bf16_kernel(Bf16Kernel kernel) {
  if (!bf16_kernel_supported(kernel))
    fail("[gemm] the ", bf16_kernel_name(kernel), " bf16 kernel cannot run on this CPU");
  g_requested.store(int(kernel), std::memory_order_release);
}

std::string bf16_kernel_reason() {
  const Bf16Kernel requested = requested_now(), active = active_bf16_kernel();
  const CpuFeatures& f = cpu_features();
  std::string why;
  if (requested != Bf16Kernel::automatic) {
    why = "forced (QKV_GEMM_BF16 or set_bf16_kernel)";
  } else if (active == Bf16Kernel::amx) {
    why = "the CPU has AMX-BF16 and the OS granted its tiles";
  } else if (active == Bf16Kernel::avx512_bf16) {
    why = f.amx_bf16 ? "the CPU has AVX512-BF16; the OS refused the AMX tile state" : "the CPU has AVX512-BF16";
  } else {
    why = std::string(f.amx_bf16 ? "the OS refused the AMX tile state and the CPU has no AVX512-BF16"
                                 : "no AMX-BF16 or AVX512-BF16 on this CPU") +
          ": operands rounded to bf16, multiplied by the float32 GEMM (" + gemm_kernel_name(active_gemm_kernel()) + ")";
  }
  return std::string(bf16_kernel_name(active)) + (active == Bf16Kernel::emulated ? "" : " (qkv)") + ": " + why;
}

void sbgemm_with(Bf16Kernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (kernel == Bf16Kernel::automatic) kernel = active_bf16_kernel();
  if (kernel == Bf16Kernel::emulated) return sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (!bf16_kernel_supported(kernel))
    fail("[gemm] the ", bf16_kernel_name(kernel), " bf16 kernel cannot run on this CPU");
  gemm_detail::packed_sbgemm(*table_of(kernel), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sbgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
            int64_t ldb, float beta, float* c, int64_t ldc) {
  sbgemm_with(active_bf16_kernel(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace qkv::cpu
