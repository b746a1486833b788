// The fused attention kernels' tile products (tile_products.h says what and why). Compiled on its
// own so that, on a host with AVX-512, it alone gets 512-bit vectors (CMakeLists.txt): the rest of
// the project stays on AVX2 (see the -mno-avx512f note there); the tests check these products
// against a long double loop at every edge of their blocking, whichever width was built.
#include "attention/cpu/tile_products.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__FMA__)
#include <immintrin.h>
#endif

namespace qkv::attn::tile {

namespace {

// One vector: 512 bits where this file is compiled for AVX-512 (CMakeLists.txt adds -mavx512f
// for it on hosts that have it), else 256 (AVX2, or two SSE halves).
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif

template <class T, int Bytes = kVectorBytes>
struct Lanes {
  static constexpr int64_t width = Bytes / sizeof(T);
  typedef T vec __attribute__((vector_size(Bytes)));
};

template <class V, class T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
// The first `count` (< one vector) elements at p, the other lanes zero.
template <class V, class T>
inline V load_head(const T* p, int64_t count) {
  V v{};
  std::memcpy(&v, p, static_cast<size_t>(count) * sizeof(T));
  return v;
}
template <class V, class T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// acc + x·y, rounded once where the host has FMA, else twice (this file is compiled with
// -ffp-contract=off, CMakeLists.txt). Spelt out rather than left to the compiler's contraction of
// `acc += x * y`: g++ tuned for AMD Zen (what -march=native picks there) leaves some accumulation
// chains unfused on purpose (its avoid_fma_chains tunings) and fuses others, so one element computed
// under two blockings (in a tile, or its row alone at decode) rounded differently there.
#if defined(__FMA__)
inline float fmadd(float acc, float x, float y) { return __builtin_fmaf(x, y, acc); }
inline double fmadd(double acc, double x, double y) { return __builtin_fma(x, y, acc); }
template <class V>
inline V fmadd(V acc, V x, V y) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(acc[0])>>;
  constexpr bool f32 = std::is_same_v<T, float>;
  if constexpr (sizeof(V) == 32 && f32) return (V)_mm256_fmadd_ps((__m256)x, (__m256)y, (__m256)acc);
  else if constexpr (sizeof(V) == 32) return (V)_mm256_fmadd_pd((__m256d)x, (__m256d)y, (__m256d)acc);
#if defined(__AVX512F__)
  else if constexpr (sizeof(V) == 64 && f32) return (V)_mm512_fmadd_ps((__m512)x, (__m512)y, (__m512)acc);
  else if constexpr (sizeof(V) == 64) return (V)_mm512_fmadd_pd((__m512d)x, (__m512d)y, (__m512d)acc);
#endif
  else static_assert(sizeof(V) == 0, "fmadd: no FMA instruction for this vector width");
}
// acc + x·y with x one scalar for every lane.
template <class V, class T>
inline V fmadd_scalar(V acc, T x, V y) {
  constexpr bool f32 = std::is_same_v<T, float>;
  if constexpr (sizeof(V) == 32 && f32) return fmadd(acc, (V)_mm256_set1_ps(x), y);
  else if constexpr (sizeof(V) == 32) return fmadd(acc, (V)_mm256_set1_pd(x), y);
#if defined(__AVX512F__)
  else if constexpr (sizeof(V) == 64 && f32) return fmadd(acc, (V)_mm512_set1_ps(x), y);
  else if constexpr (sizeof(V) == 64) return fmadd(acc, (V)_mm512_set1_pd(x), y);
#endif
  else static_assert(sizeof(V) == 0, "fmadd_scalar: no FMA instruction for this vector width");
}
#else
template <class V>
inline V fmadd(V acc, V x, V y) {
  return acc + x * y;
}
template <class V, class T>
inline V fmadd_scalar(V acc, T x, V y) {
  return acc + x * y;
}
#endif

// v, which the compiler must now hold in a vector register. Each product loads a B vector once per
// step and uses it for R rows. g++ (seen with -march=native on an AMD EPYC, znver3 tuning) instead
// folds the load into every FMA that uses it, which makes the products bound by loads at about half
// the FMA units' rate (docs/perf.md, "Attention tiles").
template <class V>
inline V in_register(V v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v));
#endif
  return v;
}

// A's element (i, p): a[i·lda + p], or with kTransA (A stored transposed) a[i + p·lda]. A template
// choice rather than two runtime strides, so each layout has one loop (g++ otherwise versions the
// micro-tile's loop on whether a stride is 1).
template <bool kTransA, class T>
inline const T& a_at(const T* a, int64_t lda, int64_t i, int64_t p) {
  return kTransA ? a[i + p * lda] : a[i * lda + p];
}

// C's block of R rows × NV vectors of columns += A·B over k ≥ 1 steps, b(p, j) = b[p·ldb + j].
// Each element is c + Σ_p a·b added in p order; with kAssign it is alpha·(Σ_p a·b), the sum
// started from +0 and C not read. The loop runs at least once by construction: where
// it could run no step, g++ kept the accumulators in stack memory for the path that skips it, a
// store and a load of every one of them per call on top of C's own. It weighs most on short products:
// the strided walk's backward, whose add_tn calls take 8 steps (a band tile's rows), spent 16 % less
// time in these products without it (full attention's 64-step tiles: 7 %).
template <class T, int R, int NV, bool kTransA, bool kAssign = false>
inline void micro_tile(int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc, T alpha = T(1)) {
  using V = typename Lanes<T>::vec;
  constexpr int64_t W = Lanes<T>::width;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kAssign ? V{} : load<V>(c + r * ldc + v * W);
  int64_t p = 0;
  do {  // k ≥ 1 (above)
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = in_register(load<V>(b + p * ldb + v * W));
    for (int r = 0; r < R; ++r) {
      const T x = a_at<kTransA>(a, lda, r, p);
      for (int v = 0; v < NV; ++v) acc[r][v] = fmadd_scalar(acc[r][v], x, bv[v]);
    }
  } while (++p < k);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * W, kAssign ? acc[r][v] * alpha : acc[r][v]);
}

// The last 1-3 rows of a column block as one micro-tile: the walk's tiles end on them often (the
// band's 71 keys, a residue group's 7, 15, … 63), and row by row each B vector loaded would feed
// only NV FMAs. rows 0 does nothing.
template <class T, int NV, bool kTransA, bool kAssign = false>
inline void micro_tile_tail(int64_t rows, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
                            int64_t ldc, T alpha = T(1)) {
  switch (rows) {
    case 3:
      micro_tile<T, 3, NV, kTransA, kAssign>(k, a, lda, b, ldb, c, ldc, alpha);
      break;
    case 2:
      micro_tile<T, 2, NV, kTransA, kAssign>(k, a, lda, b, ldb, c, ldc, alpha);
      break;
    case 1:
      micro_tile<T, 1, NV, kTransA, kAssign>(k, a, lda, b, ldb, c, ldc, alpha);
      break;
    default:
      break;
  }
}

template <class T, int NV, bool kTransA, bool kAssign>
inline void column_block(int64_t m, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
                         T alpha) {
  int64_t i = 0;
  // 6-row micro-tiles while at least 10 rows (or exactly 6) are left, then 4-row ones: a 32-row
  // block runs 6, 6, 6, 6, 4, 4. Twelve accumulators keep both FMA units busy through the FMA's
  // latency with a B vector load per six multiply-adds; with fewer rows left the 4-row tiles avoid
  // a thin tail. Every element's chain is the same whichever tile computes it.
  if constexpr (NV == 2)
    for (; m - i >= 10 || m - i == 6; i += 6)
      micro_tile<T, 6, NV, kTransA, kAssign>(k, &a_at<kTransA>(a, lda, i, 0), lda, b, ldb, c + i * ldc, ldc, alpha);
  for (; i + 4 <= m; i += 4)
    micro_tile<T, 4, NV, kTransA, kAssign>(k, &a_at<kTransA>(a, lda, i, 0), lda, b, ldb, c + i * ldc, ldc, alpha);
  micro_tile_tail<T, NV, kTransA, kAssign>(m - i, k, &a_at<kTransA>(a, lda, i, 0), lda, b, ldb, c + i * ldc, ldc,
                                           alpha);
}

// C[m×n] += A·B, or with kAssign C = alpha·A·B (each sum from +0), A read through a_at, B and C
// row-major. Columns go in blocks of two vectors (then one, then one at a time: which path a
// column takes depends on n alone), each block over all rows, so the block's slice of B stays in
// L1 while the rows pass over it. Every path adds the same terms in the same order, one fused
// multiply-add each, so an element's bits depend on neither the path nor the vector width.
template <class T, bool kTransA, bool kAssign = false>
void product(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc,
             T alpha = T(1)) {
  if (k <= 0) {
    if constexpr (kAssign)
      for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, alpha * T(0));
    return;
  }
  constexpr int64_t W = Lanes<T>::width;
  const int64_t n2 = n / (2 * W) * (2 * W), n1 = n / W * W;  // n1 − n2 is 0 or W
  for (int64_t j = 0; j < n2; j += 2 * W)
    column_block<T, 2, kTransA, kAssign>(m, k, a, lda, b + j, ldb, c + j, ldc, alpha);
  if (n1 > n2) column_block<T, 1, kTransA, kAssign>(m, k, a, lda, b + n2, ldb, c + n2, ldc, alpha);
  for (int64_t j = n1; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      T acc = kAssign ? T(0) : c[i * ldc + j];
      for (int64_t p = 0; p < k; ++p) acc = fmadd(acc, a_at<kTransA>(a, lda, i, p), b[p * ldb + j]);
      c[i * ldc + j] = kAssign ? acc * alpha : acc;
    }
}

// product's column blocks with each 4-row block of C on its own range of steps (add_tn_ranges):
// the same micro-tiles, started at the range's first step.
template <class T, int NV>
void column_block_ranges(int64_t m, const int64_t* lo, const int64_t* hi, const T* a, int64_t lda, const T* b,
                         int64_t ldb, T* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const int64_t p0 = lo[i / 4], k = hi[i / 4] - p0;
    if (k > 0) micro_tile<T, 4, NV, true>(k, a + i + p0 * lda, lda, b + p0 * ldb, ldb, c + i * ldc, ldc);
  }
  if (i == m) return;
  const int64_t p0 = lo[i / 4], k = hi[i / 4] - p0;
  if (k > 0) micro_tile_tail<T, NV, true>(m - i, k, a + i + p0 * lda, lda, b + p0 * ldb, ldb, c + i * ldc, ldc);
}

template <class T>
void add_tn_ranges_impl(int64_t m, int64_t n, const int64_t* lo, const int64_t* hi, const T* a, int64_t lda, const T* b,
                        int64_t ldb, T* c, int64_t ldc) {
  static_assert(kRangeRows == 4, "the ranges are per micro-tile of 4 rows");
  constexpr int64_t W = Lanes<T>::width;
  const int64_t n2 = n / (2 * W) * (2 * W), n1 = n / W * W;
  for (int64_t j = 0; j < n2; j += 2 * W) column_block_ranges<T, 2>(m, lo, hi, a, lda, b + j, ldb, c + j, ldc);
  if (n1 > n2) column_block_ranges<T, 1>(m, lo, hi, a, lda, b + n2, ldb, c + n2, ldc);
  for (int64_t j = n1; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      T acc = c[i * ldc + j];
      for (int64_t p = lo[i / 4]; p < hi[i / 4]; ++p) acc = fmadd(acc, a[i + p * lda], b[p * ldb + j]);
      c[i * ldc + j] = acc;
    }
}

template <class T>
void add_nn_impl(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  product<T, false>(m, n, k, a, lda, b, ldb, c, ldc);
}

template <class T>
void add_tn_impl(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  product<T, true>(m, n, k, a, lda, b, ldb, c, ldc);
}

// One level of the lane-sum tree, on groups of G lanes: the first G/2 lanes of each group of the
// result hold x's group folded in half (x[o + t] + x[o + t + G/2]), the last G/2 hold y's.
constexpr int fold_source(int lane, int w, int g, int second_half) {
  const int o = lane / g * g, t = lane % g;
  return (t < g / 2 ? o + t : w + o + t - g / 2) + second_half * (g / 2);
}
template <class V, int W, int G, int... L>
V fold(V x, V y, std::integer_sequence<int, L...>) {
  return __builtin_shufflevector(x, y, fold_source(L, W, G, 0)...) +
         __builtin_shufflevector(x, y, fold_source(L, W, G, 1)...);
}
template <class V, int W, int G>
void fold_level(V* a, int count) {
  const int half = count / 2;
  for (int i = 0; i < half; ++i) a[i] = fold<V, W, G>(a[i], a[i + half], std::make_integer_sequence<int, W>{});
  if constexpr (G > 2) fold_level<V, W, G / 2>(a, half);
}

// Lane i of the result is the sum of the lanes of a[i] (W vectors), always added in the same
// tree: lanes t and t + W/2 first, then t and t + W/4 of those, down to pairs.
template <class T, int Bytes>
typename Lanes<T, Bytes>::vec sum_each(const typename Lanes<T, Bytes>::vec* a) {
  using V = typename Lanes<T, Bytes>::vec;
  constexpr int W = static_cast<int>(Lanes<T, Bytes>::width);
  V t[W];
  for (int i = 0; i < W; ++i) t[i] = a[i];
  fold_level<V, W, W>(t, W);
  return t[0];
}

// The dot products stay on 256-bit vectors under AVX-512 too: at D = 64 a 16-lane dot has 4 steps
// to its 4-level lane-sum tree and a block fits one row pair, not two; measured alone (32×32×64)
// it was no faster, 49-60 GFLOP/s against 55-60 at 8 lanes.
constexpr int kDotBytes = 32;

// Row pairs per block of the dot products: two where the vector register file has 32 entries
// (AVX-512 encodings reach ymm16-31), so 2 × W accumulators, the A rows and a B row fit; one with
// 16 registers.
#if defined(__AVX512F__)
constexpr int kDotRowPairs = 2;
#else
constexpr int kDotRowPairs = 1;
#endif

// C[m×n] = alpha·A[m×k]·B[n×k]ᵀ as dot products along k (tile::dots): 2·kDotRowPairs rows of A by
// W/2 rows of B at a time (W accumulators per row pair, each a vector of partial sums, then one
// sum_each per pair). Neither operand is packed: on 8-row tiles, transposing B would cost a copy
// of B for every 8 rows of work. Edge rows and keys reuse the last valid one (computed, not
// stored), so every element takes the same path.
template <class T, bool kTail>
void nt_blocks(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
               int64_t ldc) {
  using V = typename Lanes<T, kDotBytes>::vec;
  constexpr int64_t W = Lanes<T, kDotBytes>::width, KC = W / 2, RB = 2 * kDotRowPairs;
  const int64_t kv = k / W * W;
  for (int64_t i = 0; i < m; i += RB) {
    const T* ar[RB];
    for (int64_t r = 0; r < RB; ++r) ar[r] = a + std::min(i + r, m - 1) * lda;
    for (int64_t j = 0; j < n; j += KC) {
      const T* br[KC];
      for (int64_t t = 0; t < KC; ++t) br[t] = b + std::min(j + t, n - 1) * ldb;
      V acc[kDotRowPairs][W];
      for (int64_t q = 0; q < kDotRowPairs; ++q)  // not `= {}`: g++ zeroes an array with `rep stos`
        for (int64_t t = 0; t < W; ++t) acc[q][t] = V{};
      for (int64_t p = 0; p < kv; p += W) {
        V x[RB];
        for (int64_t r = 0; r < RB; ++r) x[r] = in_register(load<V>(ar[r] + p));
        for (int64_t t = 0; t < KC; ++t) {
          const V y = in_register(load<V>(br[t] + p));
          for (int64_t q = 0; q < kDotRowPairs; ++q) {
            acc[q][t] = fmadd(acc[q][t], x[2 * q], y);
            acc[q][KC + t] = fmadd(acc[q][KC + t], x[2 * q + 1], y);
          }
        }
      }
      if constexpr (kTail) {  // the last k − kv steps as one more vector step, zero-padded
        V x[RB];
        for (int64_t r = 0; r < RB; ++r) x[r] = load_head<V>(ar[r] + kv, k - kv);
        for (int64_t t = 0; t < KC; ++t) {
          const V y = load_head<V>(br[t] + kv, k - kv);
          for (int64_t q = 0; q < kDotRowPairs; ++q) {
            acc[q][t] = fmadd(acc[q][t], x[2 * q], y);
            acc[q][KC + t] = fmadd(acc[q][KC + t], x[2 * q + 1], y);
          }
        }
      }
      const int64_t cols = std::min(KC, n - j);
      for (int64_t q = 0; q < kDotRowPairs; ++q) {
        const V sum = sum_each<T, kDotBytes>(acc[q]);
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t row = i + 2 * q + h;
          if (row >= m) break;
          for (int64_t t = 0; t < cols; ++t) c[row * ldc + j + t] = alpha * sum[h * KC + t];
        }
      }
    }
  }
}

// The tail step is a template choice so the accumulators stay in registers through the main loop.
template <class T>
void dots_impl(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
               int64_t ldc) {
  if (k % Lanes<T, kDotBytes>::width) nt_blocks<T, true>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  else nt_blocks<T, false>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

// bt[p·ldt + j] = b[j·ldb + p] for j < n, p < k: float in 8 × 8 blocks through registers, the
// edges one element at a time.
template <class T>
void transpose_impl(int64_t n, int64_t k, const T* b, int64_t ldb, T* bt, int64_t ldt) {
  int64_t j0 = 0;
  if constexpr (std::is_same_v<T, float>) {
    typedef float v8 __attribute__((vector_size(32)));
    for (; j0 + 8 <= n; j0 += 8) {
      int64_t p0 = 0;
      for (; p0 + 8 <= k; p0 += 8) {
        v8 r[8], t[8], u[8];
        for (int i = 0; i < 8; ++i) r[i] = load<v8>(b + (j0 + i) * ldb + p0);
        for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
          t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
          t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
        }
        for (int i = 0; i < 8; i += 4)  // then pairs of those: four rows' elements side by side
          for (int h = 0; h < 2; ++h) {
            u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
          }
        for (int c = 0; c < 4; ++c) {  // u[c] and u[c + 4] hold columns c and c + 4 of rows 0-3 and 4-7
          store(bt + (p0 + c) * ldt + j0, __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11));
          store(bt + (p0 + c + 4) * ldt + j0, __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15));
        }
      }
      for (int64_t p = p0; p < k; ++p)
        for (int64_t j = j0; j < j0 + 8; ++j) bt[p * ldt + j] = b[j * ldb + p];
    }
  }
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = j0; j < n; ++j) bt[p * ldt + j] = b[j * ldb + p];
}

// The transposed copy's row stride for n columns: whole vectors, plus one so that its k rows do
// not fall on a few cache sets (a stride of a power of two times 256 bytes would).
int64_t transposed_stride(int64_t n) {
  constexpr int64_t W = 16;
  return (n + W - 1) / W * W + W / 2;
}

// C = alpha·A·Bᵀ: B transposed into this thread's buffer, then nn's products, so the same bits as
// nn on a transposed copy made by the caller.
template <class T>
void nt_impl(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
             int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  thread_local std::vector<T> bt;
  const int64_t ldt = transposed_stride(n);
  if (static_cast<int64_t>(bt.size()) < k * ldt) bt.resize(static_cast<size_t>(k * ldt));
  transpose_impl(n, k, b, ldb, bt.data(), ldt);
  product<T, false, true>(m, n, k, a, lda, bt.data(), ldt, c, ldc, alpha);
}

}  // namespace

void add_tn_ranges(int64_t m, int64_t n, const int64_t* k_lo, const int64_t* k_hi, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* c, int64_t ldc) {
  add_tn_ranges_impl(m, n, k_lo, k_hi, a, lda, b, ldb, c, ldc);
}
void add_tn_ranges(int64_t m, int64_t n, const int64_t* k_lo, const int64_t* k_hi, const double* a, int64_t lda,
                   const double* b, int64_t ldb, double* c, int64_t ldc) {
  add_tn_ranges_impl(m, n, k_lo, k_hi, a, lda, b, ldb, c, ldc);
}

void nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
        float* c, int64_t ldc) {
  nt_impl(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}
void nt(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
        double* c, int64_t ldc) {
  nt_impl(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}
void dots(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc) {
  dots_impl(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}
void dots(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
          double* c, int64_t ldc) {
  dots_impl(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}
void nn(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
        float* c, int64_t ldc) {
  product<float, false, true>(m, n, k, a, lda, b, ldb, c, ldc, alpha);
}
void nn(int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
        double* c, int64_t ldc) {
  product<double, false, true>(m, n, k, a, lda, b, ldb, c, ldc, alpha);
}
void transpose(int64_t n, int64_t k, const float* b, int64_t ldb, float* bt, int64_t ldt) {
  transpose_impl(n, k, b, ldb, bt, ldt);
}
void transpose(int64_t n, int64_t k, const double* b, int64_t ldb, double* bt, int64_t ldt) {
  transpose_impl(n, k, b, ldb, bt, ldt);
}
void add_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
            int64_t ldc) {
  add_nn_impl(m, n, k, a, lda, b, ldb, c, ldc);
}
void add_nn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
            int64_t ldc) {
  add_nn_impl(m, n, k, a, lda, b, ldb, c, ldc);
}
void add_tn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
            int64_t ldc) {
  add_tn_impl(m, n, k, a, lda, b, ldb, c, ldc);
}
void add_tn(int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b, int64_t ldb, double* c,
            int64_t ldc) {
  add_tn_impl(m, n, k, a, lda, b, ldb, c, ldc);
}

}  // namespace qkv::attn::tile
