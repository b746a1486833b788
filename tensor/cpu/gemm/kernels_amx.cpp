// qkv's bf16 GEMM on AMX tiles (TDPBF16PS): a 32 x 32 block of C in tile registers 0-3, A's two
// 16-row halves in 4-5 and B's two 16-column halves in 6-7, k in steps of 32 (16 pairs). Compiled
// with -mamx-tile -mamx-bf16 (CMakeLists.txt); it runs only where cpu_features() reports AMX-BF16
// and the kernel granted this process the tile state (request_amx).
#include "tensor/cpu/gemm/bf16_tile.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#endif

namespace qkv::cpu::gemm_detail {

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
namespace {

// The tile intrinsics are asm statements that name no memory: a compiler barrier keeps the
// stores to what they read before them and the reads of what they wrote after them.
inline void memory_barrier(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

// Palette 1, eight tiles of 16 rows x 64 bytes (16 float32 or 16 bf16 pairs per row).
void configure_tiles() {
  alignas(64) unsigned char config[64] = {};
  config[0] = 1;
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;  // bytes per row (little-endian uint16)
    config[48 + t] = 16;      // rows
  }
  memory_barrier(config);
  _tile_loadconfig(config);
}
void release_tiles() { _tile_release(); }

struct TileInstructions {
  static void zero() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  static void step(const uint32_t* a, const uint32_t* b) {
    memory_barrier(a);
    memory_barrier(b);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 16 * 16, 64);
    _tile_loadd(6, b, 128);
    _tile_loadd(7, b + 16, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  static void store(float* acc) {
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
    memory_barrier(acc);
  }
};

}  // namespace
const Bf16KernelTable kAmxKernel = {
    "amx", 32, 32, 512, 128, 2048, 16, &amx_tile<TileInstructions>, &configure_tiles, &release_tiles};
#else
const Bf16KernelTable kAmxKernel = {};
#endif

}  // namespace qkv::cpu::gemm_detail
