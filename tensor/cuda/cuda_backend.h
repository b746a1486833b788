// The CUDA backend's entry points used by device-independent code. A build without CUDA links
// tensor/no_cuda/cuda_stubs.cpp, whose functions throw "built without CUDA" (device_count() is 0).
#pragma once
#include <cstddef>

#include "tensor/allocator.h"

namespace qkv::cuda {

int device_count();  // 0 when no driver/device is present: GPU tests skip on 0
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);
AllocatorStats allocator_stats();
void reset_peak_bytes();
void release_cached_memory();
// Copies between host and device memory (kind: 0 host->device, 1 device->host, 2 device->device).
void memcpy(void* dst, const void* src, size_t bytes, int kind);
void synchronize();

}  // namespace qkv::cuda
