// The GEMM of bf16 autocast (train.dtype = "bf16") on the CPU: operands that hold bfloat16 values
// (float32 storage, autocast has rounded them), float32 accumulation, float32 result:
//
//   C[m, n] = alpha * sum_k op(A)[m, k] * op(B)[k, n] + beta * C[m, n]     (row-major)
//
// Every product of two bf16 values is exact in float32 (8 + 8 significant bits), so the kernels
// below differ only in how they add the products up. The kernels:
//   emulated     the float32 GEMM (gemm.h) on the float32 operands: what runs where the CPU has no
//                bf16 units;
//   avx512_bf16  qkv's packed GEMM on VDPBF16PS (AVX512-BF16: Zen 4 and later, Cooper Lake,
//                Sapphire Rapids and later): operands packed as bf16 pairs, half the bytes;
//   amx          qkv's packed GEMM on AMX tiles (TDPBF16PS, Sapphire Rapids and later), 32 x 32
//                blocks of C in four tile registers; needs the kernel's permission (request_amx).
// `auto` (the default) takes amx where the CPU has AMX-BF16 and the OS grants its tiles, else
// avx512_bf16 where the CPU has it, else emulated. QKV_GEMM_BF16=<kernel> in the environment, or
// set_bf16_kernel(), forces one; forcing a kernel the CPU cannot execute is refused.
//
// The units' kernels sum each element in one order that depends only on k (pairs of k, in blocks
// of the kernel's depth, each block added to C once), so, as for the float32 kernels, a result
// does not depend on the thread count or on the other rows and columns. Both units flush bf16
// inputs and float32 results below the normal range to zero (their definition); the packing does
// the same to the inputs, so every kernel sees the same operands.
#pragma once
#include <cstdint>
#include <string>

namespace qkv::cpu {

enum class Bf16Kernel { automatic, emulated, avx512_bf16, amx };

// "auto", "emulated", "avx512_bf16", "amx".
const char* bf16_kernel_name(Bf16Kernel kernel);
// Parses a name above; throws qkv::Error naming `what` (e.g. "QKV_GEMM_BF16") and the value.
Bf16Kernel parse_bf16_kernel(const std::string& name, const char* what);
// True when this CPU (and, for amx, the OS) can execute the kernel (emulated and auto always).
bool bf16_kernel_supported(Bf16Kernel kernel);

// The requested kernel (QKV_GEMM_BF16, read once, or the last set_bf16_kernel) and the one it
// resolves to here (never `automatic`).
Bf16Kernel requested_bf16_kernel();
Bf16Kernel active_bf16_kernel();
// Forces a kernel for the process (automatic restores the choice by features); throws qkv::Error
// when the CPU cannot execute it. Not for use while another thread multiplies.
void set_bf16_kernel(Bf16Kernel kernel);
class Bf16KernelGuard {
 public:
  explicit Bf16KernelGuard(Bf16Kernel kernel) : previous_(requested_bf16_kernel()) { set_bf16_kernel(kernel); }
  ~Bf16KernelGuard() { set_bf16_kernel(previous_); }
  Bf16KernelGuard(const Bf16KernelGuard&) = delete;
  Bf16KernelGuard& operator=(const Bf16KernelGuard&) = delete;

 private:
  Bf16Kernel previous_;
};
// One line naming the kernel and why, e.g. "emulated: no AMX-BF16 or AVX512-BF16 on this CPU (...)".
std::string bf16_kernel_reason();

// The product above; arguments as cpu::sgemm (gemm.h). A and B should hold bf16 values: the
// units' kernels round any other value to the nearest bf16 (ties to even) as they pack it.
void sbgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
            int64_t ldb, float beta, float* c, int64_t ldc);
// The same on one named kernel, whatever is active (tests and benchmarks compare kernels).
void sbgemm_with(Bf16Kernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The batch-invariant linear forward under bf16 autocast (numerics = invariant): the product of
// tensor/cpu/invariant_matmul.h, y[m, n] = (fma chain over k = 0..K-1 of x[m, k] * W[n, k] from
// +0) (+ bias[n]), on the VDPBF16PS kernel: each pair holds k in the half the instruction adds
// first and k + 1 in the other, so its two steps run the chain's order, each product exact and
// each step rounded once. The unit flushes inputs and partial sums below float32's normal range
// to zero where the chain keeps them; a block of the product goes to the unit only where the
// exponents of its operands rule that out, and to the float32 chain otherwise: the bits are always
// the chain's. x and W are read rounded to bf16 (nearest, ties to even; the identity on bf16
// values), as the packing of the GEMM above reads its operands. W [N, K] row-major (row n at w +
// n * ldw), x [M, K], y [M, N]; threads over rows and columns only.
// invariant_bf16_on_units(): whether the bf16 kernel in use is a unit's and the CPU has
// AVX512-BF16, i.e. whether invariant_sbgemm_nt can run (else it throws).
bool invariant_bf16_on_units();
void invariant_sbgemm_nt(const float* x, int64_t ldx, const float* w, int64_t ldw, const float* bias, float* y,
                         int64_t ldy, int64_t m, int64_t n, int64_t k);

}  // namespace qkv::cpu
