// The CUDA runtime as the QKV_CUDA=EMULATE build sees it (tests/emulation/README.md): the subset of
// the runtime API qkv calls, implemented on the host by tests/emulation/cuda_runtime_emulator.cpp,
// plus the device-side names of cuda_emulator.h. Kernel launches `k<<<grid, block, smem>>>(args)`
// are rewritten at build time (tests/emulation/rewrite_launches.cmake) into
// `cuda_emu::launch("k", k, grid, block, smem)(args)`.
//
// Device memory is an arena of its own that the host cannot touch: it is readable and writable
// only while a kernel, a copy or a cuBLAS call runs, so host code that dereferences a device
// pointer crashes here as it would on a GPU. A kernel given a non-null pointer outside device
// memory aborts with the kernel's name.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../cuda_emulator.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int maxGridSize[3];
  int multiProcessorCount;
  int major;
  int minor;
};

extern "C" {
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value);
}

template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attribute, value);
}

namespace cuda_emu {

// Opens device memory to the host for its lifetime (nested: the outermost one closes it).
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// True when [p, p + bytes) lies inside one live device allocation.
bool is_device_range(const void* p, size_t bytes);

// Checks a launch's configuration as the runtime does (block size, grid limits, dynamic shared
// memory against the default 48 KB or the kernel's cudaFuncSetAttribute opt-in); on a bad one
// records the error for cudaGetLastError and returns false.
bool valid_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);

// Aborts when kernel `name` gets a non-null pointer that is not device memory as argument `index`.
void check_kernel_pointer(const char* name, int index, const void* p);

template <class T>
void check_argument(const char* name, int index, const T& value) {
  if constexpr (std::is_pointer_v<T>) check_kernel_pointer(name, index, static_cast<const void*>(value));
}

template <class... P>
struct Launch {
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared_bytes;

  // The arguments are converted to the kernel's parameter types once, as cudaLaunchKernel copies
  // them; every thread then gets its own copy.
  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    if (!valid_launch(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes)) return;
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    std::apply(
        [&](const auto&... p) {
          int index = 0;
          (check_argument(name, index++, p), ...);
        },
        params);
    DeviceAccess access;
    run_grid(grid, block, shared_bytes, [&] { std::apply(kernel, params); });
  }
};

template <class... P>
Launch<P...> launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes = 0,
                    cudaStream_t = nullptr) {
  return Launch<P...>{name, kernel, grid, block, shared_bytes};
}

}  // namespace cuda_emu
