// View ops: forward is a new view over the same storage (no copy); backward maps the gradient
// back to the input's shape.
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

// d(reshape(a)) = reshape(dy, a.shape)
struct ReshapeBackward : Node {
  Shape in_shape;
  const char* name() const override { return "ReshapeBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {dy.reshape(in_shape)}; }
};

// d(permute(a, p)) = permute(dy, p^-1)
struct PermuteBackward : Node {
  std::vector<int> inverse;
  const char* name() const override { return "PermuteBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {dy.permute(inverse)}; }
};

// d(narrow(a, dim, start, len)) = dy placed at [start, start+len) of zeros(a.shape)
// When the engine already holds a gradient for `a` that nothing else refers to (a sibling narrow
// of the same tensor ran first, e.g. the q/k/v pieces of a fused projection), dy is added into its
// slice in place: one full-size buffer for all the pieces instead of one zero-filled copy each.
struct NarrowBackward : Node {
  Shape in_shape;
  int dim = 0;
  int64_t start = 0;
  const char* name() const override { return "NarrowBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    Tensor dx = zeros(in_shape, dy.dtype(), dy.device());
    copy_(dx.narrow(dim, start, dy.size(dim)), dy);
    return {dx};
  }
  std::vector<Tensor> backward_accumulate(const Tensor& dy, autograd::PendingGrads& pending) override {
    if (const Tensor* g = pending.exclusive(0, in_shape, dy.dtype())) {
      add_(g->narrow(dim, start, dy.size(dim)), dy);
      return {Tensor()};
    }
    return backward(dy);
  }
};

// d(expand(a)) = sum of dy over the broadcast dims
struct ExpandBackward : Node {
  Shape in_shape;
  const char* name() const override { return "ExpandBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {sum_to(dy, in_shape)}; }
};

// contiguous() is the identity on values
struct ContiguousBackward : Node {
  const char* name() const override { return "ContiguousBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {dy}; }
};

Tensor reshape_node(const Tensor& a, Tensor out) {
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<ReshapeBackward>();
  n->in_shape = a.shape();
  return record(out, n, {a});
}

}  // namespace

Tensor reshape(const Tensor& a, const Shape& shape) { return reshape_node(a, a.reshape(shape)); }
Tensor unsqueeze(const Tensor& a, int dim) { return reshape_node(a, a.unsqueeze(dim)); }
Tensor squeeze(const Tensor& a, int dim) { return reshape_node(a, a.squeeze(dim)); }

Tensor permute(const Tensor& a, const std::vector<int>& dims) {
  Tensor out = a.permute(dims);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<PermuteBackward>();
  n->inverse.resize(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) n->inverse[normalize_dim(dims[i], a.dim(), "permute")] = static_cast<int>(i);
  return record(out, n, {a});
}

Tensor transpose(const Tensor& a, int d0, int d1) {
  std::vector<int> p(a.dim());
  for (int i = 0; i < a.dim(); ++i) p[i] = i;
  std::swap(p[normalize_dim(d0, a.dim(), "transpose")], p[normalize_dim(d1, a.dim(), "transpose")]);
  return permute(a, p);
}

Tensor narrow(const Tensor& a, int dim, int64_t start, int64_t length) {
  Tensor out = a.narrow(dim, start, length);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<NarrowBackward>();
  n->in_shape = a.shape();
  n->dim = normalize_dim(dim, a.dim(), "narrow");
  n->start = start;
  return record(out, n, {a});
}

Tensor expand(const Tensor& a, const Shape& shape) {
  Tensor out = a.expand(shape);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<ExpandBackward>();
  n->in_shape = a.shape();
  return record(out, n, {a});
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = a.contiguous();
  if (!autograd::any_requires_grad({&a})) return out;
  return record(out, std::make_shared<ContiguousBackward>(), {a});
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_view_gradchecks(GradcheckRegistry& r) {
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  // Each view is followed by a multiply with a fixed tensor so the check sees where every element went.
  r.add({"reshape", "[2,3,4]->[4,6]",
         [=] {
           return std::vector<Tensor>{in({2, 3, 4}, 1)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::reshape(x[0], {4, 6}), in({4, 6}, 2));
         }});
  r.add({"permute", "[2,3,4] (2,0,1)",
         [=] {
           return std::vector<Tensor>{in({2, 3, 4}, 3)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::permute(x[0], {2, 0, 1}), in({4, 2, 3}, 4));
         }});
  r.add({"transpose", "[3,5] then reshape through a copy",
         [=] {
           return std::vector<Tensor>{in({3, 5}, 5)};
         },
         [=](const std::vector<Tensor>& x) { return ag::reshape(ag::transpose(x[0], 0, 1), {15}); }});
  r.add({"narrow", "[4,5] dim1 [1,4)",
         [=] {
           return std::vector<Tensor>{in({4, 5}, 6)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::narrow(x[0], 1, 1, 3), in({4, 3}, 7));
         }});
  r.add({"expand", "[3,1]->[2,3,4]",
         [=] {
           return std::vector<Tensor>{in({3, 1}, 8)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::expand(x[0], {2, 3, 4}), in({2, 3, 4}, 9));
         }});
  r.add({"unsqueeze", "[3,4] at 1",
         [=] {
           return std::vector<Tensor>{in({3, 4}, 10)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::unsqueeze(x[0], 1), in({3, 1, 4}, 11));
         }});
  r.add({"squeeze", "[3,1,4] at 1",
         [=] {
           return std::vector<Tensor>{in({3, 1, 4}, 12)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::squeeze(x[0], 1), in({3, 4}, 13));
         }});
  r.add({"contiguous", "transposed [4,3]",
         [=] {
           return std::vector<Tensor>{in({3, 4}, 14)};
         },
         [=](const std::vector<Tensor>& x) {
           return ag::mul(ag::contiguous(ag::transpose(x[0], 0, 1)), in({4, 3}, 15));
         }});
}

}  // namespace qkv::autograd
