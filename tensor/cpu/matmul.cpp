// Batched GEMM: out[i] = alpha * a[i] @ b[i] + beta * out[i], float32 on the kernel the CPU's
// features choose (tensor/cpu/gemm/gemm.h), float64 on the BLAS.
//   a [batch..., M, K], b [batch..., K, N], out [batch..., M, N]; batch dims already broadcast
//   (stride 0 where an operand is shared).
// Why it is written this way:
// - A transposed view (stride 1 along its rows) is the row-major storage of its transpose, so it
//   goes to BLAS as Trans with the other stride as leading dimension: x @ W^T never copies W.
// - When b is shared by every batch and a's batch dims are laid out back to back with its rows
//   (x [B, T, C] @ W), the batch folds into the row dim and the whole product is ONE GEMM, the
//   shape BLAS runs fastest.
// - Many small products (attention heads) run as an OpenMP loop over the batch. The OpenMP build
//   of OpenBLAS checks omp_in_parallel() and runs single-threaded inside our region (measured on
//   0.3.21: 2 threads x 1-thread sgemm inside the region reach the same 180 GFLOP/s as one
//   2-thread sgemm outside, so there is no oversubscription). Large products keep BLAS threads.
// - M == 1 or N == 1 (decode steps, vector operands) are matrix-vector products: memory-bound
//   passes over the matrix. They run on our own kernels split by size (tensor/cpu/parallel.h): one
//   thread below ~2 MB of matrix, else fixed chunks of output rows claimed by the caller and pool
//   helpers that sleep between calls. OpenBLAS's threaded GEMV forked an OpenMP team per call
//   (~50 per decoded token) whose barriers waited for, and spun beside, any descheduled thread:
//   on a busy machine 2 threads decoded 2x slower than 1. Chunks depend only on the shape, so the
//   result is bitwise the same for any thread count.
#include "tensor/cpu/matmul.h"

#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/cpu/parallel.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <vector>

namespace qkv::cpu {

GemmLayout gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t r1 = std::max<int64_t>(rows, 1), c1 = std::max<int64_t>(cols, 1);
  // A size-1 dim's stride is meaningless: pick the smallest leading dimension BLAS accepts.
  if (cols <= 1 || col_stride == 1) {
    const int64_t ld = rows <= 1 ? c1 : row_stride;
    if (ld >= c1 && ld <= INT_MAX) return {true, false, ld};
  }
  if (rows <= 1 || row_stride == 1) {
    const int64_t ld = cols <= 1 ? r1 : col_stride;
    if (ld >= r1 && ld <= INT_MAX) return {true, true, ld};
  }
  return {};
}

GemmLayout gemm_layout(const Tensor& t) {
  const int nd = t.dim();
  return gemm_layout(t.shape()[nd - 2], t.shape()[nd - 1], t.strides()[nd - 2], t.strides()[nd - 1]);
}

namespace {

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

// float32 goes through the GEMM dispatch points (tensor/cpu/gemm/): the kernel for this CPU, or
// under bf16 autocast the bf16 one.
inline void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                 float beta, float* c, int ldc, bool bf16) {
  if (bf16) sbgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b,
                 int ldb, double beta, double* c, int ldc, bool) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// Matrix-vector kernels; x is contiguous, alpha/beta as in BLAS (beta == 0: y is not read).
// rows form: y[i] = alpha * sum_k A[i, k] x[k] + beta * y[i] for i in [i0, i1), A rows of length K
// at stride lda. Four rows at a time share each load of x.
template <class T>
void gemv_rows(const T* A, int64_t lda, const T* x, int64_t K, T* y, int64_t incy, int64_t i0, int64_t i1, T alpha,
               T beta) {
  auto store = [&](int64_t i, T s) {
    T& out = y[i * incy];
    out = beta == T(0) ? alpha * s : alpha * s + beta * out;
  };
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    const T *a0 = A + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t k = 0; k < K; ++k) {
      s0 += a0[k] * x[k];
      s1 += a1[k] * x[k];
      s2 += a2[k] * x[k];
      s3 += a3[k] * x[k];
    }
    store(i, s0), store(i + 1, s1), store(i + 2, s2), store(i + 3, s3);
  }
  for (; i < i1; ++i) {
    const T* a0 = A + i * lda;
    T s0 = 0;
#pragma omp simd reduction(+ : s0)
    for (int64_t k = 0; k < K; ++k) s0 += a0[k] * x[k];
    store(i, s0);
  }
}

// columns form: y[j] = alpha * sum_k x[k] B[k, j] + beta * y[j] for j in [j0, j1) (j1 - j0 <=
// kColsChunk), B rows at stride ldb: rows of B stream in order, the partial sums stay in L1.
constexpr int64_t kColsChunk = 256;
template <class T>
void gemv_cols(const T* B, int64_t ldb, const T* x, int64_t K, T* y, int64_t incy, int64_t j0, int64_t j1, T alpha,
               T beta) {
  T acc[kColsChunk];
  const int64_t w = j1 - j0;
  std::fill(acc, acc + w, T(0));
  for (int64_t k = 0; k < K; ++k) {
    const T xk = x[k];
    const T* b = B + k * ldb + j0;
#pragma omp simd
    for (int64_t j = 0; j < w; ++j) acc[j] += xk * b[j];
  }
  for (int64_t j = 0; j < w; ++j) {
    T& out = y[(j0 + j) * incy];
    out = beta == T(0) ? alpha * acc[j] : alpha * acc[j] + beta * out;
  }
}

// y = alpha * op(A) x + beta * y with op(A) [n, K]: A stored [n, K] at stride lda (!trans, rows
// form) or [K, n] at stride lda (trans, columns form); x at stride incx, y at stride incy. Output
// rows go in chunks of ~kRowsChunkBytes of A (fixed by the shape), threads by the matrix's size.
template <class T>
void gemv_split(bool trans, int64_t n, int64_t K, T alpha, const T* A, int64_t lda, const T* x, int64_t incx, T beta,
                T* y, int64_t incy) {
  constexpr int64_t kRowsChunkBytes = 64 << 10;
  std::vector<T> xc;
  if (incx != 1) {  // a strided vector is gathered once (K elements) rather than read strided per row
    xc.resize(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) xc[static_cast<size_t>(k)] = x[k * incx];
    x = xc.data();
  }
  const int64_t per =
      trans ? kColsChunk : std::max<int64_t>(4, kRowsChunkBytes / std::max<int64_t>(1, K * int64_t(sizeof(T))) / 4 * 4);
  const int64_t chunks = (n + per - 1) / per;
  const int threads = split_threads(n * K * int64_t(sizeof(T)), omp_get_max_threads());
  run_split(chunks, threads, [&](int64_t c) {
    const int64_t i0 = c * per, i1 = std::min(n, i0 + per);
    if (trans) gemv_cols(A, lda, x, K, y, incy, i0, i1, alpha, beta);
    else gemv_rows(A, lda, x, K, y, incy, i0, i1, alpha, beta);
  });
}

// Everything about one product except where its three matrices start.
struct GemmPlan {
  int m = 0, n = 0, k = 0;
  GemmLayout la, lb;
  int ldc = 1;
  int64_t a_inc_k = 0;  // a's stride along K (for GEMV when M == 1)
  int64_t b_inc_k = 0;  // b's stride along K (for GEMV when N == 1)
  double alpha = 1, beta = 0;
  bool bf16 = false;  // bf16-valued float32 operands: the bf16 GEMM (GEMV stays float32: exact on them)
};

template <class T>
void gemm_one(const GemmPlan& p, const T* a, const T* b, T* c) {
  const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta);
  if (p.k == 0) {  // empty sum: out = beta * out
    for (int i = 0; i < p.m; ++i)
      for (int j = 0; j < p.n; ++j) c[int64_t(i) * p.ldc + j] = beta == T(0) ? T(0) : beta * c[int64_t(i) * p.ldc + j];
    return;
  }
  if (p.n == 1 && (p.b_inc_k != 0 || p.k == 1)) {
    // out column = A @ b column; A stored [M, K] (NoTrans) or [K, M] (Trans).
    const int64_t incx = p.k == 1 ? 1 : p.b_inc_k;
    gemv_split<T>(p.la.trans, p.m, p.k, alpha, a, p.la.ld, b, incx, beta, c, p.ldc);
    return;
  }
  if (p.m == 1 && (p.a_inc_k != 0 || p.k == 1)) {
    // out row = a row @ B = B^T a; B stored [N, K] (Trans: rows form) or [K, N] (NoTrans: columns).
    const int64_t incx = p.k == 1 ? 1 : p.a_inc_k;
    gemv_split<T>(!p.lb.trans, p.n, p.k, alpha, b, p.lb.ld, a, incx, beta, c, 1);
    return;
  }
  gemm(p.la.trans, p.lb.trans, p.m, p.n, p.k, alpha, a, static_cast<int>(p.la.ld), b, static_cast<int>(p.lb.ld), beta,
       c, p.ldc, p.bf16);
}

// If dims [0, nd-2] of t (batch dims and rows) walk like one row dim, its stride; 0 when all have
// size 1; -1 when they cannot merge.
int64_t merged_row_stride(const Tensor& t) {
  const Shape& sh = t.shape();
  const Strides& st = t.strides();
  int64_t row = 0, expect = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    if (sh[d] == 1) continue;
    if (row == 0) {
      row = st[d];
      if (row <= 0) return -1;
      expect = row * sh[d];
    } else {
      if (st[d] != expect) return -1;
      expect *= sh[d];
    }
  }
  return row;
}

// Offsets of every batch matrix of t (row-major order over the batch shape).
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t nb) {
  const int nbd = t.dim() - 2;
  std::vector<int64_t> off(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    int64_t rem = i, o = 0;
    for (int d = nbd - 1; d >= 0; --d) {
      o += (rem % t.shape()[d]) * t.strides()[d];
      rem /= t.shape()[d];
    }
    off[static_cast<size_t>(i)] = o;
  }
  return off;
}

template <class T>
void matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, bool bf16) {
  const int nd = out.dim();
  const int64_t m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a.shape()[nd - 1];
  int64_t nb = 1;
  for (int d = 0; d < nd - 2; ++d) nb *= out.shape()[d];
  if (nb == 0 || m == 0 || n == 0) return;

  GemmPlan p;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.la = gemm_layout(a);
  p.lb = gemm_layout(b);
  const GemmLayout lc = gemm_layout(out);
  p.ldc = static_cast<int>(lc.ld);
  p.a_inc_k = a.strides()[nd - 1];
  p.b_inc_k = b.strides()[nd - 2];
  p.alpha = alpha;
  p.beta = beta;
  p.bf16 = bf16;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();

  if (nb == 1) {
    gemm_one<T>(p, pa, pb, pc);
    return;
  }

  // b shared by every batch, a and out walk their batches like extra rows: one tall GEMM.
  bool b_shared = true;
  for (int d = 0; d < nd - 2; ++d)
    if (out.shape()[d] != 1 && b.strides()[d] != 0) b_shared = false;
  if (b_shared && !p.la.trans && nb * m <= INT_MAX) {
    const int64_t ra = merged_row_stride(a), rc = merged_row_stride(out);
    if (ra >= std::max<int64_t>(k, 1) && rc >= n && ra <= INT_MAX && rc <= INT_MAX && (k <= 1 || p.a_inc_k == 1)) {
      GemmPlan q = p;
      q.m = static_cast<int>(nb * m);
      q.la = {true, false, ra};
      q.ldc = static_cast<int>(rc);
      gemm_one<T>(q, pa, pb, pc);
      return;
    }
  }

  const std::vector<int64_t> oa = batch_offsets(a, nb), ob = batch_offsets(b, nb), oc = batch_offsets(out, nb);
  const int threads = omp_get_max_threads();
  const int64_t macs = m * n * k;
  // Small products: one BLAS call per thread at a time beats splitting each tiny GEMM over threads.
  const bool over_batch =
      threads > 1 && !omp_in_parallel() && (nb >= 2 * threads || (nb >= threads && macs <= (int64_t(1) << 21)));
  if (over_batch) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nb; ++i) gemm_one<T>(p, pa + oa[i], pb + ob[i], pc + oc[i]);
  } else {
    for (int64_t i = 0; i < nb; ++i) gemm_one<T>(p, pa + oa[i], pb + ob[i], pc + oc[i]);
  }
}

template <class T>
void fill_rows_typed(const Tensor& out, const Tensor& row) {
  const int64_t r = out.shape()[0], c = out.shape()[1], rs = out.strides()[0];
  const Tensor src = row.contiguous();
  const T* s = src.data<T>();
  T* o = out.data<T>();
// A broadcast copy is memory-bound: threads pay off only when it is well beyond a fork/join's cost.
#pragma omp parallel for schedule(static) if (r * c >= (int64_t(1) << 19) && !omp_in_parallel())
  for (int64_t i = 0; i < r; ++i) std::copy(s, s + c, o + i * rs);
}

}  // namespace

void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta,
                    bool bf16_operands) {
  if (out.dtype() == DType::f32) matmul_typed<float>(a, b, out, alpha, beta, bf16_operands);
  else matmul_typed<double>(a, b, out, alpha, beta, false);
}

void fill_rows(const Tensor& out, const Tensor& row) {
  if (out.dtype() == DType::f32) fill_rows_typed<float>(out, row);
  else fill_rows_typed<double>(out, row);
}

std::string blas_kernel_name() {
  // Looked up at run time, not linked, so qkv still links against a BLAS without this extension.
  using CoreName = char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = corename ? corename() : nullptr;
  return name && *name ? name : "unknown";
}

}  // namespace qkv::cpu
