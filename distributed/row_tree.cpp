// The row tree of invariant training (see row_tree.h).
#include "distributed/row_tree.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "tensor/cuda/row_tree_sum.h"
#include "tensor/error.h"

namespace qkv::dist {
namespace {

// The tree's one element operation, on the host (see tensor/cuda/row_tree_sum.h for the device):
//   base = pair ? a + b : a   (a null: +0; in a pair a null operand is +0: x + 0)
//   out = tops[k-1] + (... + (tops[0] + base))
// each a rounded float addition in that order, `count` elements; out may alias a top. Blocks of
// 256 elements keep the running sums in L1 while the tops stream.
void sum_chain_host(float* out, const float* a, const float* b, bool pair, const std::vector<const float*>& tops,
                    int64_t count) {
  constexpr int64_t kBlock = 256;
  float v[kBlock];
  for (int64_t e0 = 0; e0 < count; e0 += kBlock) {
    const int64_t m = std::min(kBlock, count - e0);
    if (!pair) {
      if (a) std::memcpy(v, a + e0, static_cast<size_t>(m) * sizeof(float));
      else std::fill(v, v + m, 0.0f);
    } else if (a && b) {
      for (int64_t e = 0; e < m; ++e) v[e] = a[e0 + e] + b[e0 + e];
    } else if (a || b) {
      const float* x = a ? a : b;
      for (int64_t e = 0; e < m; ++e) v[e] = x[e0 + e] + 0.0f;
    } else {
      std::fill(v, v + m, 0.0f);
    }
    for (const float* t : tops)
      for (int64_t e = 0; e < m; ++e) v[e] = t[e0 + e] + v[e];
    std::memcpy(out + e0, v, static_cast<size_t>(m) * sizeof(float));
  }
}

// Calls fn(piece index, lo, hi) for the parts [lo, hi) (offsets inside the piece) of pieces that
// tile [0, n) in order, in fixed chunks of the flat range shared over the threads: a leaf of many
// small parameters is split as evenly as one of a few large ones.
template <class Fn>
void for_piece_chunks(const std::vector<RowTree::Piece>& pieces, int64_t n, Fn fn) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const bool parallel = n >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    // The last piece starting at or before lo, then every piece starting before hi.
    size_t i = static_cast<size_t>(std::upper_bound(pieces.begin(), pieces.end(), lo,
                                                    [](int64_t at, const RowTree::Piece& p) { return at < p.offset; }) -
                                   pieces.begin());
    for (i = i > 0 ? i - 1 : 0; i < pieces.size() && pieces[i].offset < hi; ++i) {
      const RowTree::Piece& p = pieces[i];
      const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.n);
      if (b > a) fn(i, a - p.offset, b - p.offset);
    }
  }
}

// The chain over the leaf `first` (and `second` for a pair) piece by piece, `tops` being whole
// blocks (offset by each piece's place), into out (a whole block).
void sum_chain_pieces(Device device, float* out, const std::vector<RowTree::Piece>& first,
                      const std::vector<RowTree::Piece>* second, const std::vector<const float*>& tops, int64_t n) {
  const bool pair = second != nullptr;
  const auto operands = [&](size_t i, int64_t lo, std::vector<const float*>& shifted) {
    shifted.clear();
    for (const float* t : tops) shifted.push_back(t + first[i].offset + lo);
  };
  if (device == Device::cpu) {
    for_piece_chunks(first, n, [&](size_t i, int64_t lo, int64_t hi) {
      std::vector<const float*> shifted;
      operands(i, lo, shifted);
      const float* a = first[i].data ? first[i].data + lo : nullptr;
      const float* b = pair && (*second)[i].data ? (*second)[i].data + lo : nullptr;
      sum_chain_host(out + first[i].offset + lo, a, b, pair, shifted, hi - lo);
    });
    return;
  }
  std::vector<const float*> shifted;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i].n == 0) continue;
    operands(i, 0, shifted);
    cuda::row_tree_sum(out + first[i].offset, first[i].data, pair ? (*second)[i].data : nullptr, pair, shifted.data(),
                       static_cast<int>(shifted.size()), first[i].n);
  }
}

// The same over one whole range of n floats.
void sum_chain(Device device, float* out, const float* a, const std::vector<const float*>& tops, int64_t n) {
  sum_chain_pieces(device, out, {{0, n, a}}, nullptr, tops, n);
}

// `left` and `right` are the two children of one node: same level, adjacent, left aligned to the
// parent's size.
bool siblings(const RowBlock& left, const RowBlock& right) {
  const int64_t size = int64_t{1} << left.level;
  return left.level == right.level && left.first_row + size == right.first_row && left.first_row % (2 * size) == 0;
}

}  // namespace

void push_block(std::vector<RowBlock>& stack, RowBlock b, int64_t n, std::vector<float*>* released, Device device) {
  QKV_CHECK(stack.empty() || stack.back().first_row + (int64_t{1} << stack.back().level) == b.first_row,
            "[row_tree] rows must be pushed in consecutive order: block at row ", b.first_row, " after rows up to ",
            stack.empty() ? 0 : stack.back().first_row + (int64_t{1} << stack.back().level));
  while (!stack.empty() && siblings(stack.back(), b)) {
    RowBlock left = stack.back();
    stack.pop_back();
    sum_chain(device, left.data, b.data, {left.data}, n);  // left + b
    if (released) released->push_back(b.data);
    left.level += 1;
    b = left;
  }
  stack.push_back(b);
}

void fold_blocks(const std::vector<RowBlock>& stack, int64_t n, float* out, Device device) {
  // B_0 + (B_1 + (... + B_k)): B_k, then B_{k-1} + that, ..., B_0 + that, in one pass.
  std::vector<const float*> tops;
  for (size_t i = stack.size(); i-- > 1;) tops.push_back(stack[i - 1].data);
  sum_chain(device, out, stack.empty() ? nullptr : stack.back().data, tops, n);
}

std::vector<RowBlock> block_shapes(int64_t first, int64_t count) {
  std::vector<RowBlock> stack;
  // Row by row through the same rule, without data: the shapes only.
  for (int64_t r = first; r < first + count; ++r) {
    RowBlock b{r, 0, nullptr};
    while (!stack.empty() && siblings(stack.back(), b)) {
      b = stack.back();
      stack.pop_back();
      b.level += 1;
    }
    stack.push_back(b);
  }
  return stack;
}

RowTree::RowTree(int64_t n, Device device) : n_(n), device_(device) {}

void RowTree::clear() {
  for (const RowBlock& b : stack_) free_.push_back(b.data);
  stack_.clear();
}

float* RowTree::take_buffer() {
  if (free_.empty()) {
    if (device_ == Device::cpu) {
      host_buffers_.push_back(std::make_unique<float[]>(static_cast<size_t>(n_)));
      return host_buffers_.back().get();
    }
    device_buffers_.push_back(Tensor::empty({n_}, DType::f32, device_));
    return device_buffers_.back().data<float>();
  }
  float* p = free_.back();
  free_.pop_back();
  return p;
}

int RowTree::merges_of(RowBlock b) const {
  int k = 0;
  for (auto it = stack_.rbegin(); it != stack_.rend() && siblings(*it, b); ++it, ++k)
    b = {it->first_row, it->level + 1};
  return k;
}

void RowTree::push_merged(const std::vector<Piece>& first, const std::vector<Piece>* second, int64_t row, int level,
                          int merges) {
  // The node of the leaves (a + b for a pair, the leaf alone at level 0), then `merges` blocks
  // off the top: v = top_j + v from the nearest, the order push_block would take; the result goes
  // into the deepest block's buffer, read and written once.
  const size_t top = stack_.size();
  std::vector<const float*> tops;
  for (int j = 0; j < merges; ++j) tops.push_back(stack_[top - 1 - j].data);
  float* out = merges > 0 ? stack_[top - merges].data : take_buffer();
  sum_chain_pieces(device_, out, first, second, tops, n_);
  RowBlock merged{row, level, out};
  for (int j = 0; j < merges; ++j) {
    const RowBlock& t = stack_[top - 1 - j];
    merged = {t.first_row, merged.level + 1, out};
    if (j + 1 < merges) free_.push_back(t.data);  // merged away: only the deepest buffer is kept
  }
  stack_.resize(top - merges);
  stack_.push_back(merged);
}

void RowTree::push_pair(const std::vector<Piece>& left, const std::vector<Piece>& right, int64_t row) {
  QKV_CHECK(row % 2 == 0 && left.size() == right.size(), "[row_tree] a pair starts at an even row (", row,
            ") and has two leaves of the same pieces");
  check_tiling(left);
  for (size_t i = 0; i < left.size(); ++i)
    QKV_CHECK(left[i].offset == right[i].offset && left[i].n == right[i].n,
              "[row_tree] the pair's pieces differ at piece ", i);
  check_next(row);
  push_merged(left, &right, row, 1, merges_of({row, 1}));
}

void RowTree::push(const float* leaf, int64_t row) { push(std::vector<Piece>{{0, n_, leaf}}, row); }

void RowTree::push(const std::vector<Piece>& leaf, int64_t row) {
  check_tiling(leaf);
  check_next(row);
  push_merged(leaf, nullptr, row, 0, merges_of({row, 0}));
}

void RowTree::check_tiling(const std::vector<Piece>& leaf) const {
  int64_t covered = 0;
  for (const Piece& p : leaf) {
    QKV_CHECK(p.offset == covered && p.n >= 0, "[row_tree] the pieces of a row must tile [0, ", n_, ") in order");
    covered += p.n;
  }
  QKV_CHECK(covered == n_, "[row_tree] the pieces of a row cover ", covered, " of ", n_, " elements");
}

void RowTree::check_next(int64_t row) const {
  const int64_t next = stack_.empty() ? row : stack_.back().first_row + (int64_t{1} << stack_.back().level);
  QKV_CHECK(row == next, "[row_tree] rows must be pushed in consecutive order: block at row ", row,
            " after rows up to ", next);
}

}  // namespace qkv::dist
