// Shape ops that copy. cat's vjp slices dy back into the inputs (narrow views); each piece of
// split is its own node (the engine keeps one gradient per node) placing its dy into zeros of the
// input's shape; index_select's vjp scatter-adds dy rows back with index_add.
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

// d(cat(a_0..a_k, dim)) = (narrow(dy, dim, off_i, len_i))_i
struct CatBackward : Node {
  int dim = 0;
  std::vector<int64_t> sizes;
  const char* name() const override { return "CatBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    std::vector<Tensor> grads(sizes.size());
    int64_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (needs_grad(i)) grads[i] = dy.narrow(dim, at, sizes[i]);
      at += sizes[i];
    }
    return grads;
  }
};

// d(split(a)[i]) = dy placed at [start, start + len) along dim of zeros(a.shape)
struct SplitBackward : Node {
  Shape in_shape;
  int dim = 0;
  int64_t start = 0;
  const char* name() const override { return "SplitBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    Tensor dx = zeros(in_shape, dy.dtype(), dy.device());
    copy_(dx.narrow(dim, start, dy.size(dim)), dy);
    return {dx};
  }
};

// d(index_select(a, dim, idx)) = index_add(zeros(a.shape), dim, idx, dy)
struct IndexSelectBackward : Node {
  Shape in_shape;
  int dim = 0;
  Tensor index;
  const char* name() const override { return "IndexSelectBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {index_add(in_shape, dim, index, dy)}; }
  void release() override { index = Tensor(); }
};

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int dim) {
  Tensor out = qkv::cat(tensors, dim);
  bool any = false;
  for (const Tensor& t : tensors) any = any || autograd::any_requires_grad({&t});
  if (!any) return out;
  auto n = std::make_shared<CatBackward>();
  n->dim = normalize_dim(dim, tensors[0].dim(), "cat");
  for (const Tensor& t : tensors) n->sizes.push_back(t.size(n->dim));
  return record(out, n, tensors);
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int dim) {
  std::vector<Tensor> parts = qkv::split(a, sizes, dim);
  if (!autograd::any_requires_grad({&a})) return parts;
  const int d = normalize_dim(dim, a.dim(), "split");
  int64_t at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto n = std::make_shared<SplitBackward>();
    n->in_shape = a.shape();
    n->dim = d;
    n->start = at;
    at += sizes[i];
    parts[i] = record(parts[i], n, {a});
  }
  return parts;
}

Tensor index_select(const Tensor& a, int dim, const Tensor& index) {
  Tensor out = qkv::index_select(a, dim, index);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<IndexSelectBackward>();
  n->in_shape = a.shape();
  n->dim = normalize_dim(dim, a.dim(), "index_select");
  n->index = index;
  return record(out, n, {a});
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_shape_gradchecks(GradcheckRegistry& r) {
  using V = std::vector<Tensor>;
  using X = const std::vector<Tensor>&;
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  auto tr = [](const Tensor& t) { return ag::transpose(t, 0, 1); };

  r.add({"cat", "[2,3] and [4,3] along dim 0",
         [=] {
           return V{in({2, 3}, 201), in({4, 3}, 202)};
         },
         [](X x) {
           return ag::cat({x[0], x[1]}, 0);
         }});
  r.add({"cat", "three along dim -1 incl. a size-1 piece",
         [=] {
           return V{in({3, 2}, 203), in({3, 1}, 204), in({3, 5}, 205)};
         },
         [](X x) {
           return ag::cat({x[0], x[1], x[2]}, -1);
         }});
  r.add({"cat", "transposed [3,2]^T with [2,4] along dim 1",
         [=] {
           return V{in({3, 2}, 206), in({2, 4}, 207)};
         },
         [=](X x) {
           return ag::cat({tr(x[0]), x[1]}, 1);
         }});
  r.add({"cat", "one input used twice",
         [=] {
           return V{in({2, 3}, 208)};
         },
         [](X x) {
           return ag::cat({x[0], x[0]}, 0);
         }});
  // Pieces are recombined with different weights so the check sees which piece went where.
  r.add({"split", "[7,3] into 2,4,1 along dim 0",
         [=] {
           return V{in({7, 3}, 209)};
         },
         [=](X x) {
           auto p = ag::split(x[0], {2, 4, 1}, 0);
           return ag::add(ag::add(ag::sum(ag::mul(p[0], in({2, 3}, 210))), ag::sum(ag::mul(p[1], 3.0))),
                          ag::sum(ag::mul(p[2], p[2])));
         }});
  r.add({"split", "transposed [5,4]^T into 3,2 along dim 1, one piece unused",
         [=] {
           return V{in({5, 4}, 211)};
         },
         [=](X x) {
           auto p = ag::split(tr(x[0]), {3, 2}, 1);
           return ag::mul(p[0], in({4, 3}, 212));
         }});
  r.add({"index_select", "rows of [5,3] with repeats",
         [=] {
           return V{in({5, 3}, 213)};
         },
         [](X x) {
           return ag::index_select(x[0], 0, from_vector_i64({4, 0, 4, 2, 4}, {5}));
         }});
  r.add({"index_select", "dim 1 of [2,6,3] (int32 index)",
         [=] {
           return V{in({2, 6, 3}, 214)};
         },
         [](X x) {
           return ag::index_select(x[0], 1, from_vector_i64({5, 1, 1}, {3}, DType::i32));
         }});
  r.add({"index_select", "transposed [4,3]^T along dim -1",
         [=] {
           return V{in({4, 3}, 215)};
         },
         [=](X x) {
           return ag::index_select(tr(x[0]), -1, from_vector_i64({3, 0}, {2}));
         }});
}

}  // namespace qkv::autograd
