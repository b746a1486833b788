// The host side of the CUDA emulation (tests/emulation/README.md): the runtime API subset and the
// cuBLAS GEMMs that the QKV_CUDA=EMULATE build calls, with the checks a real device would make
// for us and a few it would not (device memory the host cannot touch outside kernels and copies,
// copies whose direction does not match their pointers, kernels given host pointers).
//
// Built as the shared library libcublas.so.13 (soname included), which the emulated build links:
// tensor/cuda/matmul.cu dlopens "libcublas.so.13" at its first GEMM and gets this library, already
// loaded, rather than the real cuBLAS.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "include/cublas_v2.h"
#include "include/cuda_runtime.h"

namespace cuda_emu {
namespace {

constexpr size_t kArenaBytes = size_t{64} << 30;    // address space reserved for device memory
constexpr size_t kDeviceMemory = size_t{16} << 30;  // what the emulated device reports and allows
constexpr size_t kDefaultSharedBytes = 48 * 1024;   // dynamic shared memory without an opt-in
constexpr size_t kMaxSharedBytes = 227 * 1024;      // the opt-in limit of an H100/H200 (sm_90)
constexpr size_t kAlignment = 256;                  // cudaMalloc's alignment

struct Heap {
  std::recursive_mutex mu;
  char* base = nullptr;
  size_t top = 0;  // bytes of the arena handed out so far
  size_t in_use = 0;
  std::map<const char*, size_t> live;     // start -> bytes
  std::multimap<size_t, char*> released;  // bytes -> start, for reuse
  int open = 0;                           // DeviceAccess nesting
  std::map<const void*, int> max_shared;  // kernel -> opted-in dynamic shared bytes
  cudaError_t last_error = cudaSuccess;
};

Heap& heap() {
  static Heap* h = [] {
    auto* hp = new Heap();
    void* p = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("cannot reserve the device-memory arena");
    hp->base = static_cast<char*>(p);
    return hp;
  }();
  return *h;
}

size_t page_round(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

void set_protection(Heap& h, int prot) {
  if (h.top > 0 && mprotect(h.base, page_round(h.top), prot) != 0) fail("mprotect of device memory failed");
}

bool in_arena(const void* p) {
  Heap& h = heap();
  const char* c = static_cast<const char*>(p);
  return c >= h.base && c < h.base + kArenaBytes;
}

cudaError_t record(cudaError_t e) {
  if (e != cudaSuccess) heap().last_error = e;
  return e;
}

cudaError_t refuse(cudaError_t e, const std::string& why) {
  std::fprintf(stderr, "[cuda emulator] %s\n", why.c_str());
  return record(e);
}

}  // namespace

DeviceAccess::DeviceAccess() {
  Heap& h = heap();
  h.mu.lock();
  if (h.open++ == 0) set_protection(h, PROT_READ | PROT_WRITE);
}
DeviceAccess::~DeviceAccess() {
  Heap& h = heap();
  if (--h.open == 0) set_protection(h, PROT_NONE);
  h.mu.unlock();
}

bool is_device_range(const void* p, size_t bytes) {
  Heap& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  const char* c = static_cast<const char*>(p);
  auto it = h.live.upper_bound(c);
  if (it == h.live.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

bool valid_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  Heap& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  const auto bad = [&](const std::string& why) {
    refuse(cudaErrorInvalidConfiguration, std::string(name) + ": " + why);
    return false;
  };
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (threads == 0 || threads > 1024) return bad("block of " + std::to_string(threads) + " threads");
  if (block.y != 1 || block.z != 1) return bad("the emulator runs one-dimensional blocks only");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return bad("empty grid");
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    return bad("grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " + std::to_string(grid.z) +
               ") past the limits (2^31 - 1, 65535, 65535)");
  size_t allowed = kDefaultSharedBytes;
  if (auto it = h.max_shared.find(kernel); it != h.max_shared.end()) allowed = static_cast<size_t>(it->second);
  if (shared_bytes > allowed)
    return bad(std::to_string(shared_bytes) + " bytes of dynamic shared memory, above the kernel's " +
               std::to_string(allowed) + " (cudaFuncAttributeMaxDynamicSharedMemorySize)");
  return true;
}

void check_kernel_pointer(const char* name, int index, const void* p) {
  if (p != nullptr && !in_arena(p))
    fail(std::string(name) + ": argument " + std::to_string(index) + " is a host pointer, not device memory");
}

}  // namespace cuda_emu

using cuda_emu::heap;
using cuda_emu::record;
using cuda_emu::refuse;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : record(cudaErrorInvalidDevice); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "qkv CUDA host emulator");
  prop->totalGlobalMem = cuda_emu::kDeviceMemory;
  prop->sharedMemPerBlock = cuda_emu::kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = cuda_emu::kMaxSharedBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  auto& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  *ptr = nullptr;
  const size_t size =
      (std::max<size_t>(bytes, 1) + cuda_emu::kAlignment - 1) / cuda_emu::kAlignment * cuda_emu::kAlignment;
  if (h.in_use + size > cuda_emu::kDeviceMemory) return record(cudaErrorMemoryAllocation);
  char* p = nullptr;
  if (auto it = h.released.find(size); it != h.released.end()) {
    p = it->second;
    h.released.erase(it);
  } else {
    if (h.top + size > cuda_emu::kArenaBytes) return record(cudaErrorMemoryAllocation);
    p = h.base + h.top;
    h.top += size;
  }
  h.live[p] = size;
  h.in_use += size;
  cuda_emu::DeviceAccess access;
  std::memset(p, 0xff, size);  // cudaMalloc does not clear: garbage that reads as NaN
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  auto& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  auto it = h.live.find(static_cast<const char*>(ptr));
  if (it == h.live.end())
    return refuse(cudaErrorInvalidDevicePointer, "cudaFree of a pointer cudaMalloc did not return");
  h.released.emplace(it->second, static_cast<char*>(ptr));
  h.in_use -= it->second;
  {
    cuda_emu::DeviceAccess access;
    std::memset(ptr, 0xfe, it->second);  // read after free: garbage again
  }
  h.live.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_device = cuda_emu::in_arena(dst), src_device = cuda_emu::in_arena(src);
  if (kind == cudaMemcpyDefault) kind = static_cast<cudaMemcpyKind>((src_device ? 2 : 0) + (dst_device ? 1 : 0));
  const bool want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (src_device != want_src || dst_device != want_dst)
    return refuse(cudaErrorInvalidMemcpyDirection, "cudaMemcpy of kind " + std::to_string(kind) + " from " +
                                                       (src_device ? "device" : "host") + " to " +
                                                       (dst_device ? "device" : "host") + " memory");
  if ((src_device && !cuda_emu::is_device_range(src, bytes)) || (dst_device && !cuda_emu::is_device_range(dst, bytes)))
    return refuse(cudaErrorInvalidValue, "cudaMemcpy of " + std::to_string(bytes) + " bytes past a device allocation");
  cuda_emu::DeviceAccess access;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaGetLastError() {
  auto& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  const cudaError_t e = h.last_error;
  h.last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
  }
  return "unrecognized error code";
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > cuda_emu::kMaxSharedBytes)
    return refuse(cudaErrorInvalidValue,
                  "cudaFuncSetAttribute(" + std::to_string(attribute) + ", " + std::to_string(value) + ") is refused");
  auto& h = heap();
  std::lock_guard<std::recursive_mutex> lock(h.mu);
  h.max_shared[kernel] = value;
  return cudaSuccess;
}

// ---- cuBLAS: C = alpha·op(A)·op(B) + beta·C per batch entry, column-major, as documented: op(A)
// is m × k, A[i + l·lda] (N) or A[l + i·lda] (T); op(B) is k × n likewise; C[i + j·ldc]. beta = 0
// means C is not read (it may hold NaN). Sums in float64, rounded once.

struct cublasContext {
  cublasAtomicsMode_t atomics = CUBLAS_ATOMICS_NOT_ALLOWED;
};

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->atomics = mode;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "unknown cuBLAS status";
}

namespace {

double load(const void* p, cudaDataType type, long long i) {
  switch (type) {
    case CUDA_R_32F:
      return static_cast<const float*>(p)[i];
    case CUDA_R_64F:
      return static_cast<const double*>(p)[i];
    case CUDA_R_16BF:
      return cuda_emu::bf16_value(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16F:
      return cuda_emu::half_value(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}
void store(void* p, cudaDataType type, long long i, double v) {
  if (type == CUDA_R_32F) static_cast<float*>(p)[i] = static_cast<float>(v);
  else static_cast<double*>(p)[i] = v;
}
size_t size_of(cudaDataType type) { return type == CUDA_R_64F ? 8 : type == CUDA_R_32F ? 4 : 2; }

// The bytes of a column-major rows × cols matrix with leading dimension ld, over `batch` entries
// `stride` apart, must lie in one device allocation.
void check_extent(const char* what, const void* p, cudaDataType type, int rows, int cols, int ld, long long stride,
                  int batch) {
  if (rows == 0 || cols == 0 || batch == 0) return;
  const long long first = std::min(0LL, stride * (batch - 1));
  const long long last = std::max(0LL, stride * (batch - 1)) + static_cast<long long>(cols - 1) * ld + (rows - 1);
  const char* start = static_cast<const char*>(p) + first * static_cast<long long>(size_of(type));
  if (!cuda_emu::is_device_range(start, static_cast<size_t>(last - first + 1) * size_of(type)))
    cuda_emu::fail(std::string("cuBLAS GEMM: matrix ") + what + " reaches outside its device allocation");
}

cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    double alpha, const void* A, cudaDataType at, int lda, long long sa, const void* B, cudaDataType bt,
                    int ldb, long long sb, double beta, void* C, cudaDataType ct, int ldc, long long sc, int batch) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (ta == CUBLAS_OP_C || tb == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
  const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  cuda_emu::DeviceAccess access;
  if (k > 0 && alpha != 0) {
    check_extent("A", A, at, a_rows, ta == CUBLAS_OP_N ? k : m, lda, sa, batch);
    check_extent("B", B, bt, b_rows, tb == CUBLAS_OP_N ? n : k, ldb, sb, batch);
  }
  check_extent("C", C, ct, m, n, ldc, sc, batch);
  std::vector<double> column(static_cast<size_t>(m));
  for (int e = 0; e < batch; ++e) {
    const long long a0 = sa * e, b0 = sb * e, c0 = sc * e;
    for (int j = 0; j < n; ++j) {
      std::fill(column.begin(), column.end(), 0.0);
      if (alpha != 0)
        for (int l = 0; l < k; ++l) {
          const double b = load(
              B, bt,
              b0 + (tb == CUBLAS_OP_N ? l + static_cast<long long>(j) * ldb : j + static_cast<long long>(l) * ldb));
          for (int i = 0; i < m; ++i)
            column[i] += load(A, at,
                              a0 + (ta == CUBLAS_OP_N ? i + static_cast<long long>(l) * lda
                                                      : l + static_cast<long long>(i) * lda)) *
                         b;
        }
      for (int i = 0; i < m; ++i) {
        const long long ci = c0 + i + static_cast<long long>(j) * ldc;
        const double prior = beta == 0 ? 0.0 : beta * load(C, ct, ci);
        store(C, ct, ci, alpha * column[i] + prior);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb, long long strideB,
                                         const float* beta, float* C, int ldc, long long strideC, int batch) {
  return gemm(handle, transa, transb, m, n, k, *alpha, A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F, ldb, strideB, *beta,
              C, CUDA_R_32F, ldc, strideC, batch);
}
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const double* alpha, const double* A, int lda,
                                         long long strideA, const double* B, int ldb, long long strideB,
                                         const double* beta, double* C, int ldc, long long strideC, int batch) {
  return gemm(handle, transa, transb, m, n, k, *alpha, A, CUDA_R_64F, lda, strideA, B, CUDA_R_64F, ldb, strideB, *beta,
              C, CUDA_R_64F, ldc, strideC, batch);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batch, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t) {
  // The one combination qkv uses: bf16 operands, float32 output, float32 compute and scalars.
  if (Atype != CUDA_R_16BF || Btype != CUDA_R_16BF || Ctype != CUDA_R_32F || computeType != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), A, Atype, lda, strideA, B, Btype, ldb,
              strideB, *static_cast<const float*>(beta), C, Ctype, ldc, strideC, batch);
}

}  // extern "C"
