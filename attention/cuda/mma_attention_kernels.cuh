// The device part of the tensor-core attention (host side in mma_attention.cu; design and limits in
// mma_attention.h): kernels, their building blocks and the Params they take. A header so that the
// host emulation test (tests/emulation/) compiles this very code with a host compiler: it defines
// QKV_MMA_EMULATION and supplies, before including this file, the CUDA names used here (thread
// indices, vector types, bf16, __syncthreads, __shfl_xor_sync) and the four hooks below
// (mma_bf16_m16n8k16, ldmatrix_x4, ldmatrix_x2, QKV_DYNAMIC_SMEM). Everything sits in an unnamed
// namespace, as it did in the .cu: each includer gets its own internal copy.
//
// Per (b, h) with s = scale, pos_i = Nk − Nq + i, and visible(i, j) the structural mask
//   j < key_end (= min(Nk, key_lengths[b]))  and  j <= pos_i (causal or window)  and  j > pos_i − w (window w),
// the kernels compute, with logits kept in log2 units (t = s·log2(e)·q_i·k_j, so e^x = 2^(x·log2 e)):
//   forward   m_i = max_j t_ij, l_i = Σ_j 2^(t_ij − m_i), O_i = Σ_j bf16(2^(t_ij − m_i))·v_j / l_i,
//             lse_i = m_i·ln 2 + ln l_i           (online over key tiles: m, l and O rescaled by 2^(m_old − m_new))
//   backward  P_ij = 2^(t_ij − lse_i·log2 e), dP_ij = dO_i·v_j, Di = dO_i·O_i, dS_ij = P_ij (dP_ij − Di)
//             dV_j = Σ_(h,i) bf16(P_ij) dO_i,  dK_j = s·Σ_(h,i) bf16(dS_ij) q_i,  dQ_i = s·Σ_j bf16(dS_ij) k_j
// Masked entries have P = 0. Operands of every product are bf16 (exact: the inputs are bf16 values),
// products accumulate in float32.
//
// MMA: mma.sync.m16n8k16 (bf16 × bf16 → f32). Lane l = 4·g + t (g = l / 4, t = l % 4) holds
//   A (16 × 16, row-major):  a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]
//   B (16 × 8, k × n):       b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 × 8, float32):     c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1]
// (two bf16 per 32-bit register, the lower index in the low half). Fragments come from shared
// memory by ldmatrix (m8n8, b16): each 8 × 8 bf16 matrix is named by the addresses of its 8 rows
// (16 bytes each, given by lanes 8i..8i+7 for matrix i), and lane l receives row l/4, columns
// 2(l%4)..2(l%4)+1 of matrix i in register i: exactly the A/B fragment layout above. So an A
// fragment is one .x4 (matrices: rows 0-7 / 8-15 × columns 0-7 / 8-15), and a B fragment one .x2
// of Bᵀ rows. Every B operand here is kept in shared memory as Bᵀ, i.e. [n][k] with k contiguous;
// that is why V (forward), K (dQ) and Q, dO (dK/dV) are staged a second time transposed. The C layout of
// two adjacent 8-column tiles is the A layout of one 16-wide k-step, so P and dS go from the
// accumulators of one product straight into the A registers of the next.
//
// Shared-memory rows are padded by 8 bf16 (16 bytes): with a row stride of 16 bytes mod 128, the 8
// rows of one ldmatrix phase (16 bytes each) hit 32 different banks, and every row address stays
// 16-byte aligned, as ldmatrix requires.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attention/cuda/pattern_predicate.cuh"

#ifndef QKV_MMA_EMULATION
#include <cuda_bf16.h>

// The block's dynamic shared memory (its size is the launch's third parameter).
#define QKV_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace qkv::attn::cuda_mma {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarp = 32;
constexpr int kWarps = 4;  // per CTA
constexpr int kThreads = kWarps * kWarp;
constexpr int kWarpRows = 16;                   // MMA rows per warp
constexpr int kBlockRows = kWarps * kWarpRows;  // query rows (forward, dQ) or keys (dK/dV) per CTA
constexpr int kPad = 8;                         // bf16 per shared-memory row beyond the tile width
constexpr int kLayoutTile = 64;                 // a sparse pattern's layout grid: 64 query rows × 64 keys
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.69314718055994531f;
constexpr unsigned kFull = 0xffffffffu;

// (Unqualified min/max would find the tensor ops of namespace qkv.)
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// One [B, H, N, D] float32 operand: rows contiguous along D, 16-byte aligned (float4 reads).
struct Operand {
  const float* data = nullptr;
  int64_t sb = 0, sh = 0, sn = 0;
};
__device__ __forceinline__ const float* head_of(const Operand& o, int64_t b, int64_t h) {
  return o.data + b * o.sb + h * o.sh;
}

struct Params {
  Operand q, k, v, out, dout;
  const float* lse = nullptr;  // [B, Hq, Nq] (backward)
  const float* di = nullptr;   // [B, Hq, Nq] (backward)
  float *o_w = nullptr, *lse_w = nullptr, *di_w = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int Hq = 0, Hkv = 0, G = 1, Nq = 0, Nk = 0, q_offset = 0, window = 0;
  bool causal_like = false;
  const int64_t* key_len = nullptr;  // [B] on the device, or null
  float scale = 1, scale_log2 = kLog2e;
  // A sparse pattern (pat.kind 0: none) and its block layout on the kBlockRows × kKeyTile grid:
  // by_q (CSR, per 64-row query block: forward, dQ), by_k (CSC, per 64-key block: dK/dV).
  DevicePattern pat;
  DeviceLayout by_q, by_k;
};

// The structural mask of one batch row (documented at the top of the file).
struct Visibility {
  int Nq, key_end, q_offset, window;
  bool causal_like;
  __device__ __forceinline__ bool operator()(int i, int j) const {
    const int p = q_offset + i;
    return i < Nq && j < key_end && (!causal_like || j <= p) && (window <= 0 || j > p - window);
  }
  // Keys [*j0, *j1) that some query row in [i0, i1) may see (the interval only moves right with i).
  __device__ __forceinline__ void keys_for_rows(int i0, int i1, int* j0, int* j1) const {
    *j0 = window > 0 ? imax(0, q_offset + i0 - window + 1) : 0;
    *j1 = causal_like ? imin(key_end, q_offset + i1) : key_end;
  }
  // Query rows [*i0, *i1) that may see some key in [j0, j1): pos >= j0 (causal), pos < j1 − 1 + w (window).
  __device__ __forceinline__ void rows_for_keys(int j0, int j1, int* i0, int* i1) const {
    *i0 = causal_like ? imax(0, j0 - q_offset) : 0;
    *i1 = window > 0 ? imin(Nq, imax(0, j1 - 1 + window - q_offset)) : Nq;
    if (j0 >= key_end) *i1 = *i0;
  }
};
__device__ __forceinline__ Visibility visibility_of(const Params& a, int64_t b) {
  int key_end = a.Nk;
  if (a.key_len) key_end = static_cast<int>(a.key_len[b] < 0 ? 0 : (a.key_len[b] < a.Nk ? a.key_len[b] : a.Nk));
  return {a.Nq, key_end, a.q_offset, a.window, a.causal_like};
}

// The inner tiles (of `tile` rows, a divisor of 64) that outer block o (64 query rows, or 64 keys
// for dK/dV) visits within [begin, end): every tile from `begin` without a pattern; with one, the
// sub-tiles of the layout's non-empty 64-wide tiles in `walk`, aligned at multiples of 64 (rows
// outside [begin, end) are masked by Visibility). Step `step` gives the first row (or -1: nothing
// to do, uniform across the block) and whether the layout tile is full (no pattern test needed).
struct LayoutWalk {
  const Params* a;
  const DeviceLayout* walk;
  int o, begin, end, tile;
  __device__ __forceinline__ int steps() const {
    if (a->pat.kind != 0) return static_cast<int>(walk->ptr[o + 1] - walk->ptr[o]) * (kLayoutTile / tile);
    return end > begin ? (end - begin + tile - 1) / tile : 0;
  }
  __device__ __forceinline__ int first(int step, bool* full) const {
    if (a->pat.kind == 0) {
      *full = true;
      return begin + step * tile;
    }
    const int64_t t = walk->tiles[walk->ptr[o] + step / (kLayoutTile / tile)];
    *full = (t & 1) != 0;
    const int r0 = static_cast<int>(t >> 1) * kLayoutTile + (step % (kLayoutTile / tile)) * tile;
    return r0 < end && r0 + tile > begin ? r0 : -1;
  }
};

// ---- MMA building blocks (layouts at the top of the file).

// c += A·B for one warp (a collective: all 32 lanes take part, each with its fragments). The host
// emulator defines its own, which gathers the 32 lanes' fragments and multiplies the matrices.
#ifndef QKV_MMA_EMULATION
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// ldmatrix .x4 / .x2 (layout at the top of the file): `row` is this lane's row address. Every lane
// of the warp takes part. The host emulator defines its own, which gathers the lanes' addresses.
#ifndef QKV_MMA_EMULATION
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const bf16* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr)
               : "memory");
}
#endif

// Two floats rounded to bf16 (nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// A fragment of the 16 × 16 block at `a` (row-major, row stride lda, in shared memory): lanes
// 0-7 name rows 0-7 (a0), 8-15 rows 8-15 (a1), 16-23 rows 0-7 at column 8 (a2), 24-31 rows 8-15
// at column 8 (a3).
__device__ __forceinline__ void load_a(uint32_t (&f)[4], const bf16* a, int lda, int lane) {
  ldmatrix_x4(f, a + ((lane & 7) + ((lane >> 3) & 1) * 8) * lda + (lane >> 4) * 8);
}
// A fragments of two float32 rows in global memory (rows g and g + 8 of a warp's 16; null = a zero
// row past the end), all KS k-steps of the head dim.
template <int KS>
__device__ __forceinline__ void load_a_rows(uint32_t (&f)[KS][4], const float* row_g, const float* row_g8, int lane) {
  const int c = 2 * (lane & 3);
  auto pair = [](const float* row, int col) {
    if (!row) return 0u;
    const float2 x = *reinterpret_cast<const float2*>(row + col);
    return pack_bf16(x.x, x.y);
  };
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    f[kk][0] = pair(row_g, kk * 16 + c);
    f[kk][1] = pair(row_g8, kk * 16 + c);
    f[kk][2] = pair(row_g, kk * 16 + c + 8);
    f[kk][3] = pair(row_g8, kk * 16 + c + 8);
  }
}
// B fragment of a 16 (k) × 8 (n) block stored transposed at `bt`: [n][k], row stride ldb.
// Lanes 0-7 name rows n = 0-7 at k 0 (b0), lanes 8-15 the same rows at k 8 (b1); the .x2 form
// ignores lanes 16-31's addresses.
__device__ __forceinline__ void load_bt(uint32_t& b0, uint32_t& b1, const bf16* bt, int ldb, int lane) {
  ldmatrix_x2(b0, b1, bt + (lane & 7) * ldb + ((lane >> 3) & 1) * 8);
}

// c (16 × 8·NT) += A (16 × 16·KS, fragments) · B, B given as Bᵀ rows [8·NT][16·KS] at bt.
template <int NT, int KS>
__device__ __forceinline__ void gemm_abt(float (&c)[NT][4], const uint32_t (&a)[KS][4], const bf16* bt, int ldb,
                                         int lane) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t b0, b1;
      load_bt(b0, b1, bt + n * 8 * ldb + kk * 16, ldb, lane);
      mma_bf16_m16n8k16(c[n], a[kk], b0, b1);
    }
}
// The same with A's 16 rows in shared memory at `a` (row stride lda), one k-step at a time.
template <int NT, int KS>
__device__ __forceinline__ void gemm_abt_smem(float (&c)[NT][4], const bf16* a, int lda, const bf16* bt, int ldb,
                                              int lane) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t f[4];
    load_a(f, a + kk * 16, lda, lane);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t b0, b1;
      load_bt(b0, b1, bt + n * 8 * ldb + kk * 16, ldb, lane);
      mma_bf16_m16n8k16(c[n], f, b0, b1);
    }
  }
}
// c (16 × 8·NT) += bf16(P) · B with P (16 × 8·NP) in accumulator layout: tiles 2kk and 2kk + 1 of P
// are the A fragment of k-step kk. B given as Bᵀ rows [8·NT][8·NP] at bt.
template <int NT, int NP>
__device__ __forceinline__ void gemm_pbt(float (&c)[NT][4], const float (&p)[NP][4], const bf16* bt, int ldb,
                                         int lane) {
#pragma unroll
  for (int kk = 0; kk < NP / 2; ++kk) {
    const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                           pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      uint32_t b0, b1;
      load_bt(b0, b1, bt + n * 8 * ldb + kk * 16, ldb, lane);
      mma_bf16_m16n8k16(c[n], a, b0, b1);
    }
  }
}

// ---- Staging float32 rows into bf16 shared-memory tiles (the whole CTA takes part).

// dst[r][c] = bf16(src[r·rs + c]) for r < valid, 0 for valid <= r < rows; c < W (row stride ld).
template <int W>
__device__ __forceinline__ void stage_rows(bf16* dst, int ld, const float* src, int64_t rs, int valid, int rows) {
  constexpr int kVec = W / 4;
  for (int e = threadIdx.x; e < rows * kVec; e += blockDim.x) {
    const int r = e / kVec, c = (e % kVec) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < valid) x = *reinterpret_cast<const float4*>(src + r * rs + c);
    *reinterpret_cast<uint2*>(dst + r * ld + c) = make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
  }
}
// The transpose: dst[c][r] = bf16(src[r·rs + c]) (row stride ld), zero for valid <= r < rows.
template <int W>
__device__ __forceinline__ void stage_cols(bf16* dst, int ld, const float* src, int64_t rs, int valid, int rows) {
  constexpr int kVec = W / 4;
  for (int e = threadIdx.x; e < rows * kVec; e += blockDim.x) {
    const int r = e / kVec, c = (e % kVec) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < valid) x = *reinterpret_cast<const float4*>(src + r * rs + c);
    dst[(c + 0) * ld + r] = __float2bfloat16_rn(x.x);
    dst[(c + 1) * ld + r] = __float2bfloat16_rn(x.y);
    dst[(c + 2) * ld + r] = __float2bfloat16_rn(x.z);
    dst[(c + 3) * ld + r] = __float2bfloat16_rn(x.w);
  }
}

// Writes the warp's 16 × D accumulator rows (rows g and g + 8 of this lane) times `mul` to
// dst rows (contiguous, width D); rows at or past `nrows` are skipped.
template <int NT>
__device__ __forceinline__ void store_rows(float* dst, int row_g, int nrows, const float (&c)[NT][4], float mul_g,
                                           float mul_g8, int lane) {
  constexpr int D = NT * 8;
  const int col = 2 * (lane & 3);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_g + 8 * r;
    if (row >= nrows) continue;
    const float mul = r == 0 ? mul_g : mul_g8;
    float* out = dst + static_cast<int64_t>(row) * D;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<float2*>(out + n * 8 + col) = make_float2(c[n][2 * r] * mul, c[n][2 * r + 1] * mul);
  }
}

// The sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFull, x, 1);
  return x + __shfl_xor_sync(kFull, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFull, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFull, x, 2));
}

// lse in log2 units for recomputing P = 2^(t − lse·log2 e); a row with no visible key (−inf) and a
// padding row get +inf, so their P is 0.
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// ---- Kernels.

constexpr int kKeyTile = 64;  // keys per shared-memory tile in the forward kernel
static_assert(kBlockRows == kLayoutTile && kKeyTile == kLayoutTile, "the layout grid is the forward's tiles");

template <int D>
constexpr size_t forward_smem() {
  return sizeof(bf16) * (kKeyTile * (D + kPad) + D * (kKeyTile + kPad));
}

// grid (B·Hq, ceil(Nq / 64)): 64 query rows of head h; warp w owns rows 16w .. 16w + 15.
template <int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Params a) {
  constexpr int KS = D / 16, NO = D / 8, NS = kKeyTile / 8, ldk = D + kPad, ldv = kKeyTile + kPad;
  QKV_DYNAMIC_SMEM(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem);  // K tile [64 keys][D]
  bf16* vt = ks + kKeyTile * ldk;            // V tile transposed [D][64 keys]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, hk = h / a.G;
  const int i_block = blockIdx.y * kBlockRows, row_g = i_block + warp * kWarpRows + (lane >> 2);
  const int rows[2] = {row_g, row_g + 8};
  const Visibility vis = visibility_of(a, b);
  int j_begin, j_end;
  vis.keys_for_rows(i_block, imin(i_block + kBlockRows, a.Nq), &j_begin, &j_end);

  const float* qh = head_of(a.q, b, h);
  uint32_t qf[KS][4];
  load_a_rows<KS>(qf, rows[0] < a.Nq ? qh + rows[0] * a.q.sn : nullptr,
                  rows[1] < a.Nq ? qh + rows[1] * a.q.sn : nullptr, lane);
  float o[NO][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // l_run: this lane's part of the row sum
  const float* kh = head_of(a.k, b, hk);
  const float* vh = head_of(a.v, b, hk);
  const LayoutWalk walk{&a, &a.by_q, static_cast<int>(blockIdx.y), j_begin, j_end, kKeyTile};
  for (int step = 0, steps = walk.steps(); step < steps; ++step) {
    bool full;
    const int j0 = walk.first(step, &full);
    if (j0 < 0) continue;
    const int nk = imin(kKeyTile, j_end - j0);
    __syncthreads();  // the previous tile is consumed
    stage_rows<D>(ks, ldk, kh + j0 * a.k.sn, a.k.sn, nk, kKeyTile);
    stage_cols<D>(vt, ldv, vh + j0 * a.v.sn, a.v.sn, nk, kKeyTile);
    __syncthreads();
    float s[NS][4] = {};
    gemm_abt<NS, KS>(s, qf, ks, ldk, lane);
    float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = j0 + n * 8 + 2 * (lane & 3) + (c & 1), i = rows[c >> 1];
        const bool keep = vis(i, j) && (full || pattern_allows(a.pat, a.q_offset + i, j));
        s[n][c] = keep ? s[n][c] * a.scale_log2 : -INFINITY;
        mx[c >> 1] = fmaxf(mx[c >> 1], s[n][c]);
      }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -INFINITY ? 0.f : mx[r];  // a row with nothing visible yet: 2^(−inf − 0) = 0
      const float alpha = exp2f(m_run[r] - base[r]);
      m_run[r] = mx[r];
      l_run[r] *= alpha;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[n][c] = exp2f(s[n][c] - base[c >> 1]);
        l_run[c >> 1] += s[n][c];
      }
    gemm_pbt<NO, NS>(o, s, vt, ldv, lane);
  }
  float inv[2];
  const int64_t row0 = bh * a.Nq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(l_run[r]);
    inv[r] = l > 0.f ? 1.f / l : 0.f;  // no visible key: a zero row
    if ((lane & 3) == 0 && rows[r] < a.Nq) a.lse_w[row0 + rows[r]] = l > 0.f ? m_run[r] * kLn2 + logf(l) : -INFINITY;
  }
  store_rows<NO>(a.o_w + row0 * D, row_g, a.Nq, o, inv[0], inv[1], lane);
}

// Di = dO_i · O_i in float32, one warp per query row (rows of width D).
__global__ void __launch_bounds__(kThreads) di_kernel(Params a, int64_t nrows, int D) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= nrows) return;
  const int64_t i = row % a.Nq, h = (row / a.Nq) % a.Hq, b = row / (static_cast<int64_t>(a.Nq) * a.Hq);
  const float* d = head_of(a.dout, b, h) + i * a.dout.sn;
  const float* o = head_of(a.out, b, h) + i * a.out.sn;
  float s = 0.f;
  for (int c = lane; c < D; c += kWarp) s += d[c] * o[c];
  for (int off = kWarp / 2; off > 0; off /= 2) s += __shfl_xor_sync(kFull, s, off);
  if (lane == 0) a.di_w[row] = s;
}

template <int D, int BK>
constexpr size_t dq_smem() {
  return sizeof(bf16) * (2 * BK * (D + kPad) + D * (BK + kPad));
}

// dQ: grid (B·Hq, ceil(Nq / 64)), warp w owns query rows 16w .. 16w + 15; key tiles of BK.
template <int D, int BK>
__global__ void __launch_bounds__(kThreads) dq_kernel(Params a) {
  constexpr int KS = D / 16, NO = D / 8, NS = BK / 8, ldk = D + kPad, ldt = BK + kPad;
  QKV_DYNAMIC_SMEM(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem);  // K tile [BK][D]
  bf16* vs = ks + BK * ldk;                  // V tile [BK][D]
  bf16* kt = vs + BK * ldk;                  // K tile transposed [D][BK]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t bh = blockIdx.x, b = bh / a.Hq, h = bh % a.Hq, hk = h / a.G;
  const int i_block = blockIdx.y * kBlockRows, row_g = i_block + warp * kWarpRows + (lane >> 2);
  const int rows[2] = {row_g, row_g + 8};
  const Visibility vis = visibility_of(a, b);
  int j_begin, j_end;
  vis.keys_for_rows(i_block, imin(i_block + kBlockRows, a.Nq), &j_begin, &j_end);

  const float* qh = head_of(a.q, b, h);
  const float* dh = head_of(a.dout, b, h);
  uint32_t qf[KS][4], df[KS][4];
  load_a_rows<KS>(qf, rows[0] < a.Nq ? qh + rows[0] * a.q.sn : nullptr,
                  rows[1] < a.Nq ? qh + rows[1] * a.q.sn : nullptr, lane);
  load_a_rows<KS>(df, rows[0] < a.Nq ? dh + rows[0] * a.dout.sn : nullptr,
                  rows[1] < a.Nq ? dh + rows[1] * a.dout.sn : nullptr, lane);
  const int64_t row0 = bh * a.Nq;
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse2[r] = rows[r] < a.Nq ? lse_log2(a.lse[row0 + rows[r]]) : INFINITY;
    di[r] = rows[r] < a.Nq ? a.di[row0 + rows[r]] : 0.f;
  }
  float dq[NO][4] = {};
  const float* kh = head_of(a.k, b, hk);
  const float* vh = head_of(a.v, b, hk);
  const LayoutWalk walk{&a, &a.by_q, static_cast<int>(blockIdx.y), j_begin, j_end, BK};
  for (int step = 0, steps = walk.steps(); step < steps; ++step) {
    bool full;
    const int j0 = walk.first(step, &full);
    if (j0 < 0) continue;
    const int nk = imin(BK, j_end - j0);
    __syncthreads();
    stage_rows<D>(ks, ldk, kh + j0 * a.k.sn, a.k.sn, nk, BK);
    stage_rows<D>(vs, ldk, vh + j0 * a.v.sn, a.v.sn, nk, BK);
    stage_cols<D>(kt, ldt, kh + j0 * a.k.sn, a.k.sn, nk, BK);
    __syncthreads();
    float s[NS][4] = {}, dp[NS][4] = {};
    gemm_abt<NS, KS>(s, qf, ks, ldk, lane);   // Q·Kᵀ
    gemm_abt<NS, KS>(dp, df, vs, ldk, lane);  // dO·Vᵀ
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = c >> 1, j = j0 + n * 8 + 2 * (lane & 3) + (c & 1);
        const bool keep = vis(rows[r], j) && (full || pattern_allows(a.pat, a.q_offset + rows[r], j));
        const float p = keep ? exp2f(s[n][c] * a.scale_log2 - lse2[r]) : 0.f;
        s[n][c] = p * (dp[n][c] - di[r]);  // dS
      }
    gemm_pbt<NO, NS>(dq, s, kt, ldt, lane);  // dS·K
  }
  store_rows<NO>(a.dq + row0 * D, row_g, a.Nq, dq, a.scale, a.scale, lane);
}

template <int D, int BQ>
constexpr size_t dkv_smem() {
  return sizeof(bf16) * (2 * kBlockRows * (D + kPad) + 2 * BQ * (D + kPad) + 2 * D * (BQ + kPad)) +
         sizeof(float) * 2 * BQ;
}

// dK, dV: grid (B·Hkv, ceil(Nk / 64)), warp w owns keys 16w .. 16w + 15 of the block and computes
// Sᵀ = K·Qᵀ (keys as rows), so each warp's dK/dV rows stay in its registers. Query heads of the
// group, then query tiles of BQ rows, are visited in order.
template <int D, int BQ>
__global__ void __launch_bounds__(kThreads) dkv_kernel(Params a) {
  constexpr int KS = D / 16, NO = D / 8, NS = BQ / 8, ldk = D + kPad, ldt = BQ + kPad;
  QKV_DYNAMIC_SMEM(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem);               // K block [64][D]
  bf16* vs = ks + kBlockRows * ldk;                       // V block [64][D]
  bf16* qs = vs + kBlockRows * ldk;                       // Q tile [BQ][D]
  bf16* ds = qs + BQ * ldk;                               // dO tile [BQ][D]
  bf16* qt = ds + BQ * ldk;                               // Q tile transposed [D][BQ]
  bf16* dt = qt + D * ldt;                                // dO tile transposed [D][BQ]
  float* lse2s = reinterpret_cast<float*>(dt + D * ldt);  // [BQ]
  float* dis = lse2s + BQ;                                // [BQ]
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t bk = blockIdx.x, b = bk / a.Hkv, hk = bk % a.Hkv;
  const int j_block = blockIdx.y * kBlockRows, key_g = j_block + warp * kWarpRows + (lane >> 2);
  const int keys[2] = {key_g, key_g + 8};
  const Visibility vis = visibility_of(a, b);
  int i_begin, i_end;
  vis.rows_for_keys(j_block, imin(j_block + kBlockRows, a.Nk), &i_begin, &i_end);

  const int nkeys = imin(kBlockRows, a.Nk - j_block);
  stage_rows<D>(ks, ldk, head_of(a.k, b, hk) + j_block * a.k.sn, a.k.sn, nkeys, kBlockRows);
  stage_rows<D>(vs, ldk, head_of(a.v, b, hk) + j_block * a.v.sn, a.v.sn, nkeys, kBlockRows);
  const bf16* k_warp = ks + warp * kWarpRows * ldk;
  const bf16* v_warp = vs + warp * kWarpRows * ldk;
  float dk[NO][4] = {}, dv[NO][4] = {};
  for (int g = 0; g < a.G; ++g) {
    const int64_t h = hk * a.G + g, row0 = (b * a.Hq + h) * a.Nq;
    const float* qh = head_of(a.q, b, h);
    const float* dh = head_of(a.dout, b, h);
    const LayoutWalk walk{&a, &a.by_k, static_cast<int>(blockIdx.y), i_begin, i_end, BQ};
    for (int step = 0, steps = walk.steps(); step < steps; ++step) {
      bool full;
      const int i0 = walk.first(step, &full);
      if (i0 < 0) continue;
      const int nq = imin(BQ, i_end - i0);
      __syncthreads();  // the previous tile is consumed (and, the first time, K and V are staged)
      stage_rows<D>(qs, ldk, qh + i0 * a.q.sn, a.q.sn, nq, BQ);
      stage_rows<D>(ds, ldk, dh + i0 * a.dout.sn, a.dout.sn, nq, BQ);
      stage_cols<D>(qt, ldt, qh + i0 * a.q.sn, a.q.sn, nq, BQ);
      stage_cols<D>(dt, ldt, dh + i0 * a.dout.sn, a.dout.sn, nq, BQ);
      for (int e = threadIdx.x; e < BQ; e += blockDim.x) {
        lse2s[e] = e < nq ? lse_log2(a.lse[row0 + i0 + e]) : INFINITY;
        dis[e] = e < nq ? a.di[row0 + i0 + e] : 0.f;
      }
      __syncthreads();
      float st[NS][4] = {}, dpt[NS][4] = {};
      gemm_abt_smem<NS, KS>(st, k_warp, ldk, qs, ldk, lane);   // K·Qᵀ
      gemm_abt_smem<NS, KS>(dpt, v_warp, ldk, ds, ldk, lane);  // V·dOᵀ
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int col = n * 8 + 2 * (lane & 3) + (c & 1), i = i0 + col, j = keys[c >> 1];
          const bool keep = vis(i, j) && (full || pattern_allows(a.pat, a.q_offset + i, j));
          const float p = keep ? exp2f(st[n][c] * a.scale_log2 - lse2s[col]) : 0.f;
          st[n][c] = p;                            // Pᵀ
          dpt[n][c] = p * (dpt[n][c] - dis[col]);  // dSᵀ
        }
      gemm_pbt<NO, NS>(dv, st, dt, ldt, lane);   // Pᵀ·dO
      gemm_pbt<NO, NS>(dk, dpt, qt, ldt, lane);  // dSᵀ·Q
    }
  }
  const int64_t key0 = bk * a.Nk;
  store_rows<NO>(a.dk + key0 * D, key_g, a.Nk, dk, a.scale, a.scale, lane);
  store_rows<NO>(a.dv + key0 * D, key_g, a.Nk, dv, 1.f, 1.f, lane);
}

// Query tile of the dK/dV kernel and key tile of the dQ kernel: 64 at D = 64; 32 at D = 128, where
// 64 would hold 2 × 32 more float32 registers per lane next to the 2 × 64 of the accumulators.
template <int D>
constexpr int kBackwardTile = D == 64 ? 64 : 32;

}  // namespace
}  // namespace qkv::attn::cuda_mma
