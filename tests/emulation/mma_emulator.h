// A host emulator of the CUDA constructs used by the tensor-core attention kernels
// (attention/cuda/mma_attention_kernels.cuh), so that their real source runs, and is checked, on a
// machine without a GPU (CI has none).
//
// Every CUDA thread of a block is a fiber (ucontext). Warp collectives (mma.sync, __shfl_xor_sync)
// and __syncthreads are the only switch points: a scheduler resumes the threads in a random order
// (fixed seed) until each waits at one, then resolves a collective once all 32 lanes of the warp
// have reached the same one, and a barrier once every thread of the block has. Divergent lanes,
// mismatched collectives or barriers, and deadlocks abort.
//
// mma_bf16_m16n8k16 gathers the 32 lanes' fragments into A, B and C by the fragment layout of the
// PTX ISA (mma.m16n8k16 with .bf16 operands and .f32 accumulators), written here from the ISA and
// not from the kernels' own layout comment, so a kernel that packs a fragment wrongly gets a wrong
// product. Each element must come from exactly one lane.
//
// Shared memory is a buffer of exactly the launch's dynamic size, filled with garbage. Stores of
// bf16, uint2 and float2 and the fragment reads (QKV_SMEM_READ in pair_at) are recorded per byte
// with the barrier interval ("epoch") and thread; two different threads touching a byte in one
// epoch where at least one writes (RAW, WAR, WAW) is a race, reading a never-written byte is an
// uninitialised read, and an access past the buffer aborts. (The float stores and loads of the
// dK/dV kernel's lse and Di rows are not recorded.) Global-memory bounds are left to the callers'
// buffers and AddressSanitizer; misaligned vector accesses to UndefinedBehaviorSanitizer.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

// ---- CUDA keywords: the kernels are plain host functions here.
#define QKV_MMA_EMULATION 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)

// ---- Emulator state and the shared-memory checker.
namespace mma_emu {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

// Who last wrote and read one shared-memory byte, and in which epoch.
struct ByteHistory {
  int write_epoch = -1, writer = -1;
  int read_epoch = -1, reader = -1;  // reader -2: several threads
};

struct SharedMemory {
  unsigned char* data = nullptr;
  size_t size = 0;
  std::vector<ByteHistory> history;
  int epoch = 0;
};
inline SharedMemory g_shared;
inline long g_races = 0;
inline long g_uninitialised_reads = 0;

}  // namespace mma_emu

// The CUDA built-in indices, set by the scheduler before it resumes a thread.
inline mma_emu::uint3 threadIdx, blockIdx, blockDim;

namespace mma_emu {

inline void report_race(const char* kind, size_t offset, int other) {
  if (++g_races <= 10)
    std::fprintf(stderr, "race %s at shared byte %zu: thread %u of block (%u, %u), epoch %d, and thread %d\n", kind,
                 offset, threadIdx.x, blockIdx.x, blockIdx.y, g_shared.epoch, other);
}

// The offset of [p, p + bytes) in shared memory, or false when p is not in it.
inline bool shared_offset(const void* p, size_t bytes, size_t* offset) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (!g_shared.data || c < g_shared.data || c >= g_shared.data + g_shared.size) return false;
  if (c + bytes > g_shared.data + g_shared.size) fail("shared-memory access past the end of the buffer");
  *offset = static_cast<size_t>(c - g_shared.data);
  return true;
}

inline void record_write(const void* p, size_t bytes) {
  size_t offset;
  if (!shared_offset(p, bytes, &offset)) return;
  const int t = static_cast<int>(threadIdx.x);
  for (size_t i = offset; i < offset + bytes; ++i) {
    ByteHistory& h = g_shared.history[i];
    if (h.write_epoch == g_shared.epoch && h.writer != t) report_race("write after write", i, h.writer);
    if (h.read_epoch == g_shared.epoch && h.reader != t) report_race("write after read", i, h.reader);
    h.write_epoch = g_shared.epoch;
    h.writer = t;
  }
}

inline void record_read(const void* p, size_t bytes) {
  size_t offset;
  if (!shared_offset(p, bytes, &offset)) return;
  const int t = static_cast<int>(threadIdx.x);
  for (size_t i = offset; i < offset + bytes; ++i) {
    ByteHistory& h = g_shared.history[i];
    if (h.write_epoch < 0) {
      if (++g_uninitialised_reads <= 10) std::fprintf(stderr, "read of unwritten shared byte %zu, thread %d\n", i, t);
    } else if (h.write_epoch == g_shared.epoch && h.writer != t) {
      report_race("read after write", i, h.writer);
    }
    if (h.read_epoch != g_shared.epoch) h.reader = t;
    else if (h.reader != t) h.reader = -2;
    h.read_epoch = g_shared.epoch;
  }
}

}  // namespace mma_emu

#define QKV_DYNAMIC_SMEM(name) unsigned char* name = mma_emu::g_shared.data
#define QKV_SMEM_READ(p, bytes) mma_emu::record_read(p, bytes)

// ---- CUDA vector types (stores record shared-memory writes).
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
  float2() = default;
  float2(const float2&) = default;
  float2(float x_, float y_) : x(x_), y(y_) {}
  float2& operator=(const float2& o) {
    mma_emu::record_write(this, sizeof(*this));
    x = o.x;
    y = o.y;
    return *this;
  }
};
struct alignas(8) uint2 {
  unsigned x, y;
  uint2() = default;
  uint2(const uint2&) = default;
  uint2(unsigned x_, unsigned y_) : x(x_), y(y_) {}
  uint2& operator=(const uint2& o) {
    mma_emu::record_write(this, sizeof(*this));
    x = o.x;
    y = o.y;
    return *this;
  }
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2(x, y); }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2(x, y); }

// ---- bf16: the upper 16 bits of a float32, rounded to nearest even (NaN stays a quiet NaN).
namespace mma_emu {
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
}  // namespace mma_emu

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16&) = default;
  __nv_bfloat16& operator=(const __nv_bfloat16& o) {
    mma_emu::record_write(this, sizeof(*this));
    bits = o.bits;
    return *this;
  }
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 r;
  r.bits = mma_emu::bf16_bits(f);
  return r;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  __nv_bfloat162 r;
  r.x.bits = mma_emu::bf16_bits(lo);
  r.y.bits = mma_emu::bf16_bits(hi);
  return r;
}

// ---- Fibers, the scheduler and the collectives.
namespace mma_emu {

enum class State { ready, at_warp_collective, at_barrier, exited };
enum class Collective { none, shuffle, mma };

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  State state = State::ready;
  Collective collective = Collective::none;
  long mma_calls = 0, shuffles = 0, barriers = 0;  // per thread: lanes must agree at each collective
  float shuffle_value = 0, shuffle_result = 0;
  int shuffle_lane_mask = 0;
  unsigned shuffle_member_mask = 0;
  float* c = nullptr;
  uint32_t a[4] = {}, b0 = 0, b1 = 0;
};

inline std::vector<Fiber> g_fibers;
inline ucontext_t g_scheduler;
inline Fiber* g_current = nullptr;
inline std::function<void()> g_kernel;
inline std::mt19937 g_rng(1);

inline void suspend(State s) {
  g_current->state = s;
  swapcontext(&g_current->context, &g_scheduler);
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on the fragments of a warp's 32 lanes, as the
// PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point type"): with
// groupID = lane / 4 and threadID_in_group = lane % 4, and two bf16 per 32-bit register (the
// lower-numbered element in the low half),
//   A (16 × 16, elements a0..a7): row = groupID for a0, a1, a4, a5, else groupID + 8;
//      col = 2·threadID_in_group + (i & 1), plus 8 for a4..a7
//   B (16 × 8, elements b0..b3): row = 2·threadID_in_group + (i & 1), plus 8 for b2, b3; col = groupID
//   C, D (16 × 8, c0..c3): row = groupID for c0, c1, else groupID + 8; col = 2·threadID_in_group + (i & 1)
// D = A·B + C is computed in float64 and rounded once to float32.
inline void resolve_mma(Fiber* lanes) {
  float A[16][16], B[16][8], C[16][8];
  bool has_a[16][16] = {}, has_b[16][8] = {}, has_c[16][8] = {};
  auto half = [](uint32_t reg, int i) { return static_cast<uint16_t>((i & 1) ? reg >> 16 : reg & 0xffffu); };
  for (int l = 0; l < 32; ++l) {
    const int group = l >> 2, tid = l & 3;
    const Fiber& f = lanes[l];
    for (int i = 0; i < 8; ++i) {
      const int row = (i % 4) < 2 ? group : group + 8;
      const int col = 2 * tid + (i & 1) + (i >= 4 ? 8 : 0);
      if (has_a[row][col]) fail("mma: an element of A held by two lanes");
      has_a[row][col] = true;
      A[row][col] = bf16_value(half(f.a[i / 2], i));
    }
    for (int i = 0; i < 4; ++i) {
      const int row = 2 * tid + (i & 1) + (i >= 2 ? 8 : 0);
      if (has_b[row][group]) fail("mma: an element of B held by two lanes");
      has_b[row][group] = true;
      B[row][group] = bf16_value(half(i < 2 ? f.b0 : f.b1, i));
    }
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8, col = 2 * tid + (i & 1);
      if (has_c[row][col]) fail("mma: an element of C held by two lanes");
      has_c[row][col] = true;
      C[row][col] = f.c[i];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int group = l >> 2, tid = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8, col = 2 * tid + (i & 1);
      double d = C[row][col];
      for (int k = 0; k < 16; ++k) d += static_cast<double>(A[row][k]) * B[k][col];
      lanes[l].c[i] = static_cast<float>(d);
    }
  }
}

inline void fiber_main() {
  g_kernel();
  g_current->state = State::exited;
  swapcontext(&g_current->context, &g_scheduler);
}

// Runs block `block` of a kernel: `threads` threads (a multiple of 32) each calling `kernel`, with
// `shared_bytes` of dynamic shared memory.
inline void run_block(uint3 block, int threads, size_t shared_bytes, const std::function<void()>& kernel) {
  constexpr size_t kStackBytes = 256 * 1024;
  blockIdx = block;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  std::vector<unsigned char> shared(std::max<size_t>(shared_bytes, 1));
  for (auto& x : shared) x = static_cast<unsigned char>(g_rng());
  g_shared.data = shared_bytes ? shared.data() : nullptr;
  g_shared.size = shared_bytes;
  g_shared.history.assign(shared_bytes, ByteHistory{});
  g_shared.epoch = 0;
  g_kernel = kernel;
  if (g_fibers.size() != static_cast<size_t>(threads)) g_fibers = std::vector<Fiber>(threads);
  for (Fiber& f : g_fibers) {
    std::vector<char> stack = std::move(f.stack);  // stacks are reused from block to block
    f = Fiber{};
    f.stack = std::move(stack);
    f.stack.resize(kStackBytes);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
  }
  std::vector<int> order(threads);
  for (int t = 0; t < threads; ++t) order[t] = t;
  const int warps = threads / 32;
  for (;;) {
    bool progress = false;
    std::shuffle(order.begin(), order.end(), g_rng);
    for (int t : order) {
      Fiber& f = g_fibers[t];
      if (f.state != State::ready) continue;
      threadIdx = {static_cast<unsigned>(t), 0, 0};
      g_current = &f;
      swapcontext(&g_scheduler, &f.context);
      g_current = nullptr;
      progress = true;
    }
    for (int w = 0; w < warps; ++w) {
      Fiber* lanes = &g_fibers[w * 32];
      int waiting = 0;
      for (int l = 0; l < 32; ++l) waiting += lanes[l].state == State::at_warp_collective;
      if (waiting == 0) continue;
      // A lane still ready would have run above, so the others have exited or wait at a barrier.
      if (waiting != 32) fail("a warp collective without all 32 lanes (divergence or exited lanes)");
      const Collective op = lanes[0].collective;
      for (int l = 0; l < 32; ++l) {
        const Fiber& f = lanes[l];
        if (f.collective != op) fail("lanes of a warp at different collectives");
        if (op == Collective::mma && f.mma_calls != lanes[0].mma_calls) fail("lanes at different mma calls");
        if (op == Collective::shuffle &&
            (f.shuffles != lanes[0].shuffles || f.shuffle_lane_mask != lanes[0].shuffle_lane_mask ||
             f.shuffle_member_mask != 0xffffffffu))
          fail("lanes at different shuffles");
      }
      if (op == Collective::mma) {
        resolve_mma(lanes);
      } else {
        for (int l = 0; l < 32; ++l) lanes[l].shuffle_result = lanes[l ^ lanes[l].shuffle_lane_mask].shuffle_value;
      }
      for (int l = 0; l < 32; ++l) {
        lanes[l].collective = Collective::none;
        lanes[l].state = State::ready;
      }
      progress = true;
    }
    if (progress) continue;
    int at_barrier = 0, exited = 0;
    for (const Fiber& f : g_fibers) {
      at_barrier += f.state == State::at_barrier;
      exited += f.state == State::exited;
    }
    if (exited == threads) break;
    if (at_barrier + exited == threads) {
      if (exited > 0) fail("__syncthreads with some threads of the block exited");
      for (const Fiber& f : g_fibers)
        if (f.barriers != g_fibers[0].barriers) fail("threads at different __syncthreads");
      for (Fiber& f : g_fibers) f.state = State::ready;
      ++g_shared.epoch;
      continue;
    }
    fail("deadlock");
  }
  g_shared = SharedMemory{};
}

}  // namespace mma_emu

// ---- The CUDA collectives the kernels call.
inline void __syncthreads() {
  ++mma_emu::g_current->barriers;
  mma_emu::suspend(mma_emu::State::at_barrier);
}

inline float __shfl_xor_sync(unsigned member_mask, float value, int lane_mask) {
  mma_emu::Fiber* f = mma_emu::g_current;
  f->collective = mma_emu::Collective::shuffle;
  f->shuffle_value = value;
  f->shuffle_lane_mask = lane_mask;
  f->shuffle_member_mask = member_mask;
  ++f->shuffles;
  mma_emu::suspend(mma_emu::State::at_warp_collective);
  return f->shuffle_result;
}

inline void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_emu::Fiber* f = mma_emu::g_current;
  f->collective = mma_emu::Collective::mma;
  f->c = c;
  std::copy(a, a + 4, f->a);
  f->b0 = b0;
  f->b1 = b1;
  ++f->mma_calls;
  mma_emu::suspend(mma_emu::State::at_warp_collective);
}
