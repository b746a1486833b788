// Caching allocators. The CPU one keeps freed blocks in per-size free lists so a training step that
// repeats the same shapes allocates nothing from the OS after the first step; it also counts the
// bytes handed out (current and peak), which tests and benchmarks read to prove memory claims.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace qkv {

struct AllocatorStats {
  int64_t bytes_in_use = 0;    // handed out and not yet returned
  int64_t peak_bytes = 0;      // max of bytes_in_use since the last reset_peak()
  int64_t bytes_cached = 0;    // held in free lists, ready for reuse
  int64_t os_allocations = 0;  // blocks obtained from the OS (a steady state adds none)
};

void* device_alloc(Device d, size_t bytes);
void device_free(Device d, void* p, size_t bytes);

AllocatorStats allocator_stats(Device d = Device::cpu);
void reset_peak_bytes(Device d = Device::cpu);  // peak := current
void release_cached_memory(Device d = Device::cpu);

}  // namespace qkv
