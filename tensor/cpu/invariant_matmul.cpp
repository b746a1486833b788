// Batch-invariant linear forward (invariant_matmul.h states the formula and the order).
//
// Blocking, none of which touches the order of any element's sum:
// - micro-kernel: R <= 6 rows x 16 columns (two 8-lane vectors per row, 12 accumulators in
//   registers), or 1 row x 64 / 2-3 rows x 32 columns so that small blocks too keep 8-12 chains;
//   per k it loads the packed weights and broadcasts x[r, k], so every lane performs
//   acc = fma(x[r, k], W[n, k], acc) for k = 0..K-1 over the whole K;
// - tasks: a group of panels (about kGroupBytes of packed W, which stays in L2 while the task's rows
//   sweep it) times a range of rows (kTaskRows). A task packs its group once (unless W came packed)
//   and runs all its rows against it. Tasks go to threads through run_split (tensor/cpu/parallel.h);
//   which thread runs a task changes nothing in its values;
// - decode (M = 1, rows of W at most 4 KiB apart): no packed copy; 8x8 transposes in registers
//   bring W[n, k..k+7] into lane n and the FMAs go k by k (direct1); the last N % 8 columns run
//   the same chain one at a time with std::fma;
// - edges: the last panel is zero-padded to 16 columns and the lanes past N are dropped when the tile
//   is written; the last rows run the same kernel with R < 6. Lane arithmetic is the same in every
//   case, so an edge element equals the interior one bitwise.
#include "tensor/cpu/invariant_matmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <unordered_map>

#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/parallel.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace qkv::cpu {

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// A 16-column line of a bf16 panel widened to float32 (exact: a bf16 value is the upper half of
// its float32): columns 0-7 into lo, 8-15 into hi. The line is stored in the order the AVX2
// widening reads it (kBf16LineOrder), so one load and two in-lane unpacks with zero do it.
constexpr int kBf16LineOrder[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
inline void load_line(const uint16_t* p, v8& lo, v8& hi) {
#if defined(__AVX2__)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  lo = (v8)_mm256_unpacklo_epi16(_mm256_setzero_si256(), h);  // stored 0-3 | 8-11: columns 0-7
  hi = (v8)_mm256_unpackhi_epi16(_mm256_setzero_si256(), h);  // stored 4-7 | 12-15: columns 8-15
#else
  float col[16];
  for (int i = 0; i < 16; ++i) col[kBf16LineOrder[i]] = bf16_to_float(p[i]);
  std::memcpy(&lo, col, sizeof(lo));
  std::memcpy(&hi, col + 8, sizeof(hi));
#endif
}
inline void store(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }
inline v8 broadcast(float s) { return v8{s, s, s, s, s, s, s, s}; }

// acc + a·b per lane, rounded once: the FMA instruction, or std::fma lane by lane on a host without
// one (same values, only slower). Spelt out, never left to the compiler's contraction (this file is
// built with -ffp-contract=off).
inline v8 fmadd(v8 acc, v8 a, v8 b) {
#if defined(__FMA__)
  return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
  v8 r;
  for (int i = 0; i < 8; ++i) r[i] = std::fma(a[i], b[i], acc[i]);
  return r;
#endif
}

constexpr int64_t P = kInvariantPanel;
constexpr int64_t kGroupBytes = 192 << 10;  // packed W per task: with a few rows of x, fits a 512 KB L2
constexpr int64_t kTaskRows = 384;          // rows per task (a multiple of 6): W is packed M / 384 times
constexpr int64_t kDirectMaxLd = 1024;      // M = 1 reads W unpacked up to this row stride (4 KiB)
// The micro-kernel asks for each panel's line kk + 32 (2 KiB ahead) while it works on line kk.
// With several rows of x a line costs several FMA cycles, and the hardware prefetcher alone then
// keeps too few lines in flight: a decode step at M = 8 streamed W at half the rate of M = 1.
// (4 KiB ahead ran slower: it crosses pages that the walk has not reached.)
constexpr int64_t kPrefetchAhead = 32;

// tile[r*(16 PN) + 16 q + j] = sum over k of x[r, k] * wp[q*ps + k*16 + j] for r < R, q < PN (PN
// panels ps floats apart), in the order of the header: 2 PN lanes-vectors of accumulators per row.
// WT: float32 panels, or bf16 ones (uint16_t: the same values when W holds bf16 values).
template <int R, int PN, class WT>
void micro(const float* x, int64_t ldx, const WT* wp, int64_t ps, int64_t k, float* tile) {
  constexpr int V = 2 * PN;
  v8 a[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) a[r][v] = v8{};
  for (int64_t kk = 0; kk < k; ++kk) {
    v8 w[V];
    for (int q = 0; q < PN; ++q) __builtin_prefetch(wp + q * ps + (kk + kPrefetchAhead) * P);
    if constexpr (std::is_same_v<WT, uint16_t>) {
      for (int q = 0; q < PN; ++q) load_line(wp + q * ps + kk * P, w[2 * q], w[2 * q + 1]);
    } else {
      for (int v = 0; v < V; ++v) w[v] = load(wp + (v / 2) * ps + kk * P + (v % 2) * 8);
    }
    for (int r = 0; r < R; ++r) {
      const v8 xb = broadcast(x[r * ldx + kk]);
      for (int v = 0; v < V; ++v) a[r][v] = fmadd(a[r][v], xb, w[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) store(tile + r * P * PN + v * 8, a[r][v]);
}

// Panels a micro-kernel call covers for a block of `rows` rows with `left` panels to go: enough
// independent accumulators (8 to 12 where there are panels enough) to keep the FMA units busy
// while each waits for its previous result.
constexpr int64_t panels_per_call(int64_t rows, int64_t left) {
  const int64_t want = rows == 1 ? 4 : rows <= 3 ? 2 : 1;
  return want <= left ? want : want == 4 && left >= 2 ? 2 : 1;
}

template <class WT>
void micro_rows(int64_t rows, int64_t pn, const float* x, int64_t ldx, const WT* wp, int64_t ps, int64_t k,
                float* tile) {
  if (pn == 4) return micro<1, 4>(x, ldx, wp, ps, k, tile);
  if (pn == 2)
    return rows == 1   ? micro<1, 2>(x, ldx, wp, ps, k, tile)
           : rows == 2 ? micro<2, 2>(x, ldx, wp, ps, k, tile)
                       : micro<3, 2>(x, ldx, wp, ps, k, tile);
  switch (rows) {
    case 1:
      return micro<1, 1>(x, ldx, wp, ps, k, tile);
    case 2:
      return micro<2, 1>(x, ldx, wp, ps, k, tile);
    case 3:
      return micro<3, 1>(x, ldx, wp, ps, k, tile);
    case 4:
      return micro<4, 1>(x, ldx, wp, ps, k, tile);
    case 5:
      return micro<5, 1>(x, ldx, wp, ps, k, tile);
    default:
      return micro<6, 1>(x, ldx, wp, ps, k, tile);
  }
}

#if defined(__AVX__)
// c[k][i] = s[i*ldw + k] for i, k < 8: one 8x8 transpose. t[i] = [row i, k 0..3 | row i+4, k 0..3]
// and t[4+i] the same for k 4..7, loaded as halves, so two 4x4 transposes within the 128-bit lanes
// finish the job (16 shuffles).
inline void transpose8(const float* s, int64_t ldw, __m256 c[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    const float* lo = s + i * ldw;
    const float* hi = s + (i + 4) * ldw;
    t[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
    t[4 + i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo + 4)), _mm_loadu_ps(hi + 4), 1);
  }
  for (int g = 0; g < 2; ++g) {  // k 4g .. 4g+3
    const __m256 u0 = _mm256_unpacklo_ps(t[4 * g], t[4 * g + 1]), u1 = _mm256_unpackhi_ps(t[4 * g], t[4 * g + 1]),
                 u2 = _mm256_unpacklo_ps(t[4 * g + 2], t[4 * g + 3]),
                 u3 = _mm256_unpackhi_ps(t[4 * g + 2], t[4 * g + 3]);
    c[4 * g] = _mm256_shuffle_ps(u0, u2, 0x44);
    c[4 * g + 1] = _mm256_shuffle_ps(u0, u2, 0xEE);
    c[4 * g + 2] = _mm256_shuffle_ps(u1, u3, 0x44);
    c[4 * g + 3] = _mm256_shuffle_ps(u1, u3, 0xEE);
  }
}
inline void transpose8(const float* s, int64_t ldw, float* d) {  // d[k*16 + i] = s[i*ldw + k]
  __m256 c[8];
  transpose8(s, ldw, c);
  for (int kk = 0; kk < 8; ++kk) _mm256_storeu_ps(d + kk * P, c[kk]);
}

// One row against G*8 columns read straight from W's rows (no packing; the matrix-vector product
// of decode): out[8g + i] = sum over k of x[k] * w[(8g + i)*ldw + k], each lane in the order of
// the header (the 8x8 transposes only bring W[n, k..k+7] into lane n; the FMAs go k by k).
template <int G>
void direct1(const float* x, const float* w, int64_t ldw, int64_t k, float* out) {
  v8 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = v8{};
  int64_t kk = 0;
  // 16 values of k per row (its 64-byte line) before the next 8 rows: rows 4 KiB apart share an L1
  // set, and a line evicted before its second half is read would be fetched twice.
  for (; kk + 16 <= k; kk += 16)
    for (int g = 0; g < G; ++g) {
      for (int h = 0; h < 16; h += 8) {
        __m256 c[8];
        transpose8(w + 8 * g * ldw + kk + h, ldw, c);
        for (int i = 0; i < 8; ++i) acc[g] = fmadd(acc[g], broadcast(x[kk + h + i]), (v8)c[i]);
      }
    }
  for (; kk + 8 <= k; kk += 8)
    for (int g = 0; g < G; ++g) {
      __m256 c[8];
      transpose8(w + 8 * g * ldw + kk, ldw, c);
      for (int i = 0; i < 8; ++i) acc[g] = fmadd(acc[g], broadcast(x[kk + i]), (v8)c[i]);
    }
  for (; kk < k; ++kk)
    for (int g = 0; g < G; ++g) {
      v8 col;
      for (int i = 0; i < 8; ++i) col[i] = w[(8 * g + i) * ldw + kk];
      acc[g] = fmadd(acc[g], broadcast(x[kk]), col);
    }
  for (int g = 0; g < G; ++g) store(out + 8 * g, acc[g]);
}
#endif

// dst[k*16 + j] = w[(n0 + j)*ldw + k] for j < cols, 0 for cols <= j < 16: one panel.
void pack_panel(const float* w, int64_t ldw, int64_t n0, int64_t cols, int64_t k, float* dst) {
  const float* src = w + n0 * ldw;
  int64_t kk = 0;
#if defined(__AVX__)
  if (cols == P) {
    // 16 values of k (a 64-byte line of each row) per step, each 8 rows' lines used up back to
    // back: rows 4 KiB apart share an L1 set, and 16 of them would evict each other.
    for (; kk + 16 <= k; kk += 16)
      for (int half = 0; half < 2; ++half)
        for (int sub = 0; sub < 2; ++sub)
          transpose8(src + half * 8 * ldw + kk + 8 * sub, ldw, dst + (kk + 8 * sub) * P + half * 8);
    for (; kk + 8 <= k; kk += 8)
      for (int half = 0; half < 2; ++half) transpose8(src + half * 8 * ldw + kk, ldw, dst + kk * P + half * 8);
  }
#endif
  for (; kk < k; ++kk) {
    float* d = dst + kk * P;
    for (int64_t j = 0; j < cols; ++j) d[j] = src[j * ldw + kk];
    for (int64_t j = cols; j < P; ++j) d[j] = 0.0f;
  }
}

struct Problem {
  const float* x;
  int64_t ldx;
  const float* w;  // unpacked W [N, K] (or null)
  int64_t ldw;
  const float* wp;      // packed W (or null)
  const uint16_t* wph;  // packed W in bf16 (or null)
  const float* bias;
  float* y;
  int64_t ldy, m, n, k;
  bool bf16_values = false;  // x and W are expected to hold bf16 values (autocast rounded them)
};

// Rows from which a product on bf16 values goes to the units' kernel (bf16_gemm.h,
// invariant_sbgemm_nt: the same bits, a 12-row register block); fewer rows (decode) stay on the
// float32 chain here, which streams W's panels.
constexpr int64_t kUnitMinRows = 12;

// Panels [p0, p1) against rows [m0, m1); `packed` holds those panels back to back. The rows go in
// blocks of at most 6, as even as they come (8 rows: 4 + 4).
template <class WT>
void run_task(const Problem& pr, int64_t m0, int64_t m1, int64_t p0, int64_t p1, const WT* packed) {
  alignas(32) float tile[kInvariantRows * P];
  const int64_t ps = pr.k * P;
  for (int64_t r0 = m0; r0 < m1;) {
    const int64_t rows = std::min(kInvariantRows, m1 - r0);
    for (int64_t p = p0; p < p1;) {
      const int64_t pn = panels_per_call(rows, p1 - p);
      micro_rows(rows, pn, pr.x + r0 * pr.ldx, pr.ldx, packed + (p - p0) * ps, ps, pr.k, tile);
      for (int64_t q = 0; q < pn; ++q, ++p) {
        const int64_t n0 = p * P, cols = std::min(P, pr.n - n0);
        for (int64_t r = 0; r < rows; ++r) {
          float* out = pr.y + (r0 + r) * pr.ldy + n0;
          const float* t = tile + r * P * pn + q * P;
          if (pr.bias)
            for (int64_t j = 0; j < cols; ++j) out[j] = t[j] + pr.bias[n0 + j];
          else
            for (int64_t j = 0; j < cols; ++j) out[j] = t[j];
        }
      }
    }
    r0 += rows;
  }
}

// Splits the product into tasks (fixed by the shape) and runs them on up to omp_get_max_threads().
void run(const Problem& pr) {
  if (pr.m <= 0 || pr.n <= 0) return;
  if (pr.bf16_values && pr.w && pr.m >= kUnitMinRows && invariant_bf16_on_units())
    return invariant_sbgemm_nt(pr.x, pr.ldx, pr.w, pr.ldw, pr.bias, pr.y, pr.ldy, pr.m, pr.n, pr.k);
  const int64_t panels = (pr.n + P - 1) / P;
  const int64_t panel_floats = pr.k * P;
  // At least the panels one micro-kernel call takes for the first rows (4 at M = 1).
  const int64_t by_bytes = kGroupBytes / (std::max<int64_t>(panel_floats, 1) * int64_t(sizeof(float)));
  const int64_t group =
      std::clamp<int64_t>(std::max(by_bytes, panels_per_call(std::min(pr.m, kInvariantRows), panels)), 1, panels);
  const int64_t groups = (panels + group - 1) / group;
  const int64_t row_tasks = (pr.m + kTaskRows - 1) / kTaskRows;
  const int64_t tasks = groups * row_tasks;
  // Threads by the bytes streamed (W, and x per group) and the multiply-adds (~4 per byte per thread).
  const int64_t work = pr.n * pr.k * int64_t(sizeof(float)) + pr.m * pr.n * pr.k / 4;
  const int threads = split_threads(work, omp_get_max_threads());
  run_split(tasks, threads, [&](int64_t t) {
    const int64_t g = t % groups, rt = t / groups;
    const int64_t p0 = g * group, p1 = std::min(panels, p0 + group);
    const int64_t m0 = rt * kTaskRows, m1 = std::min(pr.m, m0 + kTaskRows);
    if (pr.wp) {
      run_task(pr, m0, m1, p0, p1, pr.wp + p0 * panel_floats);
      return;
    }
    if (pr.wph) {
      run_task(pr, m0, m1, p0, p1, pr.wph + p0 * panel_floats);
      return;
    }
#if defined(__AVX__)
    // At M = 1, W straight from its rows, the columns [n0, n1) in blocks of 8, where rows lie at
    // most 4 KiB apart: farther apart, the 32 rows read side by side share few L1 sets and this ran
    // slower than packing (K = 3072: 10 GB/s against 13).
    if (pr.m == 1 && pr.ldw <= kDirectMaxLd) {
      alignas(32) float out[32];
      const int64_t n1 = std::min(pr.n, p1 * P);
      for (int64_t n0 = p0 * P; n0 < n1;) {
        const int64_t cols = std::min<int64_t>(32, n1 - n0);
        const float* wn = pr.w + n0 * pr.ldw;
        if (cols == 32) direct1<4>(pr.x, wn, pr.ldw, pr.k, out);
        else if (cols >= 8) direct1<1>(pr.x, wn, pr.ldw, pr.k, out);
        const int64_t done = cols == 32 ? 32 : cols >= 8 ? 8 : 0;
        for (int64_t j = done; j < std::min<int64_t>(cols, 8); ++j) {  // fewer than 8 left: one by one
          float acc = 0.0f;
          for (int64_t kk = 0; kk < pr.k; ++kk) acc = std::fma(pr.x[kk], wn[j * pr.ldw + kk], acc);
          out[j] = acc;
        }
        const int64_t step = std::max<int64_t>(done, std::min<int64_t>(cols, 8));
        for (int64_t j = 0; j < step; ++j) pr.y[n0 + j] = pr.bias ? out[j] + pr.bias[n0 + j] : out[j];
        n0 += step;
      }
      return;
    }
#endif
    thread_local std::vector<float> buf;  // one group: ~kGroupBytes, or 1-4 panels of a long K
    buf.resize(static_cast<size_t>((p1 - p0) * panel_floats));
    for (int64_t p = p0; p < p1; ++p)
      pack_panel(pr.w, pr.ldw, p * P, std::min(P, pr.n - p * P), pr.k, buf.data() + (p - p0) * panel_floats);
    run_task(pr, m0, m1, p0, p1, buf.data());
  });
}

void check_dims(int64_t ldx, int64_t ldy, int64_t m, int64_t n, int64_t k) {
  QKV_CHECK(m >= 0 && n >= 0 && k >= 0, "[invariant_linear] negative size: M ", m, ", N ", n, ", K ", k);
  QKV_CHECK(ldx >= k && ldy >= n, "[invariant_linear] leading dimensions ldx ", ldx, " and ldy ", ldy,
            " must be at least K = ", k, " and N = ", n);
}

}  // namespace

PackedWeight pack_weight(const float* w, int64_t ldw, int64_t n, int64_t k) {
  QKV_CHECK(n >= 0 && k >= 0 && ldw >= k, "[pack_weight] need N, K >= 0 and ldw >= K, got N ", n, ", K ", k, ", ldw ",
            ldw);
  PackedWeight pw;
  pw.n = n;
  pw.k = k;
  const int64_t panels = (n + P - 1) / P;
  pw.data.resize(static_cast<size_t>(panels * k * P));
  const int threads = split_threads(n * k * int64_t(sizeof(float)), omp_get_max_threads());
  run_split(panels, threads,
            [&](int64_t p) { pack_panel(w, ldw, p * P, std::min(P, n - p * P), k, pw.data.data() + p * k * P); });
  return pw;
}

PackedWeight pack_weight_bf16(const float* w, int64_t ldw, int64_t n, int64_t k) {
  QKV_CHECK(n >= 0 && k >= 0 && ldw >= k, "[pack_weight] need N, K >= 0 and ldw >= K, got N ", n, ", K ", k, ", ldw ",
            ldw);
  PackedWeight pw;
  pw.n = n;
  pw.k = k;
  pw.bf16 = true;
  const int64_t panels = (n + P - 1) / P;
  pw.half.resize(static_cast<size_t>(panels * k * P));
  const int threads = split_threads(n * k * int64_t(sizeof(float)), omp_get_max_threads());
  run_split(panels, threads, [&](int64_t p) {
    thread_local std::vector<float> panel;
    panel.resize(static_cast<size_t>(k * P));
    pack_panel(w, ldw, p * P, std::min(P, n - p * P), k, panel.data());
    uint16_t* dst = pw.half.data() + p * k * P;
    for (int64_t kk = 0; kk < k; ++kk)
      for (int i = 0; i < P; ++i) dst[kk * P + i] = float_to_bf16(panel[size_t(kk * P + kBf16LineOrder[i])]);
  });
  return pw;
}

void invariant_linear(const float* x, int64_t ldx, const float* w, int64_t ldw, const float* bias, float* y,
                      int64_t ldy, int64_t m, int64_t n, int64_t k, bool bf16_values) {
  check_dims(ldx, ldy, m, n, k);
  QKV_CHECK(ldw >= k, "[invariant_linear] ldw ", ldw, " must be at least K = ", k);
  run(Problem{x, ldx, w, ldw, nullptr, nullptr, bias, y, ldy, m, n, k, bf16_values});
}

void invariant_linear(const float* x, int64_t ldx, const PackedWeight& w, const float* bias, float* y, int64_t ldy,
                      int64_t m) {
  check_dims(ldx, ldy, m, w.n, w.k);
  run(Problem{x, ldx, nullptr, 0, w.bf16 ? nullptr : w.data.data(), w.bf16 ? w.half.data() : nullptr, bias, y, ldy, m,
              w.n, w.k});
}

namespace {

struct PackKey {
  const float* w;
  int64_t n, k, ldw;
  bool bf16;
  bool operator==(const PackKey&) const = default;
};
struct PackKeyHash {
  size_t operator()(const PackKey& key) const {
    return std::hash<const void*>()(key.w) ^ (std::hash<int64_t>()(key.n * 1000003 + key.k) << 1) ^
           std::hash<int64_t>()(key.ldw * 2 + key.bf16);
  }
};
// A weight's panels and the storage they were packed from. The address alone is not enough: a
// weight made for one call (bf16 autocast rounds each weight into a new tensor) is freed after it,
// and the next one can be allocated at the same address with other values.
struct PackEntry {
  std::weak_ptr<Storage> storage;
  PackedWeight panels;
};
// One per thread: a scope packs only the weights its own thread multiplies inside it (those its
// owner promises unchanged), and another thread's scope ending cannot free panels in use here.
struct PackCache {
  int scopes = 0;
  std::unordered_map<PackKey, PackEntry, PackKeyHash> panels;  // nodes: references stay valid
};
PackCache& pack_cache() {
  thread_local PackCache c;
  return c;
}

bool same_owner(const std::weak_ptr<Storage>& a, const std::shared_ptr<Storage>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

// The panels of W (held by `storage`) while a scope lives on this thread, else nullptr. Panels
// whose storage has been freed are dropped when a weight is packed, so weights made per call do
// not pile up.
const PackedWeight* cached_panels(const float* w, const std::shared_ptr<Storage>& storage, int64_t ldw, int64_t n,
                                  int64_t k, bool bf16) {
  PackCache& c = pack_cache();
  if (c.scopes == 0) return nullptr;
  const PackKey key{w, n, k, ldw, bf16};
  auto it = c.panels.find(key);
  if (it != c.panels.end() && !it->second.storage.expired() && same_owner(it->second.storage, storage))
    return &it->second.panels;
  std::erase_if(c.panels, [](const auto& entry) { return entry.second.storage.expired(); });
  PackEntry& entry = c.panels[key];
  entry = {storage, bf16 ? pack_weight_bf16(w, ldw, n, k) : pack_weight(w, ldw, n, k)};
  return &entry.panels;
}

bool pack_cache_active() { return pack_cache().scopes > 0; }

}  // namespace

PackedWeightScope::PackedWeightScope() { ++pack_cache().scopes; }

PackedWeightScope::~PackedWeightScope() {
  PackCache& c = pack_cache();
  if (--c.scopes == 0) c.panels.clear();
}

Tensor invariant_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, InvariantBf16 bf16) {
  const bool weight_to_bf16 = bf16 == InvariantBf16::round_weight;
  detail::require_defined("invariant_linear", x, "x");
  detail::require_defined("invariant_linear", weight, "weight");
  QKV_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "[invariant_linear] x is ",
            shape_str(x.shape()), " but weight is ", shape_str(weight.shape()),
            ": need x [..., in] and weight [out, in]");
  QKV_CHECK(x.dtype() == DType::f32 && weight.dtype() == DType::f32,
            "[invariant_linear] x and weight must be float32, not ", dtype_name(x.dtype()), " and ",
            dtype_name(weight.dtype()));
  QKV_CHECK(x.device() == Device::cpu && weight.device() == Device::cpu, "[invariant_linear] runs on the CPU; x is on ",
            device_name(x.device()), ", weight on ", device_name(weight.device()));
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Tensor b;
  if (bias.defined()) {
    QKV_CHECK(
        bias.dim() == 1 && bias.size(0) == out_features && bias.dtype() == DType::f32 && bias.device() == Device::cpu,
        "[invariant_linear] bias is ", dtype_name(bias.dtype()), " ", shape_str(bias.shape()), " on ",
        device_name(bias.device()), ", need float32 [", out_features, "] on the CPU");
    b = bias.contiguous();
  }
  const bool rows_ok = (weight.stride(1) == 1 || in <= 1) && (weight.stride(0) >= in || out_features <= 1);
  Tensor w = rows_ok ? weight : weight.contiguous();
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  const bool scoped = rows <= kPackedRows && rows > 0 && pack_cache_active();
  // Outside a scope W is rounded into a float32 copy; inside, its bf16 panels are the rounding.
  if (weight_to_bf16 && !scoped) w = round_to_bf16(w);
  const Tensor x2 = x.reshape({rows, in}).contiguous();
  Tensor y = Tensor::empty({rows, out_features});
  const int64_t ldw = std::max<int64_t>(w.stride(0), in);
  const PackedWeight* packed =
      scoped ? cached_panels(w.data<float>(), w.storage(), ldw, out_features, in, weight_to_bf16) : nullptr;
  if (packed)
    invariant_linear(x2.data<float>(), std::max<int64_t>(in, 1), *packed, b.defined() ? b.data<float>() : nullptr,
                     y.data<float>(), std::max<int64_t>(out_features, 1), rows);
  else
    invariant_linear(x2.data<float>(), std::max<int64_t>(in, 1), w.data<float>(), ldw,
                     b.defined() ? b.data<float>() : nullptr, y.data<float>(), std::max<int64_t>(out_features, 1), rows,
                     out_features, in, bf16 != InvariantBf16::none);
  lead.push_back(out_features);
  return y.view(lead);
}

}  // namespace qkv::cpu
