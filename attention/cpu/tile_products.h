// Internal to attention/: the tile products of the fused CPU kernels, written by hand.
//
//   nt:     S  = alpha·A·Bᵀ   (S = s·Q·Kᵀ, dP = dO·Vᵀ)      B transposed, then nn
//   nn:     S  = alpha·A·B    (the same with Kᵀ, Vᵀ transposed once by the caller)
//   dots:   S  = alpha·A·Bᵀ   as dot products along k, for the strided walk's thin tiles
//   add_nn: C += A·B          (O += P·V, dQ += dS·K)
//   add_tn: C += Aᵀ·B         (dV += Pᵀ·dO, dK += dSᵀ·Q)
//
// Why not BLAS: the tiles are small (32×32×D for the grid walk; 8 or 16 rows by up to 256 keys for
// the strided walk, whose backward has two products only as deep as that), BLAS packs both operands on every
// call and tunes for large products, and which kernel it runs is the library's choice (OpenBLAS
// 0.3.21 picks its SSE3 "Prescott" kernels on this project's Xeon machines). With the products here
// a strided tile of 8 rows costs about what a full tile does per logit, and attention's values do
// not depend on the BLAS build. bench/tile_products_vs_blas.cpp measures them against
// cblas_sgemm on these shapes (docs/perf.md, "Attention tiles").
// All but dots are outer products: each output block is held in registers (R rows × two vectors
// of columns), one B row loaded per step and multiplied by R broadcast elements of A, written with
// GCC's vector extensions so the compiler emits the host's FMA code: 512-bit where the host has
// AVX-512 (tile_products.cpp alone is built for it), else 256-bit (or pairs of SSE halves).
// Where the grid walk's 32-row blocks reuse each key tile, S and dP run on a transposed copy of
// K and V (nn); the strided walk's tiles are 8 or 16 rows against a different run of keys each,
// where a transposed copy would cost about what the product does, so they take dots.
//
// Every element of nt, nn and the accumulating products is one chain of fused multiply-adds in
// step order (from +0 for nt and nn, from C's value for the others), whatever its position in the
// tile, the tile's shape, the vector width or the BLAS: so KV-cache decoding reproduces the
// parallel forward bitwise, and a 512-bit host computes the bits of a 256-bit one. dots sums each
// element in 8 lanes of step p mod 8, then a fixed lane-sum tree: also independent of the
// element's position and the tile's shape.
#pragma once
#include <cstdint>

namespace qkv::attn::tile {

// C[m×n] = alpha·A[m×k]·B[n×k]ᵀ (lda, ldb, ldc: row strides). Writes C's m × n block only.
void nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
        float* c, int64_t ldc);
void nt(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
        double* c, int64_t ldc);
// C[m×n] = alpha·A[m×k]·B[k×n]: element (i, j) is alpha·(Σ_p a(i, p)·b(p, j)), the sum from +0 in
// p order. nt(A, B) gives the bits of nn(A, Bᵀ).
void nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
        float* c, int64_t ldc);
void nn(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
        double* c, int64_t ldc);
// C[m×n] = alpha·A[m×k]·B[n×k]ᵀ as dot products (above): lane partial sums, then a lane-sum tree.
void dots(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc);
void dots(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
          double* c, int64_t ldc);
// bt[p·ldt + j] = b[j·ldb + p] for j < n, p < k: n rows of k into k rows of n.
void transpose(int64_t n, int64_t k, const float* b, int64_t ldb, float* bt, int64_t ldt);
void transpose(int64_t n, int64_t k, const double* b, int64_t ldb, double* bt, int64_t ldt);
// C[m×n] += A[m×k]·B[k×n].
void add_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
            int64_t ldc);
void add_nn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
            int64_t ldc);
// C[m×n] += Aᵀ·B, A [k×m], B [k×n].
void add_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
            int64_t ldc);
void add_tn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
            int64_t ldc);

// C[m×n] += Aᵀ·B where C's rows 4b … 4b + 3 take only the steps p ∈ [k_lo[b], k_hi[b]) (none
// where k_hi[b] ≤ k_lo[b]): for A zero outside those steps, the same sums without the
// multiply-adds by its zeros. On a walk tile C's rows are the tile's keys and the steps its query
// rows, each key seen by a staggered run of them (dK += dSᵀ·Q, dV += Pᵀ·dO on a band tile of 16
// rows and l + 15 keys: at l = 32 a third of the full tile's terms are zeros).
void add_tn_ranges(int64_t m, int64_t n, const int64_t* k_lo, const int64_t* k_hi, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc);
void add_tn_ranges(int64_t m, int64_t n, const int64_t* k_lo, const int64_t* k_hi, const double* a, int64_t lda,
                   const double* b, int64_t ldb, double* c, int64_t ldc);
constexpr int64_t kRangeRows = 4;  // C rows per k range of add_tn_ranges

}  // namespace qkv::attn::tile
