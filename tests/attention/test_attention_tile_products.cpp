// The fused kernels' hand-written tile products (attention/cpu/tile_products.h) against a long double
// loop written here, over every edge of their blocking: rows not a multiple of the 2- or 4-row
// blocks, keys not a multiple of W/2, columns not a multiple of a vector, depths not a multiple of
// W, strided operands. Plus what the kernels rely on: nothing outside C's m × n is written, and an
// element's value does not depend on where in the tile it sits (bitwise).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/cpu/tile_products.h"

using namespace qkv::attn;

namespace {

constexpr float kGuard = 12345.0f;  // written around C; must survive every product
constexpr float kStart = 0.5f;      // C's m × n block before an accumulating product

template <class T>
struct Operands {
  int64_t m, n, k, lda, ldb, ldc;
  std::vector<T> a, b, c;
};

// a: m rows of k (stride lda); b: rows of k or n (stride ldb); c: m × n at stride ldc, with guard
// values in the padding and beyond (accumulating products set the block itself: start_block).
template <class T>
Operands<T> make_operands(int64_t m, int64_t n, int64_t k, int64_t b_rows, int64_t b_cols, uint32_t seed) {
  Operands<T> o{m, n, k, k + 3, b_cols + 5, n + 7, {}, {}, {}};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  o.a.resize(static_cast<size_t>(std::max<int64_t>(m, k) * o.lda));
  o.b.resize(static_cast<size_t>(b_rows * o.ldb));
  o.c.assign(static_cast<size_t>((std::max<int64_t>(m, k) + 1) * o.ldc), T(kGuard));
  for (T& x : o.a) x = static_cast<T>(u(gen));
  for (T& x : o.b) x = static_cast<T>(u(gen));
  return o;
}

template <class T>
void start_block(Operands<T>& o) {
  for (int64_t i = 0; i < o.m; ++i) std::fill_n(o.c.data() + i * o.ldc, o.n, T(kStart));
}

// |got − want| ≤ tol·Σ|a·b| for every element of the m × n block; every other element of c is
// still the guard (or, for the accumulating products, its start value).
template <class T>
void check_block(const std::vector<T>& c, int64_t m, int64_t n, int64_t ldc, const std::vector<long double>& want,
                 const std::vector<long double>& mag, double tol, const std::string& what) {
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const long double e = std::fabs(static_cast<long double>(c[i * ldc + j]) - want[i * n + j]);
      worst = std::max(worst, static_cast<double>(e / (mag[i * n + j] + 1e-30L)));
    }
  INFO(what << ": worst error " << worst << " of the sum of |a·b|");
  CHECK(worst <= tol);
  int64_t touched = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(c.size()); ++e) {
    const int64_t i = e / ldc, j = e % ldc;
    if (i < m && j < n) continue;
    touched += c[e] != T(kGuard) ? 1 : 0;
  }
  CHECK(touched == 0);
}

// The accumulating products' check: C's block, started at kStart, against kStart + Σ_p a(i, p)·b(p, j)
// in long double, with a(i, p) = a[i·a_rs + p·a_ks].
template <class T>
void check_accumulated(const Operands<T>& o, int64_t a_rs, int64_t a_ks, double tol, const std::string& what) {
  const int64_t m = o.m, n = o.n, k = o.k;
  std::vector<long double> want(m * n), mag(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      long double s = kStart, g = kStart;
      for (int64_t p = 0; p < k; ++p) {
        const long double x = static_cast<long double>(o.a[i * a_rs + p * a_ks]) * o.b[p * o.ldb + j];
        s += x;
        g += std::fabs(x);
      }
      want[i * n + j] = s;
      mag[i * n + j] = g;
    }
  check_block(o.c, m, n, o.ldc, want, mag, tol, what);
}

template <class T>
void check_all_shapes(double tol) {
  const std::string type = sizeof(T) == 4 ? "float" : "double";
  uint32_t seed = 1;
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 64})  // 4-row blocks, then a 1-, 2- or 3-row one
    for (int64_t n : {1, 3, 4, 7, 8, 9, 17, 64, 79})
      for (int64_t k : {1, 3, 8, 16, 67}) {
        const std::string shape =
            type + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
        for (const bool as_dots : {false, true}) {  // nt and dots: C = alpha·A·Bᵀ, B is n rows of k
          Operands<T> o = make_operands<T>(m, n, k, n, k, seed++);
          const T alpha = T(0.375);
          if (as_dots) tile::dots(m, n, k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, o.c.data(), o.ldc);
          else tile::nt(m, n, k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, o.c.data(), o.ldc);
          std::vector<long double> want(m * n), mag(m * n);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              long double s = 0, g = 0;
              for (int64_t p = 0; p < k; ++p) {
                const long double x = static_cast<long double>(o.a[i * o.lda + p]) * o.b[j * o.ldb + p];
                s += x;
                g += std::fabs(x);
              }
              want[i * n + j] = alpha * s;
              mag[i * n + j] = alpha * g;
            }
          check_block(o.c, m, n, o.ldc, want, mag, tol, (as_dots ? "dots " : "nt ") + shape);
        }
        {  // add_nn: C += A·B, A m × k, B k × n
          Operands<T> o = make_operands<T>(m, n, k, k, n, seed++);
          start_block(o);
          tile::add_nn(m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, o.c.data(), o.ldc);
          check_accumulated(o, o.lda, 1, tol, "add_nn " + shape);
        }
        {  // add_tn: C += Aᵀ·B, A k × m (stride lda), B k × n
          Operands<T> o = make_operands<T>(m, n, k, k, n, seed++);
          o.lda = m + 3;  // a holds max(m, k)·(k + 3) ≥ k·(m + 3) values
          start_block(o);
          tile::add_tn(m, n, k, o.a.data(), o.lda, o.b.data(), o.ldb, o.c.data(), o.ldc);
          check_accumulated(o, 1, o.lda, tol, "add_tn " + shape);
        }
      }
}

}  // namespace

TEST_CASE("tile products equal a long double loop at every edge of their blocking", "[attention][tile]") {
  // The error bound is relative to Σ|a·b| (cancellation-proof): a few ulps per step of k.
  check_all_shapes<float>(64 * 6e-8);
  check_all_shapes<double>(64 * 1.2e-16);
}

TEST_CASE("a tile product's element does not depend on where in the tile it sits (bitwise)",
          "[attention][tile][exact]") {
  // KV-cache decoding computes one query row against the same keys the parallel forward computes
  // in a 64-row tile; both must give the same bits. nt over (m rows, n keys) against every row and
  // every key alone and every sub-range; add_nn/add_tn against one row at a time.
  const int64_t m = 13, n = 37, k = 67;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> a(m * k), b(n * k), bt(k * n), whole(m * n), part(m * n);
  for (float& x : a) x = u(gen);
  for (float& x : b) x = u(gen);
  for (const bool as_dots : {true, false}) {  // nt last: `whole` feeds the products below
    const auto product = as_dots ? static_cast<void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t,
                                                        const float*, int64_t, float*, int64_t)>(&tile::dots)
                                 : static_cast<void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t,
                                                        const float*, int64_t, float*, int64_t)>(&tile::nt);
    product(m, n, k, 0.125f, a.data(), k, b.data(), k, whole.data(), n);
    for (int64_t i0 = 0; i0 < m; ++i0)
      for (int64_t j0 : {int64_t(0), int64_t(1), int64_t(3), int64_t(5), n - 1}) {
        const int64_t rows = std::min<int64_t>(1 + i0 % 3, m - i0), cols = n - j0;
        std::fill(part.begin(), part.end(), 0.0f);
        product(rows, cols, k, 0.125f, a.data() + i0 * k, k, b.data() + j0 * k, k, part.data(), n);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            INFO((as_dots ? "dots" : "nt")
                 << " row " << i0 + r << " key " << j0 + c << " from a tile at (" << i0 << ", " << j0 << ")");
            REQUIRE(std::memcmp(&part[r * n + c], &whole[(i0 + r) * n + j0 + c], sizeof(float)) == 0);
          }
      }
  }
  // add_nn: O (rows × 40) += P (rows × n) · V (n × 40); row by row must give the same bits. The
  // row counts end the 4-row blocks on a 1-, 2- and 3-row block.
  const int64_t dv = 40;
  std::vector<float> v(n * dv);
  for (float& x : v) x = u(gen);
  for (int64_t rows : {m, m - 2, m - 3}) {
    std::vector<float> o_whole(rows * dv, 0.5f), o_rows(rows * dv, 0.5f);
    tile::add_nn(rows, dv, n, whole.data(), n, v.data(), dv, o_whole.data(), dv);
    for (int64_t i = 0; i < rows; ++i)
      tile::add_nn(1, dv, n, whole.data() + i * n, n, v.data(), dv, o_rows.data() + i * dv, dv);
    INFO("add_nn over " << rows << " rows");
    CHECK(std::memcmp(o_whole.data(), o_rows.data(), o_whole.size() * sizeof(float)) == 0);
  }
  // add_tn: dV (keys × 40) += Pᵀ (keys × m) · dO (m × 40), all keys at once against one at a time.
  std::vector<float> dout(m * dv);
  for (float& x : dout) x = u(gen);
  for (int64_t keys : {n, n - 2, n - 3}) {
    std::vector<float> dv_whole(keys * dv, -0.25f), dv_keys(keys * dv, -0.25f);
    tile::add_tn(keys, dv, m, whole.data(), n, dout.data(), dv, dv_whole.data(), dv);
    for (int64_t j = 0; j < keys; ++j)
      tile::add_tn(1, dv, m, whole.data() + j, n, dout.data(), dv, dv_keys.data() + j * dv, dv);
    INFO("add_tn over " << keys << " keys");
    CHECK(std::memcmp(dv_whole.data(), dv_keys.data(), dv_whole.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("add_tn_ranges gives add_tn's bits where A is zero outside each 4-row block's range of steps",
          "[attention][tile][exact]") {
  // The strided walk's dK += dSᵀ·Q and dV += Pᵀ·dO take, for each block of 4 keys, only the query
  // rows that keep one of them; dS and P are zero on the others. Ranges here: empty (lo = hi, and
  // lo > hi), whole, a prefix, a suffix and an inner run; C rows ending on a 1-, 2- or 3-row block;
  // columns past the vector blocks.
  for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 37})
    for (int64_t n : {1, 7, 8, 17, 64, 79})
      for (int64_t k : {1, 3, 16, 31}) {
        const int64_t blocks = (m + tile::kRangeRows - 1) / tile::kRangeRows;
        std::vector<int64_t> lo(blocks), hi(blocks);
        for (int64_t b = 0; b < blocks; ++b) {
          switch ((b + m + n + k) % 6) {
            case 0:
              lo[b] = 0, hi[b] = k;
              break;
            case 1:
              lo[b] = k / 2, hi[b] = k / 2;
              break;
            case 2:
              lo[b] = 0, hi[b] = (k + 1) / 2;
              break;
            case 3:
              lo[b] = k / 3, hi[b] = k;
              break;
            case 4:
              lo[b] = k / 4, hi[b] = std::max<int64_t>(k / 4 + 1, 3 * k / 4);
              break;
            default:
              lo[b] = k, hi[b] = 0;
              break;
          }
        }
        // full: A zero outside the ranges, for add_tn; ranged: NaN there, which add_tn_ranges must
        // never read.
        Operands<float> full = make_operands<float>(m, n, k, k, n, static_cast<uint32_t>(m * 1000 + n * 10 + k));
        full.lda = m + 3;
        Operands<float> ranged = full;
        for (int64_t p = 0; p < k; ++p)
          for (int64_t i = 0; i < m; ++i) {
            const int64_t b = i / tile::kRangeRows;
            if (p >= lo[b] && p < hi[b]) continue;
            full.a[i + p * full.lda] = 0.0f;
            ranged.a[i + p * full.lda] = std::numeric_limits<float>::quiet_NaN();
          }
        start_block(full);
        start_block(ranged);
        tile::add_tn_ranges(m, n, lo.data(), hi.data(), ranged.a.data(), ranged.lda, ranged.b.data(), ranged.ldb,
                            ranged.c.data(), ranged.ldc);
        tile::add_tn(m, n, k, full.a.data(), full.lda, full.b.data(), full.ldb, full.c.data(), full.ldc);
        const std::string shape = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
        INFO("add_tn_ranges " << shape);
        CHECK(std::memcmp(ranged.c.data(), full.c.data(), full.c.size() * sizeof(float)) == 0);
        full.c = ranged.c;
        check_accumulated(full, 1, full.lda, 64 * 6e-8, "add_tn_ranges " + shape);
      }
}

TEST_CASE("nt and nn are one fused multiply-add chain per element; nt(A, B) = nn(A, Bᵀ) bitwise",
          "[attention][tile][exact]") {
  // The order the kernels promise (tile_products.h), written out: acc from +0, acc = fma(a, b, acc)
  // in step order, then alpha·acc. Held by every vector width and blocking, so a 512-bit host, a
  // 256-bit one and a decode step of one row all give these bits. Shapes past the 8 × 8 transpose
  // blocks, the two-vector column blocks and the 4-row blocks, with strided operands.
  auto chain = [](float acc, float x, float y) {
#if defined(__FMA__)
    return std::fma(x, y, acc);
#else
    return acc + x * y;
#endif
  };
  uint32_t seed = 11;
  for (int64_t m : {1, 3, 4, 9, 32})
    for (int64_t n : {1, 7, 8, 16, 17, 32, 71})
      for (int64_t k : {1, 5, 8, 64, 67}) {
        Operands<float> o = make_operands<float>(m, n, k, n, k, seed++);
        const float alpha = 0.125f;
        tile::nt(m, n, k, alpha, o.a.data(), o.lda, o.b.data(), o.ldb, o.c.data(), o.ldc);
        // Bᵀ through tile::transpose, at a stride other than n, then nn on it.
        const int64_t ldt = n + 3;
        std::vector<float> bt(k * ldt, kGuard), c_nn(o.c.size(), kGuard);
        tile::transpose(n, k, o.b.data(), o.ldb, bt.data(), ldt);
        tile::nn(m, n, k, alpha, o.a.data(), o.lda, bt.data(), ldt, c_nn.data(), o.ldc);
        const std::string shape = "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
        INFO(shape);
        int64_t transposed_wrong = 0, chain_wrong = 0, nn_wrong = 0, guard_wrong = 0;
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < ldt; ++j) {
            const float want = j < n ? o.b[j * o.ldb + p] : kGuard;  // nothing past n columns written
            transposed_wrong += std::memcmp(&bt[p * ldt + j], &want, sizeof(float)) != 0 ? 1 : 0;
          }
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; ++p) acc = chain(acc, o.a[i * o.lda + p], o.b[j * o.ldb + p]);
            const float want = alpha * acc;
            chain_wrong += std::memcmp(&o.c[i * o.ldc + j], &want, sizeof(float)) != 0 ? 1 : 0;
            nn_wrong += std::memcmp(&c_nn[i * o.ldc + j], &want, sizeof(float)) != 0 ? 1 : 0;
          }
        for (size_t e = 0; e < o.c.size(); ++e) {
          const int64_t i = static_cast<int64_t>(e) / o.ldc, j = static_cast<int64_t>(e) % o.ldc;
          if (i < m && j < n) continue;
          guard_wrong += (o.c[e] != kGuard ? 1 : 0) + (c_nn[e] != kGuard ? 1 : 0);
        }
        CHECK(transposed_wrong == 0);
        CHECK(chain_wrong == 0);
        CHECK(nn_wrong == 0);
        CHECK(guard_wrong == 0);
      }
}
