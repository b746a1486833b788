// A lightweight profiler for `qkv bench --profile`: wall time summed per name. The engine times
// every backward node by its name; forward code marks regions with ProfileScope. Off by default:
// a disabled scope costs one branch. For a GPU run the clock first waits for the device
// (`sync_device`), since kernel launches return before the kernels finish; that serialises the
// step, so profiled GPU times add up to more than an unprofiled step.
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace qkv::autograd {

struct ProfileEntry {
  double ms = 0;
  int64_t calls = 0;
};

bool profiling_enabled();
void set_profiling(bool on, bool sync_device = false);
// The profiler's clock: steady_clock, after a device synchronisation when profiling a GPU run.
std::chrono::steady_clock::time_point profile_now();
void profile_add(const std::string& name, double ms);
std::map<std::string, ProfileEntry> profile_snapshot();
void profile_reset();

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(profiling_enabled() ? name : nullptr) {
    if (name_) t0_ = profile_now();
  }
  ~ProfileScope() {
    if (name_) profile_add(name_, std::chrono::duration<double, std::milli>(profile_now() - t0_).count());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace qkv::autograd
