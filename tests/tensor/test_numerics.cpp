// The numerics mode is per thread (tensor/numerics.h): a NumericsGuard sets the calling thread's
// mode only, set_numerics the process default outside a guard and the guard's mode inside one;
// OpenMP workers see the process default, so a choice by mode is made on the calling thread (the
// fused attention backward's strided walk). And omp_set_num_threads (cpu::OmpThreadsGuard) sets
// the calling thread's thread count only, which the Python module's per-model counts rely on.
#include <catch2/catch.hpp>

#include <omp.h>

#include <array>
#include <cstring>
#include <latch>
#include <memory>
#include <thread>

#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "attention/pattern/pattern.h"
#include "autograd/engine.h"
#include "tensor/cpu/parallel.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"

using namespace qkv;

namespace {

// Restores the process default however the test leaves.
struct DefaultMode {
  Numerics before = numerics();
  ~DefaultMode() { set_numerics(before); }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data<float>(), y.data<float>(), x.numel() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a NumericsGuard sets its own thread's mode; other threads keep theirs", "[numerics][invariant]") {
  const DefaultMode restore;
  set_numerics(Numerics::standard);  // no guard on this thread: the process default
  std::latch guarded(2), checked(2);
  Numerics seen_by_other = Numerics::standard, seen_after = Numerics::invariant;
  std::thread other([&] {
    {
      const NumericsGuard mode(Numerics::invariant);
      guarded.arrive_and_wait();  // both threads hold their guards now
      seen_by_other = numerics();
      checked.arrive_and_wait();
    }
    seen_after = numerics();  // the guard's end gives the process default back
  });
  {
    const NumericsGuard mode(Numerics::standard);
    guarded.arrive_and_wait();
    CHECK(numerics() == Numerics::standard);  // not the other thread's invariant
    checked.arrive_and_wait();
  }
  other.join();
  CHECK(seen_by_other == Numerics::invariant);
  CHECK(seen_after == Numerics::standard);
  CHECK(numerics() == Numerics::standard);
}

TEST_CASE("set_numerics: the process default outside a guard, the guard's mode inside one", "[numerics][invariant]") {
  const DefaultMode restore;
  set_numerics(Numerics::standard);
  {
    const NumericsGuard outer(Numerics::invariant);
    {
      const NumericsGuard inner(Numerics::standard);
      set_numerics(Numerics::invariant);  // inner's mode until it ends
      CHECK(numerics() == Numerics::invariant);
      Numerics elsewhere = Numerics::invariant;
      std::thread([&] { elsewhere = numerics(); }).join();
      CHECK(elsewhere == Numerics::standard);  // the process default is untouched
    }
    CHECK(numerics() == Numerics::invariant);  // outer's
    set_numerics(Numerics::standard);
    CHECK(numerics() == Numerics::standard);
  }
  CHECK(numerics() == Numerics::standard);
  set_numerics(Numerics::invariant);  // no guard: the default every unguarded thread sees
  Numerics elsewhere = Numerics::standard;
  std::thread([&] { elsewhere = numerics(); }).join();
  CHECK(elsewhere == Numerics::invariant);
  CHECK(numerics() == Numerics::invariant);
}

TEST_CASE("the fused attention backward takes its strided walk by the calling thread's mode, not its workers'",
          "[numerics][invariant][attention][sparse]") {
  // A causal strided pattern takes the regrouped walk under standard and the grid walk under
  // invariant (fused.h, use_strided_walk). With the process default standard and an invariant
  // guard on this thread, the OpenMP workers of the backward would see standard: their heads must
  // still take the walk the calling thread chose (and sized the scratch for).
  const DefaultMode restore;
  const cpu::OmpThreadsGuard threads(4);  // workers beside the calling thread
  auto sp = std::make_shared<attn::SparsePattern>();
  sp->kind = attn::Pattern::strided;
  sp->stride = 8;
  sp->local = 8;
  attn::AttentionOptions o;
  o.causal = true;
  o.pattern = sp;
  const int64_t B = 2, H = 4, N = 512, D = 16;
  const Tensor q0 = randn({B, H, N, D}, 11, 0, 0.0, 3.0), k0 = randn({B, H, N, D}, 12), v0 = randn({B, H, N, D}, 13),
               g = randn({B, H, N, D}, 14);
  const auto grads = [&] {
    Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
           v = v0.clone().set_requires_grad(true);
    autograd::backward(attn::attention(q, k, v, o), g);
    return std::array<Tensor, 3>{q.grad(), k.grad(), v.grad()};
  };
  set_numerics(Numerics::invariant);  // every thread invariant: the grid walk everywhere
  const auto want = grads();
  set_numerics(Numerics::standard);
  {
    const attn::MaskPlan plan(attn::check_problem(q0, k0, v0, o).shape(), o, DType::f32);
    REQUIRE(attn::use_strided_walk(plan));  // the workers' mode would take the walk
  }
  const NumericsGuard mode(Numerics::invariant);
  const auto got = grads();
  for (int i = 0; i < 3; ++i) CHECK(same_bits(got[i], want[i]));
}

TEST_CASE("omp_set_num_threads sets the calling thread's count only", "[numerics][threads]") {
  const int here = omp_get_max_threads();
  std::latch set(2), checked(2);
  int seen_by_other = 0, initial = 0, restored = 0;
  std::thread other([&] {
    initial = omp_get_max_threads();
    {
      const cpu::OmpThreadsGuard threads(here + 3);
      set.arrive_and_wait();
      seen_by_other = omp_get_max_threads();
      checked.arrive_and_wait();
    }
    restored = omp_get_max_threads();
  });
  set.arrive_and_wait();
  CHECK(omp_get_max_threads() == here);  // the other thread's count is its own
  checked.arrive_and_wait();
  other.join();
  CHECK(seen_by_other == here + 3);
  CHECK(restored == initial);
  {
    const cpu::OmpThreadsGuard keep;  // the default one: restores whatever is set inside it
    omp_set_num_threads(here + 1);
    CHECK(omp_get_max_threads() == here + 1);
  }
  CHECK(omp_get_max_threads() == here);
}
