// GEMM on cuBLAS. cuBLAS is column-major; a row-major C[M,N] = A[M,K]·B[K,N] is, read as
// column-major, Cᵀ[N,M] = Bᵀ[N,K]·Aᵀ[K,M], so the call passes B before A with N and M swapped.
// A row-major operand stored NoTrans with leading dimension ld is, column-major, its own transpose
// with that ld (op N); one stored as a row-major transpose is the matrix itself (op T). Batch
// dims: one strided-batched call over the last batch dim (any stride, 0 for broadcast), looped
// over the others on the host.
//
// cuBLAS is opened with dlopen on the first GEMM rather than linked: linking it maps and relocates
// libcublas and libcublasLt at every start (~150 MB of resident memory), which a CPU-only run
// would pay for nothing.

#include <cublas_v2.h>

#include <string>
#include <vector>

#include "tensor/cpu/matmul.h"
#include "tensor/dynamic_library.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/kernels.h"

namespace qkv::cuda {
namespace {

// The few cuBLAS entry points qkv calls, resolved from the shared library at first use.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetAtomicsMode) set_atomics_mode = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
  // Spelled out: the C++ header overloads this name.
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  cublasHandle_t handle = nullptr;
};

void check(const Cublas& c, cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("[cuda] ", call, " failed: ", c.status_string ? c.status_string(st) : "?");
}

const Cublas& cublas() {
  static const Cublas api = [] {
    const char* what = "[cuda] cuBLAS";
    void* lib = open_first_library({"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, what);
    Cublas c;
    resolve_symbol(lib, "cublasCreate_v2", &c.create, what);
    resolve_symbol(lib, "cublasSetAtomicsMode", &c.set_atomics_mode, what);
    resolve_symbol(lib, "cublasSgemmStridedBatched", &c.sgemm_strided_batched, what);
    resolve_symbol(lib, "cublasDgemmStridedBatched", &c.dgemm_strided_batched, what);
    resolve_symbol(lib, "cublasGemmStridedBatchedEx", &c.gemm_strided_batched_ex, what);
    resolve_symbol(lib, "cublasGetStatusString", &c.status_string, what);
    check(c, c.create(&c.handle), "cublasCreate");
    // Deterministic by default: no split-K with atomics in the results.
    check(c, c.set_atomics_mode(c.handle, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
    return c;
  }();
  return api;
}

inline cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

void gemm_batched(bool ta, bool tb, int m, int n, int k, double alpha, const Tensor& a, int64_t a_off, int lda,
                  int64_t a_bs, const Tensor& b, int64_t b_off, int ldb, int64_t b_bs, double beta, const Tensor& out,
                  int64_t c_off, int ldc, int64_t c_bs, int batch) {
  if (a.dtype() == DType::bf16) {
    // bf16 operands, float32 output and accumulation: tensor cores.
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const uint16_t* A = static_cast<const uint16_t*>(a.raw_data()) + a_off;
    const uint16_t* B = static_cast<const uint16_t*>(b.raw_data()) + b_off;
    float* C = static_cast<float*>(out.raw_data()) + c_off;
    const Cublas& c = cublas();
    check(c,
          c.gemm_strided_batched_ex(c.handle, op(tb), op(ta), n, m, k, &al, B, CUDA_R_16BF, ldb, b_bs, A, CUDA_R_16BF,
                                    lda, a_bs, &be, C, CUDA_R_32F, ldc, c_bs, batch, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  } else if (out.dtype() == DType::f32) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const float* A = static_cast<const float*>(a.raw_data()) + a_off;
    const float* B = static_cast<const float*>(b.raw_data()) + b_off;
    float* C = static_cast<float*>(out.raw_data()) + c_off;
    const Cublas& c = cublas();
    check(c,
          c.sgemm_strided_batched(c.handle, op(tb), op(ta), n, m, k, &al, B, ldb, b_bs, A, lda, a_bs, &be, C, ldc, c_bs,
                                  batch),
          "cublasSgemmStridedBatched");
  } else {
    const double* A = static_cast<const double*>(a.raw_data()) + a_off;
    const double* B = static_cast<const double*>(b.raw_data()) + b_off;
    double* C = static_cast<double*>(out.raw_data()) + c_off;
    const Cublas& c = cublas();
    check(c,
          c.dgemm_strided_batched(c.handle, op(tb), op(ta), n, m, k, &alpha, B, ldb, b_bs, A, lda, a_bs, &beta, C, ldc,
                                  c_bs, batch),
          "cublasDgemmStridedBatched");
  }
}

template <class T>
__global__ void fill_rows_kernel(T* out, int64_t rows, int64_t cols, int64_t ld, const T* row, int64_t rs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[(i / cols) * ld + i % cols] = row[(i % cols) * rs];
}

// numerics = invariant: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], +0.0f)) (+ bias[n]),
// the order of tensor/cpu/invariant_matmul.h, so a row's output does not depend on the batch (and
// equals the CPU kernel's bit for bit). One thread per output element; the block stages 16 x 16
// tiles of x and W in shared memory, which changes where operands are read from, never the order
// of the additions.
constexpr int kInvTile = 16;
__global__ void invariant_linear_kernel(const float* x, const float* w, const float* bias, float* y, int64_t m,
                                        int64_t n, int64_t k) {
  __shared__ float xs[kInvTile][kInvTile + 1];
  __shared__ float ws[kInvTile][kInvTile + 1];
  const int tx = static_cast<int>(threadIdx.x) % kInvTile, ty = static_cast<int>(threadIdx.x) / kInvTile;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kInvTile + ty;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kInvTile + tx;
  const int64_t wrow = static_cast<int64_t>(blockIdx.x) * kInvTile + ty;  // the W row this thread stages
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kInvTile) {
    const int64_t kk = k0 + tx;
    xs[ty][tx] = row < m && kk < k ? x[row * k + kk] : 0.0f;
    ws[ty][tx] = wrow < n && kk < k ? w[wrow * k + kk] : 0.0f;
    __syncthreads();
    const int64_t steps = k - k0 < kInvTile ? k - k0 : kInvTile;
    for (int64_t j = 0; j < steps; ++j) acc = fmaf(xs[ty][j], ws[tx][j], acc);
    __syncthreads();
  }
  if (row < m && col < n) y[row * n + col] = bias ? acc + bias[col] : acc;
}

}  // namespace

Tensor invariant_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  QKV_CHECK(x.dtype() == DType::f32 && weight.dtype() == DType::f32, "[invariant_linear] needs float32");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  const Tensor x2 = x.reshape({rows, in}).contiguous(), w = weight.contiguous();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  Tensor y = Tensor::empty({rows, out_features}, DType::f32, Device::cuda);
  lead.push_back(out_features);
  if (rows == 0 || out_features == 0) return y.view(lead);
  const int64_t gx = (out_features + kInvTile - 1) / kInvTile, gy = (rows + kInvTile - 1) / kInvTile;
  QKV_CHECK(gx < (int64_t{1} << 31) && gy < 65536, "[invariant_linear] ", rows, " x ", out_features,
            " outputs exceed one CUDA grid");
  invariant_linear_kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), kInvTile * kInvTile>>>(
      static_cast<const float*>(x2.raw_data()), static_cast<const float*>(w.raw_data()),
      b.defined() ? static_cast<const float*>(b.raw_data()) : nullptr, static_cast<float*>(y.raw_data()), rows,
      out_features, in);
  QKV_CUDA_LAUNCHED("invariant_linear_kernel");
  return y.view(lead);
}

void matmul_forward(const Tensor& a_in, const Tensor& b_in, const Tensor& out, double alpha, double beta,
                    bool bf16_operands) {
  QKV_CHECK(out.dtype() == DType::f32 || out.dtype() == DType::f64, "[matmul] CUDA GEMM needs float32 or float64, not ",
            dtype_name(out.dtype()));
  // bf16 operands: converted (exactly: they hold bf16 values) keeping each one's BLAS layout, so a
  // transposed operand stays a transpose for cuBLAS.
  auto as_bf16 = [](const Tensor& t) {
    return cpu::gemm_layout(t).trans ? t.transpose(-1, -2).to(DType::bf16).transpose(-1, -2) : t.to(DType::bf16);
  };
  const bool tensor_cores = bf16_operands && out.dtype() == DType::f32 && a_in.numel() > 0 && b_in.numel() > 0;
  const Tensor a = tensor_cores ? as_bf16(a_in) : a_in, b = tensor_cores ? as_bf16(b_in) : b_in;
  const int nd = out.dim(), nb = nd - 2;
  const int64_t M = out.size(-2), N = out.size(-1), K = a.size(-1);
  if (out.numel() == 0) return;
  const cpu::GemmLayout la = cpu::gemm_layout(a), lb = cpu::gemm_layout(b), lc = cpu::gemm_layout(out);
  QKV_CHECK(la.ok && lb.ok && lc.ok && !lc.trans, "[matmul] CUDA GEMM got operands without a BLAS layout");
  if (K == 0) {  // C = beta·C: no product to add
    if (beta == 0.0) fill(out, 0.0);
    else if (beta != 1.0) mul_inplace(out, beta);
    return;
  }
  // Loop over all batch dims but the last; the last goes to one strided-batched call.
  int64_t outer = 1;
  for (int d = 0; d + 1 < nb; ++d) outer *= out.size(d);
  const int batch = nb > 0 ? static_cast<int>(out.size(nb - 1)) : 1;
  const int64_t a_bs = nb > 0 ? a.stride(nb - 1) : 0, b_bs = nb > 0 ? b.stride(nb - 1) : 0,
                c_bs = nb > 0 ? out.stride(nb - 1) : 0;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t a_off = 0, b_off = 0, c_off = 0, rest = o;
    for (int d = nb - 2; d >= 0; --d) {
      const int64_t idx = rest % out.size(d);
      rest /= out.size(d);
      a_off += idx * a.stride(d);
      b_off += idx * b.stride(d);
      c_off += idx * out.stride(d);
    }
    gemm_batched(la.trans, lb.trans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, a, a_off,
                 static_cast<int>(la.ld), a_bs, b, b_off, static_cast<int>(lb.ld), b_bs, beta, out, c_off,
                 static_cast<int>(lc.ld), c_bs, batch);
  }
}

void fill_rows(const Tensor& out, const Tensor& row) {
  const int64_t R = out.size(0), C = out.size(1);
  if (R * C == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((R * C + 255) / 256, 1 << 16));
  if (out.dtype() == DType::f32)
    fill_rows_kernel<float><<<blocks, 256>>>(static_cast<float*>(out.raw_data()), R, C, out.stride(0),
                                             static_cast<const float*>(row.raw_data()), row.stride(0));
  else
    fill_rows_kernel<double><<<blocks, 256>>>(static_cast<double*>(out.raw_data()), R, C, out.stride(0),
                                              static_cast<const double*>(row.raw_data()), row.stride(0));
  QKV_CUDA_LAUNCHED("fill_rows_kernel");
}

}  // namespace qkv::cuda
