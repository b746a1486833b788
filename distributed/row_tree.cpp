// The row tree of invariant training (see row_tree.h).
#include "distributed/row_tree.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "tensor/error.h"

namespace qkv::dist {
namespace {

// a[i] = a[i] + b[i]: one rounding per element, the same whatever the thread split.
void add_into(float* a, const float* b, int64_t n) {
  const bool parallel = n >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
}

// out[i] = a[i] + b[i].
void add_to(float* out, const float* a, const float* b, int64_t n) {
  const bool parallel = n >= (1 << 18) && !omp_in_parallel();
#pragma omp parallel for simd schedule(static) if (parallel)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// a[i] = a[i] + 0: a row without a gradient for these elements is +0 there, and -0 + +0 = +0.
void add_zero(float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] + 0.0f;
}

// out[i] = a[i] + 0 (the same as above, into out).
void copy_plus_zero(float* out, const float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + 0.0f;
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

// `left` and `right` are the two children of one node: same level, adjacent, left aligned to the
// parent's size.
bool siblings(const RowBlock& left, const RowBlock& right) {
  const int64_t size = int64_t{1} << left.level;
  return left.level == right.level && left.first_row + size == right.first_row && left.first_row % (2 * size) == 0;
}

}  // namespace

void push_block(std::vector<RowBlock>& stack, RowBlock b, int64_t n, std::vector<float*>* released) {
  QKV_CHECK(stack.empty() || stack.back().first_row + (int64_t{1} << stack.back().level) == b.first_row,
            "[row_tree] rows must be pushed in consecutive order: block at row ", b.first_row, " after rows up to ",
            stack.empty() ? 0 : stack.back().first_row + (int64_t{1} << stack.back().level));
  while (!stack.empty() && siblings(stack.back(), b)) {
    RowBlock left = stack.back();
    stack.pop_back();
    add_into(left.data, b.data, n);
    if (released) released->push_back(b.data);
    left.level += 1;
    b = left;
  }
  stack.push_back(b);
}

void fold_blocks(const std::vector<RowBlock>& stack, int64_t n, float* out) {
  if (stack.empty()) {
    std::memset(out, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const size_t k = stack.size();
  if (k == 1) {
    std::memcpy(out, stack[0].data, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  add_to(out, stack[k - 2].data, stack[k - 1].data, n);
  for (size_t i = k - 2; i-- > 0;) add_into(out, stack[i].data, n);
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

void RowTree::clear() {
  for (const RowBlock& b : stack_) free_.push_back(b.data);
  stack_.clear();
}

float* RowTree::take_buffer() {
  if (free_.empty()) {
    buffers_.push_back(std::make_unique<float[]>(static_cast<size_t>(n_)));
    return buffers_.back().get();
  }
  float* p = free_.back();
  free_.pop_back();
  return p;
}

void RowTree::push_pair(const std::vector<Piece>& left, const std::vector<Piece>& right, int64_t row) {
  QKV_CHECK(row % 2 == 0 && left.size() == right.size(), "[row_tree] a pair starts at an even row (", row,
            ") and has two leaves of the same pieces");
  check_tiling(left);
  for (size_t i = 0; i < left.size(); ++i)
    QKV_CHECK(left[i].offset == right[i].offset && left[i].n == right[i].n,
              "[row_tree] the pair's pieces differ at piece ", i);
  float* node = take_buffer();
  for_piece_chunks(left, n_, [&](size_t i, int64_t lo, int64_t hi) {
    const float* a = left[i].data;
    const float* b = right[i].data;
    float* out = node + left[i].offset + lo;
    if (a && b) add_to(out, a + lo, b + lo, hi - lo);
    else if (a || b) copy_plus_zero(out, (a ? a : b) + lo, hi - lo);
    else std::memset(out, 0, static_cast<size_t>(hi - lo) * sizeof(float));
  });
  push_block(stack_, RowBlock{row, 1, node}, n_, &free_);
}

void RowTree::push(const float* leaf, int64_t row) { push(std::vector<Piece>{{0, n_, leaf}}, row); }

void RowTree::check_tiling(const std::vector<Piece>& leaf) const {
  int64_t covered = 0;
  for (const Piece& p : leaf) {
    QKV_CHECK(p.offset == covered && p.n >= 0, "[row_tree] the pieces of a row must tile [0, ", n_, ") in order");
    covered += p.n;
  }
  QKV_CHECK(covered == n_, "[row_tree] the pieces of a row cover ", covered, " of ", n_, " elements");
}

void RowTree::push(const std::vector<Piece>& leaf, int64_t row) {
  check_tiling(leaf);
  // A row that is the right child of the top block is added into it without a copy.
  RowBlock b{row, 0, nullptr};
  if (!stack_.empty() && siblings(stack_.back(), b)) {
    RowBlock left = stack_.back();
    stack_.pop_back();
    for_piece_chunks(leaf, n_, [&](size_t i, int64_t lo, int64_t hi) {
      float* into = left.data + leaf[i].offset + lo;
      if (leaf[i].data) add_into(into, leaf[i].data + lo, hi - lo);
      else add_zero(into, hi - lo);
    });
    left.level = 1;
    push_block(stack_, left, n_, &free_);
    return;
  }
  b.data = take_buffer();
  for_piece_chunks(leaf, n_, [&](size_t i, int64_t lo, int64_t hi) {
    float* out = b.data + leaf[i].offset + lo;
    if (leaf[i].data) std::memcpy(out, leaf[i].data + lo, static_cast<size_t>(hi - lo) * sizeof(float));
    else std::memset(out, 0, static_cast<size_t>(hi - lo) * sizeof(float));
  });
  push_block(stack_, b, n_, &free_);
}

}  // namespace qkv::dist
