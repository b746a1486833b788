#include "tensor/numerics.h"

#include <atomic>

namespace qkv {
namespace {
std::atomic<Numerics> g_default{Numerics::standard};  // threads without a guard
thread_local std::optional<Numerics> t_scoped;        // the innermost guard's mode on this thread
}  // namespace

Numerics numerics() { return t_scoped ? *t_scoped : g_default.load(std::memory_order_relaxed); }

void set_numerics(Numerics mode) {
  if (t_scoped) t_scoped = mode;
  else g_default.store(mode, std::memory_order_relaxed);
}

NumericsGuard::NumericsGuard(Numerics mode) : previous_(t_scoped) { t_scoped = mode; }
NumericsGuard::~NumericsGuard() { t_scoped = previous_; }

}  // namespace qkv
