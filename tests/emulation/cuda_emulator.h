// A host emulator of the CUDA device code qkv writes, so that the real kernel source runs, and is
// checked, on a machine without a GPU (CI has none). Two users:
//   - tests/emulation/test_mma_attention_emulation.cpp runs the tensor-core attention kernels
//     (attention/cuda/mma_attention_kernels.cuh) block by block through run_block();
//   - the QKV_CUDA=EMULATE build (tests/emulation/README.md) compiles every .cu file with the host
//     compiler against the runtime shim in tests/emulation/include/, whose launches go through
//     run_grid().
//
// Every CUDA thread of a block is a fiber (its own stack; switched by a few lines of x86-64
// assembly, or by ucontext elsewhere: swapcontext saves the signal mask with a system call per
// switch, which made it half of the emulated suite's time). Warp collectives (mma.sync, __shfl_xor_sync)
// and __syncthreads are the only switch points: a scheduler resumes the threads in a random order
// (fixed seed) until each waits at one, then resolves a collective once all lanes of the warp have
// reached the same one, and a barrier once every thread of the block has. Divergent lanes,
// mismatched collectives or barriers, and deadlocks abort.
//
// mma_bf16_m16n8k16 gathers the 32 lanes' fragments into A, B and C by the fragment layout of the
// PTX ISA (mma.m16n8k16 with .bf16 operands and .f32 accumulators), written here from the ISA and
// not from the kernels' own layout comment, so a kernel that packs a fragment wrongly gets a wrong
// product. Each element must come from exactly one lane.
//
// ldmatrix_x4 / ldmatrix_x2 (m8n8 .b16) gather the rows named by the lanes' addresses and hand each
// lane its fragment words, by the PTX ISA's layout: lanes 8i..8i+7 name the 8 rows of matrix i
// (16-byte aligned, else an abort), and lane l receives row l/4, elements 2(l%4), 2(l%4)+1 of
// matrix i in register i.
//
// Dynamic shared memory is a buffer of exactly the launch's size, filled with garbage. Stores of
// bf16, uint2 and float2 and the rows ldmatrix reads are recorded per byte
// with the barrier interval ("epoch") and thread; two different threads touching a byte in one
// epoch where at least one writes (RAW, WAR, WAW) is a race, reading a never-written byte is an
// uninitialised read, and an access past the buffer aborts. (Plain float stores and loads are not
// recorded.) Static __shared__ arrays become function statics: one per kernel, shared by the
// block's fibers, as on the device. Global-memory bounds are left to the callers' buffers and
// AddressSanitizer; misaligned vector accesses to UndefinedBehaviorSanitizer.
#pragma once

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

// ---- CUDA keywords: kernels are plain host functions here.
#define QKV_MMA_EMULATION 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static

// ---- Emulator state and the shared-memory checker.
namespace cuda_emu {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

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

}  // namespace cuda_emu

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The CUDA built-in indices, set by the scheduler before it resumes a thread.
inline uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_emu {

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

inline unsigned char* dynamic_shared_memory() { return g_shared.data; }

}  // namespace cuda_emu

#define QKV_DYNAMIC_SMEM(name) unsigned char* name = cuda_emu::dynamic_shared_memory()

// ---- The device math library's min and max on mixed arithmetic types (the usual conversions).
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
}

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
    cuda_emu::record_write(this, sizeof(*this));
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
    cuda_emu::record_write(this, sizeof(*this));
    x = o.x;
    y = o.y;
    return *this;
  }
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2(x, y); }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2(x, y); }

// ---- bf16: the upper 16 bits of a float32, rounded to nearest even (NaN stays a quiet NaN).
namespace cuda_emu {
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

// IEEE binary16 from float32, rounded to nearest even: overflow to infinity, gradual underflow
// to subnormals (spacing 2^-24), NaN stays a quiet NaN.
inline uint16_t half_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  const float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past the largest half
  if (a < 6.103515625e-05f) {                                       // below 2^-14: subnormal
    const float q = std::nearbyint(a * 16777216.0f);                // units of 2^-24, ties to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(q));
  }
  const int exponent = static_cast<int>(mag >> 23) - 127;  // -14 .. 15
  uint32_t mantissa = mag & 0x7fffffu;
  uint32_t bits = (static_cast<uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (bits & 1u))) ++bits;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | bits);
}
inline float half_value(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) ? 1 : 0;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  float v;
  if (exponent == 0) v = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31) v = mantissa ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mantissa | 0x400u), exponent - 25);
  return sign ? -v : v;
}
}  // namespace cuda_emu

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16&) = default;
  __nv_bfloat16& operator=(const __nv_bfloat16& o) {
    cuda_emu::record_write(this, sizeof(*this));
    bits = o.bits;
    return *this;
  }
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 r;
  r.bits = cuda_emu::bf16_bits(f);
  return r;
}
inline float __bfloat162float(__nv_bfloat16 b) { return cuda_emu::bf16_value(b.bits); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  __nv_bfloat162 r;
  r.x.bits = cuda_emu::bf16_bits(lo);
  r.y.bits = cuda_emu::bf16_bits(hi);
  return r;
}

struct __half {
  uint16_t bits;
};
inline __half __float2half_rn(float f) { return __half{cuda_emu::half_bits(f)}; }
inline float __half2float(__half h) { return cuda_emu::half_value(h.bits); }

// ---- Fibers, the scheduler and the collectives.
namespace cuda_emu {

enum class State { ready, at_warp_collective, at_barrier, exited };
enum class Collective { none, shuffle, mma, ldmatrix };

constexpr size_t kStackBytes = 256 * 1024;

// Switching stacks. x86-64: qkv_emu_switch(&from_sp, to_sp) pushes the callee-saved registers
// (rbx, rbp, r12-r15) on the current stack, stores the stack pointer in *from_sp, loads to_sp and
// pops the same from there. (The SSE and x87 control words are callee-saved too, but no kernel
// changes them, so they are left alone: restoring them costs more than the rest of the switch.)
// A new fiber's stack is laid out as if it had called qkv_emu_switch from the start of fiber_main.
// Weak: every translation unit that includes this header emits it, the linker keeps one.
#if defined(__x86_64__)
extern "C" void qkv_emu_switch(void** from_sp, void* to_sp);
asm(R"(
  .text
  .weak qkv_emu_switch
  .type qkv_emu_switch, @function
qkv_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size qkv_emu_switch, .-qkv_emu_switch
)");
struct Context {
  void* sp = nullptr;
  const void* stack_bottom = nullptr;  // for AddressSanitizer's fiber annotations
  size_t stack_size = 0;
};
#else
using Context = ucontext_t;
#endif

// AddressSanitizer must be told of every stack switch (else it misreads frames on the fibers'
// stacks), and a reused fiber stack must be unpoisoned before it runs again.
#if defined(__SANITIZE_ADDRESS__) && defined(__x86_64__)
#define QKV_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

struct Fiber {
  Context context;
  std::unique_ptr<char[]> stack;  // uninitialised: reused from block to block
  State state = State::ready;
  Collective collective = Collective::none;
  long mma_calls = 0, shuffles = 0, barriers = 0;  // per thread: lanes must agree at each collective
  uint64_t shuffle_value = 0, shuffle_result = 0;  // the bits of the shuffled value
  int shuffle_lane_mask = 0, shuffle_bytes = 0;
  unsigned shuffle_member_mask = 0;
  float* c = nullptr;
  uint32_t a[4] = {}, b0 = 0, b1 = 0;
  long ldmatrix_calls = 0;
  int ldmatrix_count = 0;              // matrices: 4 or 2
  const void* ldmatrix_row = nullptr;  // this lane's row address
  uint32_t* ldmatrix_out[4] = {};      // where register i goes
};

inline std::vector<Fiber> g_fibers;
inline Context g_scheduler;

// `leaving`: the fiber switching away will never run again (AddressSanitizer frees its state).
inline void switch_to(Context* from, Context* to, bool leaving = false) {
#if defined(QKV_EMU_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(leaving ? nullptr : &fake_stack, to->stack_bottom, to->stack_size);
  qkv_emu_switch(&from->sp, to->sp);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#elif defined(__x86_64__)
  (void)leaving;
  qkv_emu_switch(&from->sp, to->sp);
#else
  (void)leaving;
  swapcontext(from, to);
#endif
}
inline Fiber* g_current = nullptr;
inline std::function<void()> g_kernel;
// The scheduler's random source (xorshift64*, fixed seed): cheap, since every barrier reshuffles
// the block's threads.
struct Random {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  using result_type = uint32_t;
  static constexpr uint32_t min() { return 0; }
  static constexpr uint32_t max() { return 0xffffffffu; }
  uint32_t operator()() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return static_cast<uint32_t>((state * 0x2545f4914f6cdd1dull) >> 32);
  }
  // Uniform in [0, n): the high half of a 32 × 32-bit product (a bias below 2^-32 · n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((static_cast<uint64_t>((*this)()) * n) >> 32); }
};
// QKV_EMULATOR_SEED (an integer) picks another schedule: results must not depend on it.
inline Random seeded_random() {
  Random r;
  if (const char* s = std::getenv("QKV_EMULATOR_SEED"))
    r.state ^= std::strtoull(s, nullptr, 10) * 0x9e3779b97f4a7c15ull;
  if (r.state == 0) r.state = 1;
  return r;
}
inline Random g_rng = seeded_random();

inline void shuffle(std::vector<int>& order) {
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[g_rng.below(static_cast<uint32_t>(i))]);
}

inline void suspend(State s) {
  g_current->state = s;
  switch_to(&g_current->context, &g_scheduler);
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
#if defined(QKV_EMU_ASAN)
  // The first entry does not return from switch_to: finish the switch here, learning the
  // scheduler's stack (the one switched from), which later switches back to it name.
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler.stack_bottom, &g_scheduler.stack_size);
#endif
  g_kernel();
  g_current->state = State::exited;
  switch_to(&g_current->context, &g_scheduler, /*leaving=*/true);
}

// Resets `f` to the start of the kernel, on its own stack (kept from block to block).
inline void start_fiber(Fiber& f) {
  std::unique_ptr<char[]> stack = std::move(f.stack);
  f = Fiber{};
  f.stack = stack ? std::move(stack) : std::unique_ptr<char[]>(new char[kStackBytes]);
#if defined(__x86_64__)
  // From the top (16-byte aligned): fiber_main's return address slot sits at a 16-byte boundary,
  // so fiber_main starts with rsp = 8 (mod 16) as after a call; below it the six registers
  // qkv_emu_switch pops (zero).
  const uintptr_t top = reinterpret_cast<uintptr_t>(f.stack.get() + kStackBytes) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top - 16);
  sp[0] = reinterpret_cast<void*>(&fiber_main);
  for (int r = 1; r <= 6; ++r) sp[-r] = nullptr;
  f.context.sp = &sp[-6];
  f.context.stack_bottom = f.stack.get();
  f.context.stack_size = kStackBytes;
#if defined(QKV_EMU_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(f.stack.get(), kStackBytes);
#endif
#else
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack.get();
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
#endif
}

// ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16 for one warp (layout at the top of the file).
inline void resolve_ldmatrix(Fiber* lanes, int first_thread) {
  const int matrices = lanes[0].ldmatrix_count;
  for (int i = 0; i < matrices; ++i)
    for (int r = 0; r < 8; ++r) {
      const Fiber& f = lanes[8 * i + r];
      if (reinterpret_cast<uintptr_t>(f.ldmatrix_row) % 16 != 0) fail("ldmatrix: a row address not 16-byte aligned");
      size_t offset;
      if (!shared_offset(f.ldmatrix_row, 16, &offset)) fail("ldmatrix: a row address outside shared memory");
      threadIdx.x = static_cast<unsigned>(first_thread + 8 * i + r);  // the reader, for the race checker
      record_read(f.ldmatrix_row, 16);
    }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < matrices; ++i) {
      const unsigned char* row = static_cast<const unsigned char*>(lanes[8 * i + l / 4].ldmatrix_row);
      uint32_t word;
      std::memcpy(&word, row + 4 * (l % 4), sizeof(word));  // elements 2(l%4), 2(l%4)+1: low, high half
      *lanes[l].ldmatrix_out[i] = word;
    }
}

// Resolves the collective that all `count` lanes of a warp wait at.
inline void resolve_collective(Fiber* lanes, int count, int first_thread) {
  const Collective op = lanes[0].collective;
  for (int l = 0; l < count; ++l) {
    const Fiber& f = lanes[l];
    if (f.collective != op) fail("lanes of a warp at different collectives");
    if (op == Collective::mma && f.mma_calls != lanes[0].mma_calls) fail("lanes at different mma calls");
    if (op == Collective::ldmatrix &&
        (f.ldmatrix_calls != lanes[0].ldmatrix_calls || f.ldmatrix_count != lanes[0].ldmatrix_count))
      fail("lanes at different ldmatrix calls");
    if (op == Collective::shuffle &&
        (f.shuffles != lanes[0].shuffles || f.shuffle_lane_mask != lanes[0].shuffle_lane_mask ||
         f.shuffle_bytes != lanes[0].shuffle_bytes))
      fail("lanes at different shuffles");
  }
  if (op == Collective::mma) {
    if (count != 32) fail("mma.sync in a warp of fewer than 32 threads");
    resolve_mma(lanes);
    return;
  }
  if (op == Collective::ldmatrix) {
    if (count != 32) fail("ldmatrix in a warp of fewer than 32 threads");
    resolve_ldmatrix(lanes, first_thread);
    return;
  }
  // __shfl_xor_sync: every lane named in the member mask must take part, and each reads a lane
  // that takes part.
  const unsigned present = count == 32 ? 0xffffffffu : (1u << count) - 1u;
  for (int l = 0; l < count; ++l) {
    if (lanes[l].shuffle_member_mask != present)
      fail("__shfl_xor_sync with a member mask other than the warp's threads");
    const int src = l ^ lanes[l].shuffle_lane_mask;
    if (src >= count) fail("__shfl_xor_sync reads a lane past the end of the block");
    lanes[l].shuffle_result = lanes[src].shuffle_value;
  }
}

// Runs block `block` of a kernel: `threads` threads each calling `kernel`, with `shared_bytes` of
// dynamic shared memory (filled with garbage). The block's warps are threads 32w .. 32w + 31.
inline void run_block(uint3 block, int threads, size_t shared_bytes, const std::function<void()>& kernel) {
  blockIdx = block;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  std::vector<unsigned char> shared(std::max<size_t>(shared_bytes, 1));
  for (auto& x : shared) x = static_cast<unsigned char>(g_rng());
  g_shared.data = shared_bytes ? shared.data() : nullptr;
  g_shared.size = shared_bytes;
  g_shared.history.assign(shared_bytes, ByteHistory{});
  g_shared.epoch = 0;
  g_kernel = kernel;
  if (g_fibers.size() < static_cast<size_t>(threads)) g_fibers.resize(threads);
  for (int t = 0; t < threads; ++t) start_fiber(g_fibers[t]);
  static std::vector<int> order;
  order.resize(threads);
  for (int t = 0; t < threads; ++t) order[t] = t;
  const int warps = (threads + 31) / 32;
  for (;;) {
    bool progress = false;
    shuffle(order);
    for (int t : order) {
      Fiber& f = g_fibers[t];
      if (f.state != State::ready) continue;
      threadIdx = {static_cast<unsigned>(t), 0, 0};
      g_current = &f;
      switch_to(&g_scheduler, &f.context);
      g_current = nullptr;
      progress = true;
    }
    for (int w = 0; w < warps; ++w) {
      Fiber* lanes = &g_fibers[w * 32];
      const int count = std::min(32, threads - w * 32);
      int waiting = 0;
      for (int l = 0; l < count; ++l) waiting += lanes[l].state == State::at_warp_collective;
      if (waiting == 0) continue;
      // A lane still ready would have run above, so the others have exited or wait at a barrier.
      if (waiting != count) fail("a warp collective without all lanes of the warp (divergence or exited lanes)");
      resolve_collective(lanes, count, w * 32);
      for (int l = 0; l < count; ++l) {
        lanes[l].collective = Collective::none;
        lanes[l].state = State::ready;
      }
      progress = true;
    }
    if (progress) continue;
    int at_barrier = 0, exited = 0;
    for (int t = 0; t < threads; ++t) {
      at_barrier += g_fibers[t].state == State::at_barrier;
      exited += g_fibers[t].state == State::exited;
    }
    if (exited == threads) break;
    if (at_barrier + exited == threads) {
      if (exited > 0) fail("__syncthreads with some threads of the block exited");
      for (int t = 0; t < threads; ++t)
        if (g_fibers[t].barriers != g_fibers[0].barriers) fail("threads at different __syncthreads");
      for (int t = 0; t < threads; ++t) g_fibers[t].state = State::ready;
      ++g_shared.epoch;
      continue;
    }
    fail("deadlock");
  }
  g_shared = SharedMemory{};
}

// Runs every block of a grid through run_block, one after another in a random order (a GPU gives
// no order either): a kernel whose result depends on the order of its blocks (one block reading
// what another writes, or two writing one address) then differs from run to run, which the
// tests' bitwise run-to-run checks catch.
inline void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel) {
  gridDim = {grid.x, grid.y, grid.z};
  const uint64_t count = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<uint64_t> order(count);
  for (uint64_t i = 0; i < count; ++i) order[i] = i;
  for (uint64_t i = count; i > 1; --i) {
    const uint64_t j = (uint64_t{g_rng()} << 32 | g_rng()) % i;
    std::swap(order[i - 1], order[j]);
  }
  for (const uint64_t i : order) {
    const unsigned x = static_cast<unsigned>(i % grid.x), y = static_cast<unsigned>(i / grid.x % grid.y),
                   z = static_cast<unsigned>(i / (uint64_t{grid.x} * grid.y));
    run_block({x, y, z}, static_cast<int>(block.x), shared_bytes, kernel);
  }
}

}  // namespace cuda_emu

// ---- The CUDA collectives the kernels call.
inline void __syncthreads() {
  ++cuda_emu::g_current->barriers;
  cuda_emu::suspend(cuda_emu::State::at_barrier);
}

template <class T>
T __shfl_xor_sync(unsigned member_mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= 8, "__shfl_xor_sync of a type wider than 8 bytes");
  cuda_emu::Fiber* f = cuda_emu::g_current;
  f->collective = cuda_emu::Collective::shuffle;
  f->shuffle_value = 0;
  std::memcpy(&f->shuffle_value, &value, sizeof(T));
  f->shuffle_lane_mask = lane_mask;
  f->shuffle_member_mask = member_mask;
  f->shuffle_bytes = sizeof(T);
  ++f->shuffles;
  cuda_emu::suspend(cuda_emu::State::at_warp_collective);
  T result;
  std::memcpy(&result, &f->shuffle_result, sizeof(T));
  return result;
}

inline void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  cuda_emu::Fiber* f = cuda_emu::g_current;
  f->collective = cuda_emu::Collective::mma;
  f->c = c;
  std::copy(a, a + 4, f->a);
  f->b0 = b0;
  f->b1 = b1;
  ++f->mma_calls;
  cuda_emu::suspend(cuda_emu::State::at_warp_collective);
}

inline void ldmatrix_collective(int matrices, const void* row, uint32_t* const* out) {
  cuda_emu::Fiber* f = cuda_emu::g_current;
  f->collective = cuda_emu::Collective::ldmatrix;
  f->ldmatrix_count = matrices;
  f->ldmatrix_row = row;
  for (int i = 0; i < matrices; ++i) f->ldmatrix_out[i] = out[i];
  ++f->ldmatrix_calls;
  cuda_emu::suspend(cuda_emu::State::at_warp_collective);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  uint32_t* const out[4] = {&r[0], &r[1], &r[2], &r[3]};
  ldmatrix_collective(4, row, out);
}
inline void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const __nv_bfloat16* row) {
  uint32_t* const out[2] = {&r0, &r1};
  ldmatrix_collective(2, row, out);
}
