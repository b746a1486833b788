// Internal to attention/: the per-tile arithmetic of the fused kernels. GEMMs on tiles go to BLAS
// (inside the kernels' OpenMP region the OpenMP build of OpenBLAS runs single-threaded, so each
// thread multiplies its own tiles); the row loops below are branch-free so -O3 -march=native turns
// them into vector code.
#pragma once
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace qkv::attn::tile {

// C[m x n] = alpha · op(A) · op(B) + beta · C, row-major.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// exp for float32 without a libm call, so the row loops vectorise: exp(x) = 2^n · e^r with
// n = round(x·log2 e) and r = x − n·ln 2 in [−ln2/2, ln2/2], e^r by a degree-7 polynomial
// (Cephes' expf coefficients, ~1 ulp). x <= −87.5 (including −inf, a masked logit) gives exactly 0.
inline float exp_fast(float x) {
  const bool under = x < -87.5f;
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.5f ? -87.5f : x;
  // Round to nearest by adding and removing 1.5·2^23 (no libm call, so the loop vectorises).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return under ? 0.0f : p * scale;
}
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

// x[c] = exp(x[c] - shift); returns the sum (shift finite).
template <class T>
T exp_shift_sum(T* x, int64_t n, T shift) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) {
    const T e = exp_fast(x[c] - shift);
    x[c] = e;
    s += e;
  }
  return s;
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
