// Internal to attention/: the per-row arithmetic of the fused kernels, and the GEMM the
// linear-attention kernels use for their larger products (float32 through the dispatch point of
// tensor/cpu/gemm/gemm.h, float64 on the BLAS; inside the kernels' OpenMP region both run
// single-threaded, so each thread multiplies its own blocks). The
// softmax kernels' tile products are hand-written (tile_products.h). The row loops below are
// branch-free so -O3 -march=native turns them into vector code.
#pragma once
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/cpu/fast_exp.h"
#include "tensor/cpu/gemm/gemm.h"

namespace qkv::attn::tile {

// C[m x n] = alpha · op(A) · op(B) + beta · C, row-major.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cpu::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// exp for float32 without a libm call, so the row loops vectorise (see tensor/cpu/fast_exp.h).
// A masked logit (-inf, also after subtracting a finite row max) gives exactly 0.
inline float exp_fast(float x) { return cpu::fast_exp(x); }
inline double exp_fast(double x) { return std::exp(x); }

// Reductions carry `omp simd` so the compiler may reorder them into vector lanes (plain loops
// keep IEEE left-to-right order and stay scalar). The order is fixed per n, so results are
// still reproducible run to run.
template <class T>
T row_max(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < n; ++c) m = x[c] > m ? x[c] : m;
  return m;
}

// Σ_c x[c]·y[c]. As a plain loop it was one chain of dependent adds per row: for the sparse
// patterns' backward, which computes it for every row (Di = dO·O) but only ~100 logits per row,
// that chain cost about 1 % of the step.
template <class T>
T row_dot(const T* x, const T* y, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
  return s;
}

// x[c] = exp(x[c] - shift); returns the sum (shift finite), in an order fixed by the columns' key
// indices alone: column c (key first_key + c) is added to lane (first_key + c) mod 8, each lane in
// key order, then the lanes as ((0+1)+(2+3))+((4+5)+(6+7)). A masked column adds exp(-inf) = +0,
// which changes no lane. So a row's sum over a tile is the same whether the tile starts at its
// first visible key or earlier, and stops at its last visible key (decoding, a short chunk) or
// runs on over masked keys (the same row inside a training forward's 64-row block).
// (`omp simd reduction` would let the compiler split a tail of n mod 8 columns off differently.)
template <class T>
T exp_shift_sum(T* x, int64_t n, T shift, int64_t first_key = 0) {
  constexpr int64_t L = 8;
  T lane[L] = {};
  auto add = [&](int64_t c, int64_t l) {
    const T e = exp_fast(x[c] - shift);
    x[c] = e;
    lane[l] += e;
  };
  const int64_t off = first_key & (L - 1);
  int64_t c = 0;
  for (; c < n && ((off + c) & (L - 1)) != 0; ++c) add(c, (off + c) & (L - 1));
  for (; c + L <= n; c += L)
    for (int64_t j = 0; j < L; ++j) add(c + j, j);
  for (int64_t j = 0; c + j < n; ++j) add(c + j, j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// x[c] = exp(x[c] - shift) (shift finite).
template <class T>
void exp_shift(T* x, int64_t n, T shift) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) x[c] = exp_fast(x[c] - shift);
}

template <class T>
void scale_row(T* x, int64_t n, T s) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) x[c] *= s;
}

}  // namespace qkv::attn::tile
