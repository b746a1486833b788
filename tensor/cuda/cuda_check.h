// Error checks for CUDA runtime and cuBLAS calls: a failure throws qkv::Error naming the call,
// e.g. "[cuda] cudaMalloc(&p, sz) failed: out of memory". Only for .cu / CUDA-linked sources.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tensor/error.h"

#define QKV_CUDA_CHECK(call)                                                                      \
  do {                                                                                            \
    cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) ::qkv::fail("[cuda] ", #call, " failed: ", cudaGetErrorString(err_)); \
  } while (0)

#define QKV_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                  \
    cublasStatus_t st_ = (call);                                                                        \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::qkv::fail("[cuda] ", #call, " failed: ", cublasGetStatusString(st_)); \
  } while (0)

// After a kernel launch: launch errors (bad configuration) surface here, named.
#define QKV_CUDA_LAUNCHED(name) QKV_CUDA_CHECK(cudaGetLastError())
