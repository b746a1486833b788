// The gradient of invariant training (train.numerics = "invariant") as a sum over the rows of the
// global batch in ONE binary tree of their global indices, so that its bits do not depend on how
// the G rows are split into ranks, micro-batches and batch rows (docs/distributed.md).
//
// Each row's gradient (a leaf: the row's forward and backward alone) is a vector of n floats.
// The tree is the one of pairwise summation from the left: a node is an aligned block of rows
// [j·2^l, (j+1)·2^l) inside [0, G); its value is left child + right child, formed as soon as both
// are complete. Rows not covered by a full aligned block (G not a power of two) leave a stack of
// maximal aligned blocks B_0, ..., B_k in row order, folded last as B_0 + (B_1 + (... + B_k)).
//
// Why it composes: a rank (or a micro-batch) that sums its own contiguous rows by the same rule
// ends with the maximal aligned blocks of its range, each a node of the global tree with the
// same bits; pushing every rank's blocks in row order through the same rule forms the remaining
// nodes from the same children. Float addition is commutative, so which operand is on the left
// never matters; only the grouping does, and the grouping is fixed by the row indices alone.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::dist {

// A node of the tree held in memory: rows [first_row, first_row + 2^level), n floats at data.
struct RowBlock {
  int64_t first_row = 0;
  int level = 0;
  float* data = nullptr;
};

// Pushes `b` (the rows right after the stack's last block) onto `stack`, merging it with the top
// while they are the two children of one node: top.data[i] = top.data[i] + b.data[i] over n.
// The data of each right child merged away is appended to `released` when given.
// `device`: where the blocks' memory is (the sums are the same bits on either).
void push_block(std::vector<RowBlock>& stack, RowBlock b, int64_t n, std::vector<float*>* released = nullptr,
                Device device = Device::cpu);
// out = B_0 + (B_1 + (... + B_k)) over n floats; out may alias no block. An empty stack gives 0.
void fold_blocks(const std::vector<RowBlock>& stack, int64_t n, float* out, Device device = Device::cpu);
// The maximal aligned blocks of rows [first, first + count): (first_row, level) in row order.
std::vector<RowBlock> block_shapes(int64_t first, int64_t count);

// One rank's part of the tree: its rows' gradients pushed one at a time, in increasing
// consecutive order of their global index. Owns the blocks' memory (at most about 2·log2(rows)
// vectors of n floats).
class RowTree {
 public:
  // Leaves and blocks of n floats in `device` memory (the leaves' pieces point there too); a
  // float addition rounds the same on the host and on a GPU, so the bits do not depend on it.
  explicit RowTree(int64_t n, Device device = Device::cpu);
  int64_t size() const { return n_; }
  Device device() const { return device_; }
  // Forgets every row (the buffers are kept for the next step).
  void clear();
  // Adds row `row`'s gradient (n floats, copied).
  void push(const float* leaf, int64_t row);
  // The same with the gradient in pieces that tile [0, n) in order (data null: +0, as a row
  // without a gradient for them has: every merge adds it, so -0 + +0 = +0 whichever way the
  // rows arrive).
  struct Piece {
    int64_t offset = 0, n = 0;
    const float* data = nullptr;
  };
  void push(const std::vector<Piece>& leaf, int64_t row);
  // Rows `row` (even) and row + 1 at once: their node is written as left + right in one pass,
  // without a copy of the left leaf (the same bits as pushing both).
  void push_pair(const std::vector<Piece>& left, const std::vector<Piece>& right, int64_t row);
  // The blocks held, in row order.
  const std::vector<RowBlock>& blocks() const { return stack_; }
  // The sum of every row pushed, in the tree's order, into out (n floats).
  void fold(float* out) const { fold_blocks(stack_, n_, out, device_); }

 private:
  float* take_buffer();
  void check_tiling(const std::vector<Piece>& leaf) const;  // pieces tile [0, n) in order
  void check_next(int64_t row) const;                       // row follows the stack's last block
  // How many blocks off the top a block b pushed now merges with.
  int merges_of(RowBlock b) const;
  // Pushes the leaf `first` (second null: level 0) or the pair first + *second (level 1) at `row`,
  // merged with `merges` blocks off the top in one pass.
  void push_merged(const std::vector<Piece>& first, const std::vector<Piece>* second, int64_t row, int level,
                   int merges);

  int64_t n_;
  Device device_;
  std::vector<RowBlock> stack_;
  // Owned; free ones listed in free_. Host blocks are plain memory, outside the tensor allocator's
  // counts (`qkv cost` reports them apart from a step's tensors: row_tree_bytes).
  std::vector<std::unique_ptr<float[]>> host_buffers_;
  std::vector<Tensor> device_buffers_;
  std::vector<float*> free_;
};

}  // namespace qkv::dist
