// Internal to attention/: the tile products of the fused CPU kernels, written by hand.
//
//   nt:     S  = alpha·A·Bᵀ   (S = s·Q·Kᵀ, dP = dO·Vᵀ)      dot products along D
//   add_nn: C += A·B          (O += P·V, dQ += dS·K)          outer products
//   add_tn: C += Aᵀ·B         (dV += Pᵀ·dO, dK += dSᵀ·Q)      outer products
//
// Why not BLAS: the tiles are small (64×64×D for full attention; 8 rows by up to 256 keys for the
// strided walk, whose backward has two products only 8 deep), and BLAS packs both operands on
// every call and tunes for large products. OpenBLAS 0.3.21 picks its SSE3 (Prescott) kernels on
// this project's machines; the products here run 3-4× faster than those, and a strided tile of 8
// rows costs about what a full one does per logit, where OpenBLAS's kernels lost 1.7-2.5× on it.
// Each output is a block held in registers (R rows × two vectors of columns for the outer
// products, two rows × W/2 keys of W-lane partial sums for the dot products), written with GCC's
// vector extensions so the compiler emits the host's 256-bit FMA code (or pairs of SSE halves).
//
// Every element takes one path whatever its position in the tile, its sum in a fixed order, so
// results do not depend on the tile's row count or offset (KV-cache decoding reproduces the
// parallel forward bitwise) nor on which BLAS is linked or which kernel it picks.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace qkv::attn::tile {

template <class T>
struct Lanes {
  static constexpr int64_t width = 32 / sizeof(T);  // one 256-bit vector: AVX2, or two SSE halves
  typedef T vec __attribute__((vector_size(32)));
};

template <class V, class T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// C's block of R rows × NV vectors of columns += A·B over k steps, with a(i, p) = a[i·a_rs + p·a_ks]
// (A itself, or Aᵀ) and b(p, j) = b[p·ldb + j]. Each element is c + Σ_p a·b added in p order.
template <class T, int R, int NV>
inline void micro_tile(int64_t k, const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t ldb, T* c, int64_t ldc) {
  using V = typename Lanes<T>::vec;
  constexpr int64_t W = Lanes<T>::width;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load<V>(c + r * ldc + v * W);
  for (int64_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load<V>(b + p * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const T x = a[r * a_rs + p * a_ks];
      for (int v = 0; v < NV; ++v) acc[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * W, acc[r][v]);
}

template <class T, int NV>
inline void column_block(int64_t m, int64_t k, const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t ldb, T* c,
                         int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) micro_tile<T, 4, NV>(k, a + i * a_rs, a_rs, a_ks, b, ldb, c + i * ldc, ldc);
  for (; i < m; ++i) micro_tile<T, 1, NV>(k, a + i * a_rs, a_rs, a_ks, b, ldb, c + i * ldc, ldc);
}

// C[m×n] += A·B, A read through (a_rs, a_ks), B and C row-major. Columns go in blocks of two
// vectors (then one, then one at a time: which path a column takes depends on n alone), each block
// over all rows, so the block's slice of B stays in L1 while the rows pass over it.
template <class T>
void add_product(int64_t m, int64_t n, int64_t k, const T* a, int64_t a_rs, int64_t a_ks, const T* b, int64_t ldb, T* c,
                 int64_t ldc) {
  constexpr int64_t W = Lanes<T>::width;
  const int64_t n2 = n / (2 * W) * (2 * W), n1 = n / W * W;  // n1 − n2 is 0 or W
  for (int64_t j = 0; j < n2; j += 2 * W) column_block<T, 2>(m, k, a, a_rs, a_ks, b + j, ldb, c + j, ldc);
  if (n1 > n2) column_block<T, 1>(m, k, a, a_rs, a_ks, b + n2, ldb, c + n2, ldc);
  for (int64_t j = n1; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      T acc = c[i * ldc + j];
      for (int64_t p = 0; p < k; ++p) acc += a[i * a_rs + p * a_ks] * b[p * ldb + j];
      c[i * ldc + j] = acc;
    }
}

// C[m×n] += A[m×k]·B[k×n].
template <class T>
void add_nn(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  add_product(m, n, k, a, lda, int64_t(1), b, ldb, c, ldc);
}

// C[m×n] += Aᵀ·B, A [k×m], B [k×n].
template <class T>
void add_tn(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  add_product(m, n, k, a, int64_t(1), lda, b, ldb, c, ldc);
}

// Lane i of the result is the sum of the lanes of a[i], always added in the same tree
// ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)) (four lanes: (x0 + x2) + (x1 + x3)).
inline Lanes<float>::vec sum_each(const Lanes<float>::vec* a) {
  using V = Lanes<float>::vec;
  const auto halves = [](V x, V y) {  // [x_i + x_{i+4} | y_i + y_{i+4}]
    return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
  };
  const auto quarters = [](V x, V y) {  // [x_0+x_2, x_1+x_3, y_0+y_2, y_1+y_3 | the same of lanes 4-7]
    return __builtin_shufflevector(x, y, 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(x, y, 2, 3, 10, 11, 6, 7, 14, 15);
  };
  const auto pairs = [](V x, V y) {  // [x_0+x_1, y_0+y_1, x_2+x_3, y_2+y_3, …]
    return __builtin_shufflevector(x, y, 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(x, y, 1, 9, 3, 11, 5, 13, 7, 15);
  };
  return pairs(quarters(halves(a[0], a[4]), halves(a[2], a[6])), quarters(halves(a[1], a[5]), halves(a[3], a[7])));
}
inline Lanes<double>::vec sum_each(const Lanes<double>::vec* a) {
  using V = Lanes<double>::vec;
  const auto halves = [](V x, V y) {  // [x_0+x_2, x_1+x_3, y_0+y_2, y_1+y_3]
    return __builtin_shufflevector(x, y, 0, 1, 4, 5) + __builtin_shufflevector(x, y, 2, 3, 6, 7);
  };
  const auto pairs = [](V x, V y) {  // [x_0+x_1, y_0+y_1, x_2+x_3, y_2+y_3]
    return __builtin_shufflevector(x, y, 0, 4, 2, 6) + __builtin_shufflevector(x, y, 1, 5, 3, 7);
  };
  return pairs(halves(a[0], a[2]), halves(a[1], a[3]));
}

// C[m×n] = alpha·A[m×k]·B[n×k]ᵀ as dot products along k, two rows of A by W/2 rows of B at a
// time (W accumulators, each a vector of partial sums, then one sum_each). Neither operand is
// packed: on 8-row tiles, transposing B would cost a copy of B for every 8 rows of work. Edge
// rows and keys reuse the last valid one (computed, not stored), so every element takes the same
// path.
template <class T>
void nt(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  using V = typename Lanes<T>::vec;
  constexpr int64_t W = Lanes<T>::width, KC = W / 2;
  const int64_t kv = k / W * W;
  for (int64_t i = 0; i < m; i += 2) {
    const T* a0 = a + i * lda;
    const T* a1 = i + 1 < m ? a0 + lda : a0;
    for (int64_t j = 0; j < n; j += KC) {
      const T* br[KC];
      for (int64_t t = 0; t < KC; ++t) br[t] = b + std::min(j + t, n - 1) * ldb;
      V acc[W] = {};
      for (int64_t p = 0; p < kv; p += W) {
        const V x0 = load<V>(a0 + p), x1 = load<V>(a1 + p);
        for (int64_t t = 0; t < KC; ++t) {
          const V y = load<V>(br[t] + p);
          acc[t] += x0 * y;
          acc[KC + t] += x1 * y;
        }
      }
      V sum = sum_each(acc);
      for (int64_t p = kv; p < k; ++p)
        for (int64_t t = 0; t < KC; ++t) {
          sum[t] += a0[p] * br[t][p];
          sum[KC + t] += a1[p] * br[t][p];
        }
      const int64_t cols = std::min(KC, n - j);
      for (int64_t t = 0; t < cols; ++t) c[i * ldc + j + t] = alpha * sum[t];
      if (i + 1 < m)
        for (int64_t t = 0; t < cols; ++t) c[(i + 1) * ldc + j + t] = alpha * sum[KC + t];
    }
  }
}

}  // namespace qkv::attn::tile
