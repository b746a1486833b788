// Batch-invariant float32 GEMM for a linear layer's forward: y = x · W^T (+ bias), written by hand
// so that every output element is reduced in ONE order, whatever the batch (issue 38).
//
//   y[m, n] = s[m, n]            (no bias)
//   y[m, n] = s[m, n] + bias[n]  (bias: one rounded addition after the sum)
//   s[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 1], W[n, 1], fma(x[m, 0], W[n, 0], +0.0f)) ...)
//
// i.e. one float accumulator per element, starting at +0, updated with a fused multiply-add
// (one rounding) for k = 0, 1, ..., K-1 in that order. No other order is ever used: the kernel
// vectorises across output columns n (each vector lane is one element's accumulator), and blocks
// and threads split only rows m and columns n, never k. So y[m, :] is bitwise a function of
// x[m, :], W and bias alone: it does not depend on M, on the row m, on the other rows, on the
// tiling (an edge column or row runs the same lane operations as an interior one), on the thread
// count, or on the BLAS library. The portable build (no FMA instruction) computes the same values
// with std::fma. The file is compiled with -ffp-contract=off (CMakeLists.txt) so the compiler adds
// no contraction of its own.
//
// W [N, K] is read as [K, 16] panels (16 columns n, k-major): pack_weight() builds them once, for a
// caller that keeps them while the weight is unchanged (a decode loop); invariant_linear() on a
// raw W packs per call: each task (a group of panels, ~192 KiB packed, times up to 384 rows) packs
// its panels into a per-thread buffer, so W is packed ceil(M / 384) times (N*K copies against
// 384*N*K multiply-adds). At M = 1 with W's rows at most 1024 floats apart it reads W unpacked
// (8x8 register transposes feed the lanes), streaming W once.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::cpu {

// Columns per packed panel (two 8-lane vectors) and rows per register block of the micro-kernel.
constexpr int64_t kInvariantPanel = 16;
constexpr int64_t kInvariantRows = 6;

// W [N, K] (row n at W + n*ldw) as ceil(N / 16) panels; panel p holds W[16p + j, k] at
// data[(p*K + k)*16 + j], zero where 16p + j >= N. bf16: the panels hold W rounded to bf16
// (nearest, ties to even) in `half` instead, half the bytes; the kernel widens each value back to
// float32 (exactly) and runs the same order, so the product is bitwise the one on that rounded W.
struct PackedWeight {
  int64_t n = 0, k = 0;
  bool bf16 = false;
  std::vector<float> data;
  std::vector<uint16_t> half;
};
PackedWeight pack_weight(const float* w, int64_t ldw, int64_t n, int64_t k);
PackedWeight pack_weight_bf16(const float* w, int64_t ldw, int64_t n, int64_t k);

// y [M, N] (row m at y + m*ldy) = x [M, K] (row m at x + m*ldx) · W^T (+ bias [N] when not null),
// in the order stated above. ldx >= K, ldw >= K, ldy >= N; y must not overlap x, W or bias. Threads:
// omp_get_max_threads(), split over rows and columns only (tensor/cpu/parallel.h). bf16_values:
// the caller expects x and W to hold bf16 values (bf16 autocast); where the CPU has bf16 units and
// M is not a decode's few rows, the product then runs on them (cpu::invariant_sbgemm_nt,
// tensor/cpu/gemm/bf16_gemm.h), which gives the same bits: a speed hint, never a change of values.
void invariant_linear(const float* x, int64_t ldx, const float* w, int64_t ldw, const float* bias, float* y,
                      int64_t ldy, int64_t m, int64_t n, int64_t k, bool bf16_values = false);
// The same product on a weight packed by pack_weight (bitwise the same result).
void invariant_linear(const float* x, int64_t ldx, const PackedWeight& w, const float* bias, float* y, int64_t ldy,
                      int64_t m);

// Packed weights for a decode loop. While a PackedWeightScope is alive on the calling thread, the
// Tensor form below called on that thread packs each weight it sees with at most kPackedRows rows
// of x once, keyed by the weight's storage, data pointer, layout and bf16 rounding, and reuses the
// panels for every later call while that storage lives: a decode step then streams panels (pure
// loads and FMAs) instead of transposing W's rows on the fly. The values are the same bits either
// way (the order is the kernel's, not the layout's). The scope owner promises the weights do not
// change while it lives (train::generate holds one for a generation, whose model is const); the
// panels are freed when the thread's last scope ends. Each thread has its own scopes and panels,
// so generations on two threads (two Python models) neither pack nor free each other's. They take
// as much memory as the weights they copy (half as much in bf16).
constexpr int64_t kPackedRows = 16;
class PackedWeightScope {
 public:
  PackedWeightScope();
  ~PackedWeightScope();
  PackedWeightScope(const PackedWeightScope&) = delete;
  PackedWeightScope& operator=(const PackedWeightScope&) = delete;
};

// Tensor form, CPU float32: x [..., K] (rows of unit stride), weight [N, K] (unit column stride),
// bias [N] or undefined -> [..., N]. The counterpart of qkv::linear (tensor/ops.h) with the order
// above; bad shapes, dtypes or devices throw qkv::Error. bf16:
//   none          float32 operands;
//   operands      x and weight hold bf16 values (autocast rounded them): the same product, on the
//                 CPU's bf16 units where it has them (bf16_values above);
//   round_weight  multiply by W rounded to bf16 (bf16 inference; x holds bf16 values): inside a
//                 PackedWeightScope from bf16 panels packed once, so a decode step reads half the
//                 bytes of float32 ones.
enum class InvariantBf16 { none, operands, round_weight };
Tensor invariant_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        InvariantBf16 bf16 = InvariantBf16::none);

}  // namespace qkv::cpu
