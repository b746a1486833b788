// CUDA runtime glue: device discovery, a caching device allocator (no cudaMalloc per op) with
// peak-bytes statistics, and host/device copies. Every CUDA call is checked and named on failure.
#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/error.h"

namespace qkv::cuda {
namespace {

size_t round_size(size_t bytes) {
  size_t g = bytes < (1u << 20) ? 512 : (2u << 20);
  return (bytes + g - 1) / g * g;
}

struct DeviceCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;
  AllocatorStats stats;
};
DeviceCache& cache() {
  static auto* c = new DeviceCache();
  return *c;
}

}  // namespace

int device_count() {
  int n = 0;
  // Without a driver or device this returns an error: that is zero devices, not a failure.
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    // A driver is installed but unusable (e.g. older than this build's runtime): say why once,
    // since every GPU test would otherwise just skip. Machines without a driver stay silent.
    static bool said = false;
    int driver = 0, runtime = 0;
    if (!said && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
      cudaRuntimeGetVersion(&runtime);
      std::fprintf(stderr,
                   "[cuda] no usable device: cudaGetDeviceCount failed: %s (driver CUDA %d.%d, runtime %d.%d)\n",
                   cudaGetErrorString(err), driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
      said = true;
    }
    return 0;
  }
  return n;
}

void* device_alloc(size_t bytes) {
  size_t sz = round_size(bytes ? bytes : 1);
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  void* p = nullptr;
  auto it = c.free.find(sz);
  if (it != c.free.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    c.stats.bytes_cached -= sz;
  } else {
    if (cudaMalloc(&p, sz) != cudaSuccess) {
      cudaGetLastError();
      for (auto& [s, list] : c.free)
        for (void* q : list) cudaFree(q);
      c.free.clear();
      c.stats.bytes_cached = 0;
      QKV_CUDA_CHECK(cudaMalloc(&p, sz));
    }
    c.stats.os_allocations++;
  }
  c.stats.bytes_in_use += sz;
  if (c.stats.bytes_in_use > c.stats.peak_bytes) c.stats.peak_bytes = c.stats.bytes_in_use;
  return p;
}

void device_free(void* p, size_t bytes) {
  if (!p) return;
  size_t sz = round_size(bytes ? bytes : 1);
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free[sz].push_back(p);
  c.stats.bytes_in_use -= sz;
  c.stats.bytes_cached += sz;
}

AllocatorStats allocator_stats() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}
void reset_peak_bytes() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.peak_bytes = c.stats.bytes_in_use;
}
void release_cached_memory() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [s, list] : c.free)
    for (void* q : list) cudaFree(q);
  c.free.clear();
  c.stats.bytes_cached = 0;
}

void memcpy(void* dst, const void* src, size_t bytes, int kind) {
  cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice : kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
  QKV_CUDA_CHECK(cudaMemcpy(dst, src, bytes, k));
}
void synchronize() { QKV_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace qkv::cuda
