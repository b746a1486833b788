// Reductions and softmax. The sum/mean vjps broadcast dy back over the reduced dims (an expand
// view: no copy); max sends dy to the first maximum only; softmax/log_softmax call the fused
// backward kernels with the saved output.
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

// dy with the reduced dims put back as size 1 (keepdim layout).
Tensor keepdim_view(const Tensor& dy, const Shape& in_shape, const std::vector<bool>& reduced) {
  Shape k = in_shape;
  for (size_t d = 0; d < k.size(); ++d)
    if (reduced[d]) k[d] = 1;
  return dy.reshape(k);
}

// d(sum(a, dims)) = expand(dy, a.shape); mean multiplies by 1/count
struct SumBackward : Node {
  Shape in_shape;
  std::vector<bool> reduced;
  bool is_mean = false;
  double scale = 1.0;  // 1/count for mean
  const char* name() const override { return is_mean ? "MeanBackward" : "SumBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    Tensor g = keepdim_view(dy, in_shape, reduced);
    if (scale != 1.0) g = qkv::mul(g, scale);
    return {g.expand(in_shape)};
  }
};

// d(max(a, dim)) = dy at the first maximum (argmax), 0 elsewhere
struct MaxBackward : Node {
  Shape in_shape;
  int dim = 0;
  Tensor index;  // argmax with keepdim, int64
  const char* name() const override { return "MaxBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    Shape k = in_shape;
    k[dim] = 1;
    const Tensor g = dy.reshape(k);
    // one-hot of the argmax along dim: arange(n) viewed along dim == index
    Shape along(in_shape.size(), 1);
    along[dim] = in_shape[dim];
    const Tensor hit = eq(arange(0, in_shape[dim], DType::i64, dy.device()).view(along), index);
    return {qkv::where(hit, g, zeros({}, dy.dtype(), dy.device()))};
  }
  void release() override { index = Tensor(); }
};

// d(softmax(a)) = y (dy - sum(dy y)) along dim
struct SoftmaxBackward : Node {
  Tensor y;
  int dim = 0;
  const char* name() const override { return "SoftmaxBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {softmax_backward(y, dy, dim)}; }
  void release() override { y = Tensor(); }
};

// d(log_softmax(a)) = dy - exp(y) sum(dy) along dim
struct LogSoftmaxBackward : Node {
  Tensor y;
  int dim = 0;
  const char* name() const override { return "LogSoftmaxBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {log_softmax_backward(y, dy, dim)}; }
  void release() override { y = Tensor(); }
};

Tensor sum_node(Tensor out, const Tensor& a, const std::vector<int>* dims, bool is_mean) {
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<SumBackward>();
  n->in_shape = a.shape();
  n->reduced.assign(a.dim(), dims == nullptr);
  if (dims)
    for (int d : *dims) n->reduced[normalize_dim(d, a.dim(), is_mean ? "mean" : "sum")] = true;
  n->is_mean = is_mean;
  if (is_mean) {
    int64_t count = 1;
    for (int d = 0; d < a.dim(); ++d)
      if (n->reduced[d]) count *= a.size(d);
    n->scale = 1.0 / static_cast<double>(count);
  }
  return record(out, n, {a});
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  return sum_node(qkv::sum(a, dims, keepdim), a, &dims, false);
}
Tensor sum(const Tensor& a) { return sum_node(qkv::sum(a), a, nullptr, false); }
Tensor mean(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  return sum_node(qkv::mean(a, dims, keepdim), a, &dims, true);
}
Tensor mean(const Tensor& a) { return sum_node(qkv::mean(a), a, nullptr, true); }

Tensor max(const Tensor& a, int dim, bool keepdim) {
  Tensor out = qkv::max(a, dim, keepdim);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<MaxBackward>();
  n->in_shape = a.shape();
  n->dim = normalize_dim(dim, a.dim(), "max");
  n->index = argmax(a, dim, true);
  return record(out, n, {a});
}

Tensor softmax(const Tensor& a, int dim) {
  Tensor out = qkv::softmax(a, dim);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<SoftmaxBackward>();
  n->y = out.detach();
  n->dim = dim;
  return record(out, n, {a});
}

Tensor log_softmax(const Tensor& a, int dim) {
  Tensor out = qkv::log_softmax(a, dim);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<LogSoftmaxBackward>();
  n->y = out.detach();
  n->dim = dim;
  return record(out, n, {a});
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_reduce_gradchecks(GradcheckRegistry& r) {
  using V = std::vector<Tensor>;
  using X = const std::vector<Tensor>&;
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  auto tr = [](const Tensor& t) { return ag::transpose(t, 0, 1); };

  r.add({"sum", "all of [3,4]", [=] { return V{in({3, 4}, 101)}; }, [](X x) { return ag::sum(x[0]); }});
  r.add({"sum", "[2,3,4] over dim 1", [=] { return V{in({2, 3, 4}, 102)}; }, [](X x) { return ag::sum(x[0], {1}); }});
  r.add({"sum", "[2,3,5] over dims (0,2) keepdim",
         [=] {
           return V{in({2, 3, 5}, 103)};
         },
         [](X x) {
           return ag::sum(x[0], {0, 2}, true);
         }});
  r.add({"sum", "transposed [5,3]^T over dim -1",
         [=] {
           return V{in({5, 3}, 104)};
         },
         [=](X x) { return ag::sum(tr(x[0]), {-1}); }});
  r.add({"sum", "size-1 dims [1,4,1] over dim 0",
         [=] {
           return V{in({1, 4, 1}, 105)};
         },
         [](X x) { return ag::sum(x[0], {0}); }});
  r.add({"mean", "all of [3,5]", [=] { return V{in({3, 5}, 106)}; }, [](X x) { return ag::mean(x[0]); }});
  r.add({"mean", "[4,3,2] over dims (0,1)",
         [=] {
           return V{in({4, 3, 2}, 107)};
         },
         [](X x) {
           return ag::mean(x[0], {0, 1});
         }});
  r.add({"mean", "transposed [3,4]^T over dim 0 keepdim",
         [=] {
           return V{in({3, 4}, 108)};
         },
         [=](X x) { return ag::mean(tr(x[0]), {0}, true); }});
  r.add({"max", "[3,5] over dim 1", [=] { return V{in({3, 5}, 109)}; }, [](X x) { return ag::max(x[0], 1); }});
  r.add({"max", "[4,3,2] over dim 0 keepdim",
         [=] {
           return V{in({4, 3, 2}, 110)};
         },
         [](X x) { return ag::max(x[0], 0, true); }});
  r.add({"max", "transposed [5,3]^T over dim -1",
         [=] {
           return V{in({5, 3}, 111)};
         },
         [=](X x) { return ag::max(tr(x[0]), -1); }});
  r.add({"softmax", "[3,5] over dim -1",
         [=] {
           return V{in({3, 5}, 112)};
         },
         [](X x) { return ag::softmax(x[0], -1); }});
  r.add({"softmax", "[2,4,3] over dim 1",
         [=] {
           return V{in({2, 4, 3}, 113)};
         },
         [](X x) { return ag::softmax(x[0], 1); }});
  r.add({"softmax", "transposed [4,3]^T over dim -1",
         [=] {
           return V{in({4, 3}, 114)};
         },
         [=](X x) { return ag::softmax(tr(x[0]), -1); }});
  r.add({"softmax", "size-1 row [3,1] over dim -1",
         [=] {
           return V{in({3, 1}, 115)};
         },
         [](X x) { return ag::softmax(x[0], -1); }});
  r.add({"softmax", "large logits [2,7] (std 10)",
         [=] {
           return V{randn({2, 7}, 116, 0, 0.0, 10.0, DType::f64)};
         },
         [](X x) { return ag::softmax(x[0], -1); }});
  r.add({"log_softmax", "[3,5] over dim -1",
         [=] {
           return V{in({3, 5}, 117)};
         },
         [](X x) { return ag::log_softmax(x[0], -1); }});
  r.add({"log_softmax", "[3,4,2] over dim 0",
         [=] {
           return V{in({3, 4, 2}, 118)};
         },
         [](X x) { return ag::log_softmax(x[0], 0); }});
  r.add({"log_softmax", "transposed [6,3]^T over dim 1",
         [=] {
           return V{in({6, 3}, 119)};
         },
         [=](X x) { return ag::log_softmax(tr(x[0]), 1); }});
}

}  // namespace qkv::autograd
