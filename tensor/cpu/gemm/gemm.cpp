// The dispatch point (gemm.h) and qkv's packed GEMM driver.
//
// The driver blocks the product the usual way for a register-tile kernel: columns of op(B) in
// blocks of nc, k in blocks of kc, rows of op(A) in blocks of mc. Each kc x nc block of op(B) is
// packed into nr-column panels (k-major) and each mc x kc block of op(A) into mr-row panels, so
// the tile kernel reads both with unit stride whatever the operands' layout (transposes are
// absorbed by the packing). A B panel (kc x nr) stays in L1 while the A panels of the block (in
// L2) stream past it.
//
// Threads take chunks of C (bands of rows or of columns, one per thread) through run_split
// (tensor/cpu/parallel.h): each chunk runs the serial driver with its own packing buffers and no
// chunk waits on another, so there is no barrier inside the product.
#include "tensor/cpu/gemm/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/kernel_table.h"
#include "tensor/cpu/matmul.h"
#include "tensor/cpu/parallel.h"
#include "tensor/error.h"

namespace qkv::cpu {

namespace gemm_detail {

namespace {

// A 64-byte aligned scratch buffer per thread, grown on demand.
struct Scratch {
  float* data = nullptr;
  size_t capacity = 0;
  ~Scratch() { std::free(data); }
  float* get(size_t floats) {
    if (floats > capacity) {
      std::free(data);
      const size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data) fail("[gemm] out of memory for a ", bytes, "-byte packing buffer");
      capacity = bytes / sizeof(float);
    }
    return data;
  }
};

constexpr int kMaxTile = 64;  // the largest mr or nr of a KernelTable

// dst: ceil(mb / mr) panels, panel q = rows i0 + q*mr .. of op(A) over k in [p0, p0 + kb), stored
// dst[q*mr*kb + kk*mr + r]; rows past mb are zero.
void pack_a(bool ta, const float* a, int64_t lda, int64_t i0, int64_t mb, int64_t p0, int64_t kb, int mr, float* dst) {
  for (int64_t q = 0; q < mb; q += mr, dst += mr * kb) {
    const int rows = int(std::min<int64_t>(mr, mb - q));
    if (!ta) {
      // Rows of A are read as `rows` streams side by side so the panel is written in order.
      const float* src[kMaxTile];
      for (int r = 0; r < mr; ++r) src[r] = a + (i0 + q + std::min(r, rows - 1)) * lda + p0;
      for (int64_t kk = 0; kk < kb; ++kk, dst += mr)
        for (int r = 0; r < mr; ++r) dst[r] = r < rows ? src[r][kk] : 0.0f;
      dst -= mr * kb;
    } else {
      for (int64_t kk = 0; kk < kb; ++kk) {
        const float* src = a + (p0 + kk) * lda + i0 + q;
        float* d = dst + kk * mr;
        std::memcpy(d, src, sizeof(float) * size_t(rows));
        for (int r = rows; r < mr; ++r) d[r] = 0.0f;
      }
    }
  }
}

// dst: ceil(nb / nr) panels, panel q = columns j0 + q*nr .. of op(B) over k in [p0, p0 + kb),
// stored dst[q*nr*kb + kk*nr + j]; columns past nb are zero.
void pack_b(bool tb, const float* b, int64_t ldb, int64_t p0, int64_t kb, int64_t j0, int64_t nb, int nr, float* dst) {
  for (int64_t q = 0; q < nb; q += nr, dst += nr * kb) {
    const int cols = int(std::min<int64_t>(nr, nb - q));
    if (!tb) {
      for (int64_t kk = 0; kk < kb; ++kk) {
        const float* src = b + (p0 + kk) * ldb + j0 + q;
        float* d = dst + kk * nr;
        std::memcpy(d, src, sizeof(float) * size_t(cols));
        for (int j = cols; j < nr; ++j) d[j] = 0.0f;
      }
    } else {
      // op(B)'s columns are rows of b: `cols` streams read side by side, the panel written in order.
      const float* src[kMaxTile];
      for (int j = 0; j < nr; ++j) src[j] = b + (j0 + q + std::min(j, cols - 1)) * ldb + p0;
      for (int64_t kk = 0; kk < kb; ++kk)
        for (int j = 0; j < nr; ++j) dst[kk * nr + j] = j < cols ? src[j][kk] : 0.0f;
    }
  }
}

void packed_serial(const KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local Scratch a_buf, b_buf;
  const int64_t nc = std::min(kt.nc, (n + kt.nr - 1) / kt.nr * kt.nr);
  const int64_t mc = std::min(kt.mc, (m + kt.mr - 1) / kt.mr * kt.mr);
  const int64_t kc = std::min(kt.kc, k);
  float* bp = b_buf.get(size_t(kc * nc));
  float* ap = a_buf.get(size_t(kc * mc));
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t nb = std::min(nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t kb = std::min(kc, k - pc);
      const bool first = pc == 0;
      pack_b(tb, b, ldb, pc, kb, jc, nb, kt.nr, bp);
      for (int64_t ic = 0; ic < m; ic += mc) {
        const int64_t mb = std::min(mc, m - ic);
        pack_a(ta, a, lda, ic, mb, pc, kb, kt.mr, ap);
        for (int64_t jr = 0; jr < nb; jr += kt.nr)
          for (int64_t ir = 0; ir < mb; ir += kt.mr)
            kt.tile(kb, ap + ir * kb, bp + jr * kb, c + (ic + ir) * ldc + jc + jr, ldc,
                    int(std::min<int64_t>(kt.mr, mb - ir)), int(std::min<int64_t>(kt.nr, nb - jr)), alpha, beta, first);
      }
    }
  }
}

// Below this many multiply-adds one chunk: a second thread's wake-up and packing would cost more.
constexpr int64_t kSplitMacs = int64_t(1) << 21;

}  // namespace

void packed_sgemm(const KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (kt.mr > kMaxTile || kt.nr > kMaxTile) fail("[gemm] kernel ", kt.name, ": register tile above ", kMaxTile);
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

void for_each_band(int64_t m, int64_t n, int64_t k, int mr, int nr,
                   const std::function<void(int64_t i0, int64_t mi, int64_t j0, int64_t nj)>& band) {
  // One band of C per thread. A band packs its own part of the operand it is cut along and the
  // whole of the other one, so the cut goes across the dimension whose operand is cheaper to pack
  // again: rows (repacking op(B), k x n) when m > n, else columns (repacking op(A), m x k). The
  // values do not depend on the cut (the order of each element's sum is fixed by k alone).
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t col_chunks = 1, row_chunks = 1;
  if (threads > 1 && m * n * k >= kSplitMacs) {
    if (m > n) row_chunks = std::clamp<int64_t>(m / (2 * mr), 1, threads);
    else col_chunks = std::clamp<int64_t>(n / (2 * nr), 1, threads);
  }
  const int64_t cols = (n + col_chunks - 1) / col_chunks, col_step = (cols + nr - 1) / nr * nr;
  const int64_t rows = (m + row_chunks - 1) / row_chunks, row_step = (rows + mr - 1) / mr * mr;
  col_chunks = (n + col_step - 1) / col_step;
  row_chunks = (m + row_step - 1) / row_step;
  auto chunk = [&](int64_t id) {
    const int64_t i0 = (id / col_chunks) * row_step, j0 = (id % col_chunks) * col_step;
    band(i0, std::min(row_step, m - i0), j0, std::min(col_step, n - j0));
  };
  const int64_t chunks = row_chunks * col_chunks;
  if (chunks == 1) return chunk(0);
  run_split(chunks, threads, chunk);
}

}  // namespace gemm_detail

namespace {

using gemm_detail::KernelTable;

const KernelTable* table_of(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::sse:
      return &gemm_detail::kSseKernel;
    case GemmKernel::avx2:
      return &gemm_detail::kAvx2Kernel;
    case GemmKernel::avx512:
      return &gemm_detail::kAvx512Kernel;
    default:
      return nullptr;
  }
}

// The vector width of a kernel family OpenBLAS names (openblas_get_corename()): 512 for its
// AVX-512 families, 256 for its AVX2 + FMA ones, 128 for everything else (SSE kernels, AVX without
// FMA, names it may add later).
int blas_width(const std::string& core) {
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == wide) return 512;
  for (const char* avx2 : {"Haswell", "Zen", "Excavator"})
    if (core == avx2) return 256;
  return 128;
}
int kernel_width(GemmKernel kernel) {
  return kernel == GemmKernel::avx512 ? 512 : kernel == GemmKernel::avx2 ? 256 : 128;
}

// qkv's kernel for the widest vectors this CPU executes.
GemmKernel widest_own_kernel() {
  if (gemm_kernel_supported(GemmKernel::avx512)) return GemmKernel::avx512;
  if (gemm_kernel_supported(GemmKernel::avx2)) return GemmKernel::avx2;
  return GemmKernel::sse;
}

GemmKernel resolve(GemmKernel requested) {
  if (requested != GemmKernel::automatic) return requested;
  const GemmKernel own = widest_own_kernel();
  return blas_width(blas_kernel_name()) >= kernel_width(own) ? GemmKernel::blas : own;
}

GemmKernel kernel_from_environment() {
  const char* env = std::getenv("QKV_GEMM");
  if (!env || !*env) return GemmKernel::automatic;
  const GemmKernel kernel = parse_gemm_kernel(env, "QKV_GEMM");
  if (!gemm_kernel_supported(kernel)) {
    std::string has;
    for (const auto& f : cpu_features().names()) has += (has.empty() ? "" : " ") + f;
    fail("[gemm] QKV_GEMM=", env,
         ": this CPU cannot execute that kernel (it has: ", has.empty() ? "no vector extensions" : has, ")");
  }
  return kernel;
}

std::atomic<int> g_requested{-1};  // -1: QKV_GEMM not read yet

GemmKernel requested_now() {
  int r = g_requested.load(std::memory_order_acquire);
  if (r < 0) {
    const GemmKernel from_env = kernel_from_environment();
    int expected = -1;
    g_requested.compare_exchange_strong(expected, int(from_env), std::memory_order_acq_rel);
    r = g_requested.load(std::memory_order_acquire);
  }
  return GemmKernel(r);
}

}  // namespace

const char* gemm_kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::automatic:
      return "auto";
    case GemmKernel::blas:
      return "blas";
    case GemmKernel::sse:
      return "sse";
    case GemmKernel::avx2:
      return "avx2";
    case GemmKernel::avx512:
      return "avx512";
  }
  return "?";
}

GemmKernel parse_gemm_kernel(const std::string& name, const char* what) {
  for (GemmKernel k : {GemmKernel::automatic, GemmKernel::blas, GemmKernel::sse, GemmKernel::avx2, GemmKernel::avx512})
    if (name == gemm_kernel_name(k)) return k;
  fail("[gemm] ", what, " must be auto, blas, sse, avx2 or avx512, got '", name, "'");
}

bool gemm_kernel_supported(GemmKernel kernel) {
  const CpuFeatures& f = cpu_features();
  switch (kernel) {
    case GemmKernel::automatic:
    case GemmKernel::blas:
      return true;
    case GemmKernel::sse:
      return gemm_detail::kSseKernel.name != nullptr;
    case GemmKernel::avx2:
      return gemm_detail::kAvx2Kernel.name != nullptr && f.avx2 && f.fma;
    case GemmKernel::avx512:
      return gemm_detail::kAvx512Kernel.name != nullptr && f.avx512f && f.fma;
  }
  return false;
}

GemmKernel requested_gemm_kernel() { return requested_now(); }

GemmKernel active_gemm_kernel() {
  // Resolved per call: cheap (a string compare against the BLAS's name), and it follows
  // set_gemm_kernel without a second cache to keep in step.
  static const GemmKernel automatic_choice = resolve(GemmKernel::automatic);
  const GemmKernel requested = requested_now();
  return requested == GemmKernel::automatic ? automatic_choice : requested;
}

void set_gemm_kernel(GemmKernel kernel) {
  if (!gemm_kernel_supported(kernel)) fail("[gemm] the ", gemm_kernel_name(kernel), " kernel cannot run on this CPU");
  g_requested.store(int(kernel), std::memory_order_release);
}

std::string gemm_kernel_reason() {
  const GemmKernel requested = requested_now(), active = active_gemm_kernel();
  const std::string blas = blas_kernel_name();
  std::string why;
  if (requested != GemmKernel::automatic) {
    why = "forced (QKV_GEMM or set_gemm_kernel)";
  } else if (active == GemmKernel::blas) {
    why = "the BLAS kernel " + blas + " uses the CPU's widest vectors (" +
          std::to_string(kernel_width(widest_own_kernel())) + "-bit)";
  } else {
    why = "the CPU has " + std::to_string(kernel_width(active)) + "-bit vectors; the BLAS kernel " + blas + " uses " +
          std::to_string(blas_width(blas)) + "-bit";
  }
  return std::string(gemm_kernel_name(active)) + (active == GemmKernel::blas ? "" : " (qkv)") + ": " + why;
}

void sgemm_with(GemmKernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (kernel == GemmKernel::automatic) kernel = active_gemm_kernel();
  if (kernel == GemmKernel::blas) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
                alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
    return;
  }
  if (!gemm_kernel_supported(kernel)) fail("[gemm] the ", gemm_kernel_name(kernel), " kernel cannot run on this CPU");
  gemm_detail::packed_sgemm(*table_of(kernel), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  sgemm_with(active_gemm_kernel(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace qkv::cpu
