// Internal to attention/cuda/: a sparse pattern as the CUDA kernels read it, shared by the tiled
// float32 kernels (fused_attention.cu) and the tensor-core ones (mma_attention_kernels.cuh). Plain
// values and device pointers, no CUDA types, so host code (the plans) and the host emulation of
// the tensor-core kernels include it as it is.
#pragma once
#include <cstdint>

namespace qkv::attn {

// A sparse pattern's predicate on the device: its parameters with "auto" resolved (PatternPredicate)
// and device tables (owned by the plan) for what is not arithmetic. kind = static_cast<int>(Pattern);
// 0 (full) is no pattern.
struct DevicePattern {
  int kind = 0;
  int64_t s = 1, l = 1, g = 0, bs = 64, r = 0;
  const int64_t* globals = nullptr;  // sorted explicit global positions (replace g when set)
  int64_t n_globals = 0;
  const int64_t* rand = nullptr;   // bigbird: [query block, r] random key block, for the Nk / bs blocks
  int layout = 0;                  // block_sparse: 0 local_global, 1 fixed, 2 the table below
  const int64_t* table = nullptr;  // block_sparse layout file [rows, cols], 1 = visible block pair
  int64_t rows = 0, cols = 0;
};

// One kernel's walk of the block layout: for each outer tile o (query tile for forward and dQ, key
// tile for dK/dV), entries tiles[ptr[o] .. ptr[o + 1]) = (inner tile << 1) | full, inner tiles in
// increasing order; empty tiles are absent.
struct DeviceLayout {
  int64_t tq = 0, tk = 0;
  const int64_t* ptr = nullptr;
  const int64_t* tiles = nullptr;
};

}  // namespace qkv::attn
