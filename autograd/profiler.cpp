#include "autograd/profiler.h"

#include <atomic>
#include <mutex>

#include "tensor/cuda/cuda_backend.h"

namespace qkv::autograd {
namespace {
std::atomic<bool> g_enabled{false};
std::atomic<bool> g_sync_device{false};
std::mutex g_mu;
std::map<std::string, ProfileEntry>& table() {
  static auto* t = new std::map<std::string, ProfileEntry>();
  return *t;
}
}  // namespace

bool profiling_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_profiling(bool on, bool sync_device) {
  g_sync_device.store(on && sync_device);
  g_enabled.store(on);
}
std::chrono::steady_clock::time_point profile_now() {
  if (g_sync_device.load(std::memory_order_relaxed)) cuda::synchronize();
  return std::chrono::steady_clock::now();
}
void profile_add(const std::string& name, double ms) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& e = table()[name];
  e.ms += ms;
  e.calls++;
}
std::map<std::string, ProfileEntry> profile_snapshot() {
  std::lock_guard<std::mutex> lock(g_mu);
  return table();
}
void profile_reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  table().clear();
}

}  // namespace qkv::autograd
