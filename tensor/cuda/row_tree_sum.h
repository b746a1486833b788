// The row tree's element operation (distributed/row_tree.h) on device memory:
//   base = pair ? a + b : a          (a null: +0; in a pair a null operand is +0: x + 0)
//   out  = tops[k-1] + (... + (tops[0] + base))
// each a rounded float32 addition in that order, as the host computes it, so a tree summed on a
// GPU has the host's bits. out may alias a top (each element is read before it is written).
// Runs on the default stream, ordered with the training's kernels. A build without CUDA throws.
#pragma once
#include <cstdint>

namespace qkv::cuda {

constexpr int kRowTreeMaxTops = 64;  // blocks merged in one pass: 2·log2 of the rows, at most
void row_tree_sum(float* out, const float* a, const float* b, bool pair, const float* const* tops, int ntops,
                  int64_t n);

}  // namespace qkv::cuda
