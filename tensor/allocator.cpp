#include "tensor/allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/error.h"

namespace qkv {
namespace {

// Blocks are 64-byte aligned (a cache line, and enough for AVX-512 loads) and their sizes rounded
// so that nearby requests share a free list without wasting much: 64 B granules below 64 KiB,
// 4 KiB pages above.
size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  size_t g = bytes < (64u << 10) ? 64 : 4096;
  return (bytes + g - 1) / g * g;
}

class CpuCachingAllocator {
 public:
  void* alloc(size_t bytes) {
    size_t sz = round_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = nullptr;
    auto it = free_.find(sz);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.bytes_cached -= sz;
    } else {
      p = std::aligned_alloc(64, sz);
      if (!p) {
        // Return the cache to the OS and try once more before giving up.
        release_locked();
        p = std::aligned_alloc(64, sz);
      }
      QKV_CHECK(p != nullptr, "[alloc] out of memory allocating ", bytes, " bytes on cpu");
      stats_.os_allocations++;
    }
    stats_.bytes_in_use += sz;
    if (stats_.bytes_in_use > stats_.peak_bytes) stats_.peak_bytes = stats_.bytes_in_use;
    return p;
  }
  void free(void* p, size_t bytes) {
    if (!p) return;
    size_t sz = round_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_[sz].push_back(p);
    stats_.bytes_in_use -= sz;
    stats_.bytes_cached += sz;
  }
  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.bytes_in_use;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    release_locked();
  }

 private:
  void release_locked() {
    for (auto& [sz, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    stats_.bytes_cached = 0;
  }
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

CpuCachingAllocator& cpu_allocator() {
  static auto* a = new CpuCachingAllocator();  // never destroyed: tensors may outlive static teardown
  return *a;
}

}  // namespace

void* device_alloc(Device d, size_t bytes) {
  if (d == Device::cpu) return cpu_allocator().alloc(bytes);
  return cuda::device_alloc(bytes);
}
void device_free(Device d, void* p, size_t bytes) {
  if (d == Device::cpu) return cpu_allocator().free(p, bytes);
  cuda::device_free(p, bytes);
}
AllocatorStats allocator_stats(Device d) {
  return d == Device::cpu ? cpu_allocator().stats() : cuda::allocator_stats();
}
void reset_peak_bytes(Device d) {
  if (d == Device::cpu) return cpu_allocator().reset_peak();
  cuda::reset_peak_bytes();
}
void release_cached_memory(Device d) {
  if (d == Device::cpu) return cpu_allocator().release();
  cuda::release_cached_memory();
}

}  // namespace qkv
