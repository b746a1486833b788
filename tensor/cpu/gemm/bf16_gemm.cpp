// The bf16 dispatch point (bf16_gemm.h) and the packed driver of the units' kernels.
//
// The driver blocks as the float32 one does (gemm.cpp): columns of op(B) in blocks of nc, k in
// blocks of kc, rows of op(A) in blocks of mc, one band of C per thread. Packing rounds each value
// to bf16 (nearest, ties to even; exact on the values autocast produced), flushes values below
// bf16's normal range to zero, and pairs k with k + 1 in one uint32, so the packed operands take
// half the bytes of float32 ones.
#include "tensor/cpu/gemm/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>
#include <cstdlib>
#include <cstring>

#include "tensor/cpu/gemm/bf16_kernel_table.h"
#include "tensor/cpu/gemm/cpu_features.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cpu/gemm/kernel_table.h"
#include "tensor/cpu/parallel.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace qkv::cpu {

namespace gemm_detail {

namespace {

struct PairScratch {
  uint32_t* data = nullptr;
  size_t capacity = 0;
  ~PairScratch() { std::free(data); }
  uint32_t* get(size_t pairs) {
    if (pairs > capacity) {
      std::free(data);
      const size_t bytes = (pairs * sizeof(uint32_t) + 63) / 64 * 64;
      data = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
      if (!data) fail("[gemm] out of memory for a ", bytes, "-byte packing buffer");
      capacity = bytes / sizeof(uint32_t);
    }
    return data;
  }
};

// x as the units read it: bf16, nearest even, zero below the normal range (sign kept).
inline uint32_t unit_bf16(float x) {
  uint16_t h = float_to_bf16(x);
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  return h;
}

// Pairs of k for kb values of k, padded with zeros to kpp pairs: pair p = (at(2p), at(2p + 1)).
template <class At>
inline uint32_t pair_at(const At& at, int64_t p, int64_t kb) {
  const int64_t k0 = 2 * p;
  const uint32_t even = k0 < kb ? unit_bf16(at(k0)) : 0, odd = k0 + 1 < kb ? unit_bf16(at(k0 + 1)) : 0;
  return even | (odd << 16);
}

// ceil(kb / 2) pairs, rounded up to a multiple of the kernel's step.
inline int64_t padded_pairs(int64_t kb, int step) { return ((kb + 1) / 2 + step - 1) / step * step; }

// Eight uint32 lanes (float32 bit patterns, or bf16 pairs).
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
inline U8 load_bits(const float* p) {
  U8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// unit_bf16 on eight float32 bit patterns: the bf16 in the low 16 bits of each lane.
inline U8 unit_bf16_lanes(U8 u) {
  const U8 h = bf16_rounded_bits(u) >> 16;
  const U8 tiny = (U8)((h & 0x7f80u) == 0);
  return h & ~(tiny & 0x7fffu);  // below the normal range: zero, sign kept
}

// Pair panels from a source whose k rows lie ld apart and whose lanes are adjacent
// (src[kk * ld + j]), `width` lanes in panels of w (panel q at dst + q * w * kpp, the last one
// padded with zero lanes): dst[q * w * kpp + p * w + j] = (src[2p][qw + j], src[2p + 1][qw + j])
// for p < kpp, zero for k >= kb. Each pair of rows is read once across all panels, in order: a
// panel at a time would stride down the rows once per panel.
void pack_pairs_from_k_rows(const float* src, int64_t ld, int64_t kb, int64_t kpp, int w, int64_t width,
                            uint32_t* dst) {
  const int64_t panels = (width + w - 1) / w;
  for (int64_t p = 0; p < kpp; ++p) {
    const int64_t k0 = 2 * p;
    const float *even = src + k0 * ld, *odd = even + ld;
    for (int64_t q = 0; q < panels; ++q) {
      uint32_t* d = dst + q * w * kpp + p * w;
      const int64_t c0 = q * w;
      const int lanes = int(std::min<int64_t>(w, width - c0));
      if (k0 + 1 < kb) {
        const int vec = lanes / 8 * 8;
        for (int j = 0; j < vec; j += 8) {
          const U8 v = unit_bf16_lanes(load_bits(even + c0 + j)) | (unit_bf16_lanes(load_bits(odd + c0 + j)) << 16);
          std::memcpy(d + j, &v, sizeof(v));
        }
        for (int j = vec; j < lanes; ++j) d[j] = unit_bf16(even[c0 + j]) | (unit_bf16(odd[c0 + j]) << 16);
      } else {
        for (int j = 0; j < lanes; ++j) d[j] = k0 < kb ? unit_bf16(even[c0 + j]) : 0;
      }
      for (int j = lanes; j < w; ++j) d[j] = 0;
    }
  }
}

// v[r] holds eight values (columns c) of lane r; afterwards v[c] holds lane r's value of column c
// in element r: an 8 x 8 transpose in three rounds of shuffles (32-, 64- and 128-bit halves).
inline void transpose8x8(U8 (&v)[8]) {
  U8 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = __builtin_shuffle(v[i], v[i + 1], I8{0, 8, 1, 9, 4, 12, 5, 13});
    a[i + 1] = __builtin_shuffle(v[i], v[i + 1], I8{2, 10, 3, 11, 6, 14, 7, 15});
  }
  for (int h = 0; h < 8; h += 4)
    for (int i = 0; i < 2; ++i) {
      b[h + 2 * i] = __builtin_shuffle(a[h + i], a[h + i + 2], I8{0, 1, 8, 9, 4, 5, 12, 13});
      b[h + 2 * i + 1] = __builtin_shuffle(a[h + i], a[h + i + 2], I8{2, 3, 10, 11, 6, 7, 14, 15});
    }
  // b[0..3]: rows 0-3 of columns (0|4), (1|5), (2|6), (3|7); b[4..7] the same for rows 4-7.
  for (int c = 0; c < 4; ++c) {
    v[c] = __builtin_shuffle(b[c], b[c + 4], I8{0, 1, 2, 3, 8, 9, 10, 11});
    v[c + 4] = __builtin_shuffle(b[c], b[c + 4], I8{4, 5, 6, 7, 12, 13, 14, 15});
  }
}

// Pair panels from a source whose lanes lie ld apart and whose k values are adjacent
// (src[j * ld + kk]): dst[p * w + j] = pair_of(src[j][2p], src[j][2p + 1]) for p < kpp and
// j < lanes, zero for k >= kb and for j >= lanes. pair8(s) makes the eight pairs of the 16 values
// at s (one U8); pair1(first, second) one pair. Eight lanes by eight pairs at a time go through a
// register transpose, so each pair row of the panel is written eight lanes at once.
template <class Pair8, class Pair1>
void pack_k_runs(const float* src, int64_t ld, int64_t kb, int64_t kpp, int w, int lanes, uint32_t* dst,
                 const Pair8& pair8, const Pair1& pair1) {
  const int64_t full = kb / 16 * 8;  // pairs taken eight at a time
  for (int j0 = 0; j0 < lanes; j0 += 8) {
    const int cnt = std::min(8, lanes - j0);
    for (int64_t p = 0; p < full; p += 8) {
      U8 v[8];
      for (int r = 0; r < 8; ++r) v[r] = r < cnt ? pair8(src + (j0 + r) * ld + 2 * p) : U8{};
      transpose8x8(v);
      if (cnt == 8) {  // a fixed-size copy is one vector store; a variable one a string move
        for (int i = 0; i < 8; ++i) std::memcpy(dst + (p + i) * w + j0, &v[i], sizeof(U8));
      } else {
        for (int i = 0; i < 8; ++i)
          for (int r = 0; r < cnt; ++r) dst[(p + i) * w + j0 + r] = v[i][r];
      }
    }
    for (int r = 0; r < cnt; ++r) {
      const float* s = src + (j0 + r) * ld;
      for (int64_t p = full; p < kpp; ++p) {
        const int64_t k0 = 2 * p;
        dst[p * w + j0 + r] = k0 < kb ? pair1(s[k0], k0 + 1 < kb ? s[k0 + 1] : 0.0f) : 0;
      }
    }
  }
  for (int j = lanes; j < w; ++j)
    for (int64_t p = 0; p < kpp; ++p) dst[p * w + j] = 0;
}

// The two halves of eight pairs of adjacent values at s: first[i] = s[2i], second[i] = s[2i + 1].
inline void split_pairs(const float* s, U8& first, U8& second) {
  const U8 lo = load_bits(s), hi = load_bits(s + 8);
  first = __builtin_shuffle(lo, hi, I8{0, 2, 4, 6, 8, 10, 12, 14});
  second = __builtin_shuffle(lo, hi, I8{1, 3, 5, 7, 9, 11, 13, 15});
}

// The GEMM's packing: pairs (even k low, odd k high) rounded as the units read them.
void pack_pairs_from_k_runs(const float* src, int64_t ld, int64_t kb, int64_t kpp, int w, int lanes, uint32_t* dst) {
  pack_k_runs(
      src, ld, kb, kpp, w, lanes, dst,
      [](const float* s) {
        U8 first, second;
        split_pairs(s, first, second);
        return unit_bf16_lanes(first) | (unit_bf16_lanes(second) << 16);
      },
      [](float first, float second) { return unit_bf16(first) | (unit_bf16(second) << 16); });
}

// Panels of mr rows of op(A) over k in [p0, p0 + kb), as Bf16KernelTable describes; rows past mb
// are zero.
void pack_a_pairs(const Bf16KernelTable& kt, bool ta, const float* a, int64_t lda, int64_t i0, int64_t mb, int64_t p0,
                  int64_t kb, uint32_t* dst) {
  const int mr = kt.mr, step = kt.k_step;
  const int64_t kpp = padded_pairs(kb, step);
  for (int64_t q = 0; q < mb; q += mr, dst += mr * kpp) {
    const int rows = int(std::min<int64_t>(mr, mb - q));
    if (step == 1) {  // pair-major panels
      if (ta) return pack_pairs_from_k_rows(a + p0 * lda + i0, lda, kb, kpp, mr, mb, dst);
      pack_pairs_from_k_runs(a + (i0 + q) * lda + p0, lda, kb, kpp, mr, rows, dst);
      continue;
    }
    for (int r = 0; r < mr; ++r) {
      const int64_t i = i0 + q + r;
      auto at = [&](int64_t kk) { return ta ? a[(p0 + kk) * lda + i] : a[i * lda + p0 + kk]; };
      for (int64_t p = 0; p < kpp; ++p)
        dst[(p / step) * mr * step + r * step + p % step] = r < rows ? pair_at(at, p, kb) : 0;
    }
  }
}

// Panels of nr columns of op(B) over k in [p0, p0 + kb), pair-major; columns past nb are zero.
void pack_b_pairs(const Bf16KernelTable& kt, bool tb, const float* b, int64_t ldb, int64_t p0, int64_t kb, int64_t j0,
                  int64_t nb, uint32_t* dst) {
  const int nr = kt.nr;
  const int64_t kpp = padded_pairs(kb, kt.k_step);
  if (!tb) return pack_pairs_from_k_rows(b + p0 * ldb + j0, ldb, kb, kpp, nr, nb, dst);
  for (int64_t q = 0; q < nb; q += nr, dst += nr * kpp)
    pack_pairs_from_k_runs(b + (j0 + q) * ldb + p0, ldb, kb, kpp, nr, int(std::min<int64_t>(nr, nb - q)), dst);
}

void packed_serial(const Bf16KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local PairScratch a_buf, b_buf;
  const int64_t nc = std::min(kt.nc, (n + kt.nr - 1) / kt.nr * kt.nr);
  const int64_t mc = std::min(kt.mc, (m + kt.mr - 1) / kt.mr * kt.mr);
  const int64_t kc = std::min(kt.kc, k);
  const int64_t kpp_max = padded_pairs(kc, kt.k_step);
  uint32_t* bp = b_buf.get(size_t(kpp_max * nc));
  uint32_t* ap = a_buf.get(size_t(kpp_max * mc));
  if (kt.begin) kt.begin();
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t nb = std::min(nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t kb = std::min(kc, k - pc), kpp = padded_pairs(kb, kt.k_step);
      const bool first = pc == 0;
      pack_b_pairs(kt, tb, b, ldb, pc, kb, jc, nb, bp);
      for (int64_t ic = 0; ic < m; ic += mc) {
        const int64_t mb = std::min(mc, m - ic);
        pack_a_pairs(kt, ta, a, lda, ic, mb, pc, kb, ap);
        for (int64_t jr = 0; jr < nb; jr += kt.nr)
          for (int64_t ir = 0; ir < mb; ir += kt.mr)
            kt.tile(kpp, ap + ir * kpp, bp + jr * kpp, c + (ic + ir) * ldc + jc + jr, ldc,
                    int(std::min<int64_t>(kt.mr, mb - ir)), int(std::min<int64_t>(kt.nr, nb - jr)), alpha, beta, first);
      }
    }
  }
  if (kt.end) kt.end();
}

// What the invariant product (invariant_pair_product) learns of a block of operands as it packs
// them: the least (over nonzero values) and greatest biased float32 exponent fields of the
// operands rounded to bf16.
struct BlockRange {
  uint32_t min_e = 255, max_e = 0;
  void add(const BlockRange& o) {
    min_e = std::min(min_e, o.min_e);
    max_e = std::max(max_e, o.max_e);
  }
};
inline void range_lanes(U8 v, U8& min_e, U8& max_e) {
  const U8 e = (v >> 23) & 0xffu;
  const U8 zero = (U8)((v & 0x7fffffffu) == 0);
  const U8 e_nonzero = (e & ~zero) | (255u & zero);
  min_e = e_nonzero < min_e ? e_nonzero : min_e;
  max_e = e > max_e ? e : max_e;
}
inline BlockRange range_of(U8 min_e, U8 max_e) {
  BlockRange r;
  for (int i = 0; i < 8; ++i) {
    r.min_e = std::min(r.min_e, min_e[i]);
    r.max_e = std::max(r.max_e, max_e[i]);
  }
  return r;
}
inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline void range_add(BlockRange& r, uint32_t u) {
  const uint32_t e = (u >> 23) & 0xffu;
  if (u & 0x7fffffffu) r.min_e = std::min(r.min_e, e);
  r.max_e = std::max(r.max_e, e);
}
// float_to_bf16 (tensor/dtype.h) widened back, on the bits of one value.
inline uint32_t rounded_bf16_bits(float x) { return uint32_t(float_to_bf16(x)) << 16; }
inline float rounded_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// The dot-pair kernels run each pair's odd half first (bf16_tile.h): a pair holding k in its high
// half and k + 1 in its low half is therefore summed k, then k + 1. Panels as pack_k_runs's
// (source src[j * ld + kk]), each value rounded to bf16 (nearest, ties to even):
//   dst[p * w + j] = bf16(src[j][2p]) << 16 | bf16(src[j][2p + 1])   (k past kb: zero)
BlockRange pack_swapped_pairs(const float* src, int64_t ld, int64_t kb, int w, int lanes, uint32_t* dst) {
  U8 min_e = U8{} + 255u, max_e = U8{};
  BlockRange r;
  pack_k_runs(
      src, ld, kb, (kb + 1) / 2, w, lanes, dst,
      [&](const float* s) {
        U8 first, second;
        split_pairs(s, first, second);
        first = bf16_rounded_bits(first);
        second = bf16_rounded_bits(second);
        range_lanes(first, min_e, max_e);
        range_lanes(second, min_e, max_e);
        return first | (second >> 16);
      },
      [&](float first, float second) {
        const uint32_t a = rounded_bf16_bits(first), b = rounded_bf16_bits(second);
        range_add(r, a);
        range_add(r, b);
        return a | (b >> 16);
      });
  r.add(range_of(min_e, max_e));
  return r;
}

// Where the dot-pair kernel's sums are the float32 chain's bits. Both add each product exactly
// (a bf16 x bf16 product has 16 significant bits) with one rounding per step, in the same order,
// so they can differ only where the unit flushes: an input or a partial sum below float32's
// normal range 2^-126. With every nonzero x at least 2^a and every nonzero W at least 2^b (a, b
// the unbiased exponents), each product is a multiple of 2^(a + b - 14); so is every partial sum
// (a sum of such multiples, and a rounding to a float no finer than that grid keeps it), so a
// nonzero one is at least 2^(a + b - 14) >= 2^-126 when a + b >= -112: biased, min_e(x) +
// min_e(W) >= 142. Infinities, NaN and products that could overflow (a sum of greatest exponents
// past 126: biased 380) are left to the chain as well.
inline bool pairs_equal_chain(const BlockRange& x, const BlockRange& w) {
  return x.min_e >= 1 && w.min_e >= 1 && x.min_e + w.min_e >= 142 && x.max_e < 255 && w.max_e < 255 &&
         x.max_e + w.max_e <= 380;
}

// The float32 chain of invariant_matmul.h for one block, on the operands rounded to bf16:
// y[i][j] = fma over k = 0..K-1 from +0.
void chain_block(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int rows, int cols,
                 int64_t k) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk)
        acc = std::fma(rounded_bf16(x[i * ldx + kk]), rounded_bf16(w[j * ldw + kk]), acc);
      y[i * ldy + j] = acc;
    }
}

}  // namespace

void packed_sbgemm(const Bf16KernelTable& kt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
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

void invariant_pair_product(const Bf16KernelTable& kt, const float* x, int64_t ldx, const float* w, int64_t ldw,
                            const float* bias, float* y, int64_t ldy, int64_t m, int64_t n, int64_t k) {
  QKV_CHECK(kt.k_step == 1 && kt.tile, "[gemm] the invariant bf16 product needs a dot-pair kernel");
  if (m <= 0 || n <= 0) return;
  const int mr = kt.mr, nr = kt.nr;
  const int64_t kp = (k + 1) / 2, kps = std::max<int64_t>(kp, 1);
  const int64_t blocks = (m + mr - 1) / mr, panels = (n + nr - 1) / nr;
  const int threads = split_threads(n * k * 4 + m * n * k / 8, omp_get_max_threads());
  // x and W are packed once each, as pair panels of mr rows and nr columns (half the bytes of the
  // float32 operands), with the range of each panel; the calling thread owns the buffers.
  thread_local PairScratch x_buf, w_buf;
  thread_local std::vector<BlockRange> x_ranges, w_ranges;
  uint32_t* xp = x_buf.get(size_t(blocks * kps * mr));
  uint32_t* wp = w_buf.get(size_t(panels * kps * nr));
  x_ranges.resize(size_t(blocks));
  w_ranges.resize(size_t(panels));
  BlockRange* xr = x_ranges.data();
  BlockRange* wr = w_ranges.data();
  constexpr int64_t kPanelsPerPackTask = 8;
  const int64_t pack_tasks = (blocks + panels + kPanelsPerPackTask - 1) / kPanelsPerPackTask;
  run_split(pack_tasks, threads, [&](int64_t t) {
    for (int64_t i = t * kPanelsPerPackTask; i < std::min(blocks + panels, (t + 1) * kPanelsPerPackTask); ++i) {
      if (i < blocks) {
        xr[i] =
            pack_swapped_pairs(x + i * mr * ldx, ldx, k, mr, int(std::min<int64_t>(mr, m - i * mr)), xp + i * kps * mr);
      } else {
        const int64_t q = i - blocks;
        wr[q] =
            pack_swapped_pairs(w + q * nr * ldw, ldw, k, nr, int(std::min<int64_t>(nr, n - q * nr)), wp + q * kps * nr);
      }
    }
  });
  // Tiles: a group of W's panels (about 256 KiB, kept in L2 while the rows sweep it) times up to
  // kBlocksPerTask blocks of rows. Only rows and columns are split, never k: each element is one
  // tile's whole sum.
  constexpr int64_t kGroupBytes = 256 << 10, kBlocksPerTask = 32;
  const int64_t group = std::clamp<int64_t>(kGroupBytes / (kps * nr * 4), 1, panels);
  const int64_t groups = (panels + group - 1) / group, row_tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  run_split(groups * row_tasks, threads, [&](int64_t t) {
    const int64_t g = t % groups, rt = t / groups;
    const int64_t q0 = g * group, q1 = std::min(panels, q0 + group);
    const int64_t b0 = rt * kBlocksPerTask, b1 = std::min(blocks, b0 + kBlocksPerTask);
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t i0 = bi * mr;
      const int rows = int(std::min<int64_t>(mr, m - i0));
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t j0 = q * nr;
        const int cols = int(std::min<int64_t>(nr, n - j0));
        float* yb = y + i0 * ldy + j0;
        if (pairs_equal_chain(xr[bi], wr[q]))
          kt.tile(kp, xp + bi * kps * mr, wp + q * kps * nr, yb, ldy, rows, cols, 1.0f, 0.0f, true);
        else chain_block(x + i0 * ldx, ldx, w + j0 * ldw, ldw, yb, ldy, rows, cols, k);
        if (bias)
          for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) yb[i * ldy + j] += bias[j0 + j];
      }
    }
  });
}

}  // namespace gemm_detail

namespace {

const gemm_detail::Bf16KernelTable* table_of(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::avx512_bf16:
      return &gemm_detail::kAvx512Bf16Kernel;
    case Bf16Kernel::amx:
      return &gemm_detail::kAmxKernel;
    default:
      return nullptr;
  }
}

Bf16Kernel by_features() {
  if (bf16_kernel_supported(Bf16Kernel::amx)) return Bf16Kernel::amx;
  if (bf16_kernel_supported(Bf16Kernel::avx512_bf16)) return Bf16Kernel::avx512_bf16;
  return Bf16Kernel::emulated;
}

Bf16Kernel kernel_from_environment() {
  const char* env = std::getenv("QKV_GEMM_BF16");
  if (!env || !*env) return Bf16Kernel::automatic;
  const Bf16Kernel kernel = parse_bf16_kernel(env, "QKV_GEMM_BF16");
  if (!bf16_kernel_supported(kernel)) {
    std::string has;
    for (const auto& f : cpu_features().names()) has += (has.empty() ? "" : " ") + f;
    fail("[gemm] QKV_GEMM_BF16=", env,
         ": this CPU cannot execute that kernel (it has: ", has.empty() ? "no vector extensions" : has, ")",
         kernel == Bf16Kernel::amx && cpu_features().amx_bf16 ? "; the OS refused the AMX tile state" : "");
  }
  return kernel;
}

std::atomic<int> g_requested{-1};  // -1: QKV_GEMM_BF16 not read yet

Bf16Kernel requested_now() {
  int r = g_requested.load(std::memory_order_acquire);
  if (r < 0) {
    const Bf16Kernel from_env = kernel_from_environment();
    int expected = -1;
    g_requested.compare_exchange_strong(expected, int(from_env), std::memory_order_acq_rel);
    r = g_requested.load(std::memory_order_acquire);
  }
  return Bf16Kernel(r);
}

}  // namespace

const char* bf16_kernel_name(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::automatic:
      return "auto";
    case Bf16Kernel::emulated:
      return "emulated";
    case Bf16Kernel::avx512_bf16:
      return "avx512_bf16";
    case Bf16Kernel::amx:
      return "amx";
  }
  return "?";
}

Bf16Kernel parse_bf16_kernel(const std::string& name, const char* what) {
  for (Bf16Kernel k : {Bf16Kernel::automatic, Bf16Kernel::emulated, Bf16Kernel::avx512_bf16, Bf16Kernel::amx})
    if (name == bf16_kernel_name(k)) return k;
  fail("[gemm] ", what, " must be auto, emulated, avx512_bf16 or amx, got '", name, "'");
}

bool bf16_kernel_supported(Bf16Kernel kernel) {
  const CpuFeatures& f = cpu_features();
  switch (kernel) {
    case Bf16Kernel::automatic:
    case Bf16Kernel::emulated:
      return true;
    case Bf16Kernel::avx512_bf16:
      return gemm_detail::kAvx512Bf16Kernel.name != nullptr && f.avx512f && f.avx512_bf16 && f.fma;
    case Bf16Kernel::amx:
      return gemm_detail::kAmxKernel.name != nullptr && f.amx_tile && f.amx_bf16 && f.avx512f && f.fma && request_amx();
  }
  return false;
}

Bf16Kernel requested_bf16_kernel() { return requested_now(); }

Bf16Kernel active_bf16_kernel() {
  static const Bf16Kernel automatic_choice = by_features();
  const Bf16Kernel requested = requested_now();
  return requested == Bf16Kernel::automatic ? automatic_choice : requested;
}

void set_bf16_kernel(Bf16Kernel kernel) {
  if (!bf16_kernel_supported(kernel))
    fail("[gemm] the ", bf16_kernel_name(kernel), " bf16 kernel cannot run on this CPU");
  g_requested.store(int(kernel), std::memory_order_release);
}

std::string bf16_kernel_reason() {
  const Bf16Kernel requested = requested_now(), active = active_bf16_kernel();
  const CpuFeatures& f = cpu_features();
  std::string why;
  if (requested != Bf16Kernel::automatic) {
    why = "forced (QKV_GEMM_BF16 or set_bf16_kernel)";
  } else if (active == Bf16Kernel::amx) {
    why = "the CPU has AMX-BF16 and the OS granted its tiles";
  } else if (active == Bf16Kernel::avx512_bf16) {
    why = f.amx_bf16 ? "the CPU has AVX512-BF16; the OS refused the AMX tile state" : "the CPU has AVX512-BF16";
  } else {
    why = std::string(f.amx_bf16 ? "the OS refused the AMX tile state and the CPU has no AVX512-BF16"
                                 : "no AMX-BF16 or AVX512-BF16 on this CPU") +
          ": operands rounded to bf16, multiplied by the float32 GEMM (" + gemm_kernel_name(active_gemm_kernel()) + ")";
  }
  return std::string(bf16_kernel_name(active)) + (active == Bf16Kernel::emulated ? "" : " (qkv)") + ": " + why;
}

void sbgemm_with(Bf16Kernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (kernel == Bf16Kernel::automatic) kernel = active_bf16_kernel();
  if (kernel == Bf16Kernel::emulated) return sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (!bf16_kernel_supported(kernel))
    fail("[gemm] the ", bf16_kernel_name(kernel), " bf16 kernel cannot run on this CPU");
  gemm_detail::packed_sbgemm(*table_of(kernel), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool invariant_bf16_on_units() {
  return active_bf16_kernel() != Bf16Kernel::emulated && bf16_kernel_supported(Bf16Kernel::avx512_bf16);
}

void invariant_sbgemm_nt(const float* x, int64_t ldx, const float* w, int64_t ldw, const float* bias, float* y,
                         int64_t ldy, int64_t m, int64_t n, int64_t k) {
  if (!bf16_kernel_supported(Bf16Kernel::avx512_bf16))
    fail("[gemm] the invariant bf16 product needs AVX512-BF16, which this CPU lacks");
  gemm_detail::invariant_pair_product(gemm_detail::kAvx512Bf16Kernel, x, ldx, w, ldw, bias, y, ldy, m, n, k);
}

void sbgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
            int64_t ldb, float beta, float* c, int64_t ldc) {
  sbgemm_with(active_bf16_kernel(), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace qkv::cpu
