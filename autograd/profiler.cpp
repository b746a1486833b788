#include "autograd/profiler.h"

#include <atomic>
#include <mutex>

namespace qkv::autograd {
namespace {
std::atomic<bool> g_enabled{false};
std::mutex g_mu;
std::map<std::string, ProfileEntry>& table() {
  static auto* t = new std::map<std::string, ProfileEntry>();
  return *t;
}
}  // namespace

bool profiling_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_profiling(bool on) { g_enabled.store(on); }
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
