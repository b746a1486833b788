// Error checks for CUDA runtime calls and kernel launches: a failure throws qkv::Error naming the call,
// e.g. "[cuda] cudaMalloc(&p, sz) failed: out of memory". Only for .cu / CUDA-linked sources.
#pragma once
#include <cuda_runtime.h>

#include "tensor/error.h"

#define QKV_CUDA_CHECK(call)                                                                       \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) ::qkv::fail("[cuda] ", #call, " failed: ", cudaGetErrorString(err_)); \
  } while (0)

// After a kernel launch: launch errors (bad configuration) surface here, named.
#define QKV_CUDA_LAUNCHED(name) QKV_CUDA_CHECK(cudaGetLastError())
