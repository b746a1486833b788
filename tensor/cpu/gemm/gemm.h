// The float32 GEMM of every CPU matmul (Linear forward and both backward products, batched
// matmuls, the LM head, the linear-attention kernels' products): ONE dispatch point that runs the
// fastest kernel this CPU can execute, chosen from the CPU's own features (cpu_features.h), not
// from what the linked BLAS build detects.
//
//   C[m, n] = alpha * sum_k op(A)[m, k] * op(B)[k, n] + beta * C[m, n]     (row-major)
//
// The kernels:
//   blas    the linked BLAS's sgemm (OpenBLAS picks its own kernel from a table of CPU models;
//           a model it does not know gets its SSE3 "Prescott" kernel);
//   sse     qkv's packed GEMM on 128-bit vectors, no FMA: any x86-64 (and the portable build);
//   avx2    qkv's packed GEMM on 256-bit vectors with FMA (6 x 16 register tile);
//   avx512  qkv's packed GEMM on 512-bit vectors with FMA (12 x 32 register tile).
// `auto` (the default) runs qkv's kernel for the widest vectors the CPU has, unless the BLAS
// reports a kernel family of that same width (it is then at least as fast: it is tuned per
// model), in which case the BLAS runs. QKV_GEMM=<kernel> in the environment, or set_gemm_kernel(),
// forces one; forcing a kernel the CPU cannot execute is refused with qkv::Error.
//
// qkv's kernels (gemm.cpp) reduce every element in one order that depends only on k and the
// kernel: k in blocks of the kernel's kc, each block summed k by k into a register accumulator and
// added to C once. The split of m and n over threads and register tiles never touches that order,
// so the result does not depend on the thread count or on the other rows and columns.
#pragma once
#include <cstdint>
#include <string>

namespace qkv::cpu {

enum class GemmKernel { automatic, blas, sse, avx2, avx512 };

// "auto", "blas", "sse", "avx2", "avx512".
const char* gemm_kernel_name(GemmKernel kernel);
// Parses a name above; throws qkv::Error naming `what` (e.g. "QKV_GEMM") and the value otherwise.
GemmKernel parse_gemm_kernel(const std::string& name, const char* what);
// True when this CPU can execute the kernel (blas and automatic always).
bool gemm_kernel_supported(GemmKernel kernel);

// The requested kernel (QKV_GEMM, read once, or the last set_gemm_kernel) and the one it resolves
// to on this CPU with this BLAS (never `automatic`).
GemmKernel requested_gemm_kernel();
GemmKernel active_gemm_kernel();
// Forces a kernel for the process (automatic restores the choice by features). Throws qkv::Error
// when the CPU cannot execute it. Not for use while another thread multiplies.
void set_gemm_kernel(GemmKernel kernel);
// Forces a kernel for a scope and restores the one requested before.
class GemmKernelGuard {
 public:
  explicit GemmKernelGuard(GemmKernel kernel) : previous_(requested_gemm_kernel()) { set_gemm_kernel(kernel); }
  ~GemmKernelGuard() { set_gemm_kernel(previous_); }
  GemmKernelGuard(const GemmKernelGuard&) = delete;
  GemmKernelGuard& operator=(const GemmKernelGuard&) = delete;

 private:
  GemmKernel previous_;
};
// One line naming the kernel that runs and why, e.g. "avx512 (qkv; BLAS kernel Prescott is SSE3)".
std::string gemm_kernel_reason();

// The product above. ta / tb: A (B) is stored as its transpose: op(A)[i, p] = a[p * lda + i].
// lda >= (ta ? m : k) etc., ldc >= n; C must not overlap A or B. beta == 0: C is not read.
// Threads: up to omp_get_max_threads() through run_split (tensor/cpu/parallel.h), one inside an
// OpenMP region.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc);
// The same on one named kernel, whatever is active (tests and benchmarks compare kernels).
void sgemm_with(GemmKernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace qkv::cpu
