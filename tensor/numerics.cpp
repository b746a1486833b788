#include "tensor/numerics.h"

#include <atomic>

namespace qkv {
namespace {
std::atomic<Numerics> g_mode{Numerics::standard};
}  // namespace

Numerics numerics() { return g_mode.load(std::memory_order_relaxed); }
void set_numerics(Numerics mode) { g_mode.store(mode, std::memory_order_relaxed); }

}  // namespace qkv
