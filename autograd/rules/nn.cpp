// Fused neural-net ops: embedding, layer/RMS norm, cross-entropy, dropout. Each backward is the
// matching fused kernel (tensor/ops.h), which recomputes what it needs from a few saved tensors.
#include "autograd/functions.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

// dweight = scatter-add of dy rows at ids (ids get no gradient)
// A tied LM head's dW reaches the same weight first; when the engine holds it alone, the rows are
// scattered straight into it rather than into a zero-filled [V, C] copy added afterwards (for
// GPT-2's 50257 x 768 table that is 154 MB written and read twice per step saved).
struct EmbeddingBackward : Node {
  Tensor ids;
  int64_t num_embeddings = 0;
  const char* name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {embedding_backward(ids, dy, num_embeddings)}; }
  std::vector<Tensor> backward_accumulate(const Tensor& dy, autograd::PendingGrads& pending) override {
    const int64_t c = dy.dim() > 0 ? dy.size(-1) : 0;
    const Tensor* g = dy.device() == Device::cpu && dy.dim() == ids.dim() + 1
                          ? pending.exclusive(0, {num_embeddings, c}, dy.dtype())
                          : nullptr;
    if (!g) return backward(dy);
    embedding_backward_into(ids, dy, *g);
    return {Tensor()};
  }
  void release() override { ids = Tensor(); }
};

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w;  dw = Σ dy·x̂;  db = Σ dy
// In a pre-norm block x is the residual stream, whose gradient from the residual add is already
// pending when this runs: dx is then added into it by the kernel itself (no dx buffer, no add).
struct LayerNormBackward : Node {
  Tensor x, weight, mean, rstd;
  const char* name() const override { return "LayerNormBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    NormGrads g = layer_norm_backward(dy, x, weight, mean, rstd);
    return {needs_grad(0) ? g.dx : Tensor(), needs_grad(1) ? g.dweight : Tensor(), needs_grad(2) ? g.dbias : Tensor()};
  }
  std::vector<Tensor> backward_accumulate(const Tensor& dy, autograd::PendingGrads& pending) override {
    const Tensor* into =
        needs_grad(0) && x.device() == Device::cpu && dy.shape() == x.shape() && dy.dtype() == x.dtype()
            ? pending.exclusive(0, x.shape(), x.dtype())
            : nullptr;
    if (!into) return backward(dy);
    Tensor dweight, dbias;
    if (weight.defined() && needs_grad(1)) dweight = Tensor::empty(weight.shape(), x.dtype());
    if (needs_grad(2)) dbias = Tensor::empty({x.size(-1)}, x.dtype());
    layer_norm_backward_into(dy, x, weight, mean, rstd, *into, dweight, dbias, /*accumulate_dx=*/true);
    return {Tensor(), dweight, dbias};
  }
  void release() override { x = weight = mean = rstd = Tensor(); }
};

// dx = rstd·(g − x̂·mean(g·x̂)), g = dy·w;  dw = Σ dy·x̂
struct RmsNormBackward : Node {
  Tensor x, weight, rstd;
  const char* name() const override { return "RmsNormBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    NormGrads g = rms_norm_backward(dy, x, weight, rstd);
    return {needs_grad(0) ? g.dx : Tensor(), needs_grad(1) ? g.dweight : Tensor()};
  }
  void release() override { x = weight = rstd = Tensor(); }
};

// dlogits = (softmax(logits) − onehot(target))·dloss/count, zero rows where target is ignored
// When this node holds the only reference to the logits (the usual training step: nothing else
// keeps the LM head's output), dlogits is written over them: the [N, V] logits are not held twice
// (for GPT-2's vocabulary, 51 MB at 256 tokens).
struct CrossEntropyBackward : Node {
  Tensor logits, targets, lse;
  int64_t count = 0, ignore_index = -100;
  const char* name() const override { return "CrossEntropyBackward"; }
  std::vector<Tensor> backward(const Tensor& dloss) override {
    if (logits.device() == Device::cpu && logits.is_contiguous() && lse.is_contiguous() &&
        autograd::exclusively_owned(logits)) {
      cross_entropy_backward_(logits, targets, lse, dloss.item(), count, ignore_index);
      return {logits};
    }
    return {cross_entropy_backward(logits, targets, lse, dloss.item(), count, ignore_index)};
  }
  void release() override { logits = targets = lse = Tensor(); }
};

// dx = dy·mask/(1−p), the mask redrawn from (seed, offset + index)
struct DropoutBackward : Node {
  double p = 0;
  uint64_t seed = 0, offset = 0;
  const char* name() const override { return "DropoutBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::dropout(dy, p, seed, offset)}; }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor out = qkv::embedding(weight, ids);
  if (!autograd::any_requires_grad({&weight})) return out;
  auto n = std::make_shared<EmbeddingBackward>();
  n->ids = ids;
  n->num_embeddings = weight.size(0);
  return record(out, n, {weight});
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  NormResult r = qkv::layer_norm(x, weight, bias, eps);
  if (!autograd::any_requires_grad({&x, &weight, &bias})) return r.y;
  auto n = std::make_shared<LayerNormBackward>();
  n->x = x;
  n->weight = weight;
  n->mean = r.mean;
  n->rstd = r.rstd;
  return record(r.y, n, {x, weight, bias});
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  NormResult r = qkv::rms_norm(x, weight, eps);
  if (!autograd::any_requires_grad({&x, &weight})) return r.y;
  auto n = std::make_shared<RmsNormBackward>();
  n->x = x;
  n->weight = weight;
  n->rstd = r.rstd;
  return record(r.y, n, {x, weight});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  CrossEntropyResult r = qkv::cross_entropy(logits, targets, ignore_index);
  if (!autograd::any_requires_grad({&logits})) return r.loss;
  auto n = std::make_shared<CrossEntropyBackward>();
  // Without its autograd slot, so that when nothing else holds the logits backward may reuse them.
  n->logits = logits.detach();
  n->targets = targets;
  n->lse = r.lse;
  n->count = r.count;
  n->ignore_index = ignore_index;
  return record(r.loss, n, {logits});
}

Tensor dropout(const Tensor& a, double p, uint64_t seed, uint64_t offset) {
  Tensor out = qkv::dropout(a, p, seed, offset);  // checks p; p == 0 returns a itself
  if (p == 0.0 || !autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<DropoutBackward>();
  n->p = p;
  n->seed = seed;
  n->offset = offset;
  return record(out, n, {a});
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_nn_gradchecks(GradcheckRegistry& r) {
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  using V = std::vector<Tensor>;
  r.add({"embedding",
         "weight [6,3], ids [2,4] with repeats",
         [=] {
           return V{in({6, 3}, 101), from_vector_i64({0, 5, 2, 2, 5, 1, 0, 2}, {2, 4})};
         },
         [](const V& x) { return ag::embedding(x[0], x[1]); },
         {true, false}});
  r.add({"embedding",
         "int32 ids [5] into weight [4,7]",
         [=] {
           return V{in({4, 7}, 102), from_vector_i64({3, 3, 0, 1, 3}, {5}, DType::i32)};
         },
         [](const V& x) { return ag::embedding(x[0], x[1]); },
         {true, false}});
  r.add({"layer_norm", "x [2,3,5], weight, bias",
         [=] {
           return V{in({2, 3, 5}, 103), in({5}, 104), in({5}, 105)};
         },
         [](const V& x) { return ag::layer_norm(x[0], x[1], x[2], 1e-5); }});
  r.add({"layer_norm", "transposed x [6,4]^T, weight, bias",
         [=] {
           return V{in({6, 4}, 106), in({6}, 107), in({6}, 108)};
         },
         [](const V& x) { return ag::layer_norm(ag::transpose(x[0], 0, 1), x[1], x[2], 1e-5); }});
  r.add({"layer_norm", "x [4,7] without weight or bias",
         [=] {
           return V{in({4, 7}, 109)};
         },
         [](const V& x) { return ag::layer_norm(x[0], Tensor(), Tensor(), 1e-5); }});
  r.add({"rms_norm", "x [2,3,5], weight",
         [=] {
           return V{in({2, 3, 5}, 110), in({5}, 111)};
         },
         [](const V& x) { return ag::rms_norm(x[0], x[1], 1e-6); }});
  r.add({"rms_norm", "transposed x [5,3]^T, weight",
         [=] {
           return V{in({5, 3}, 112), in({5}, 113)};
         },
         [](const V& x) { return ag::rms_norm(ag::transpose(x[0], 0, 1), x[1], 1e-6); }});
  r.add({"cross_entropy",
         "logits [6,7], two targets ignored",
         [=] {
           return V{in({6, 7}, 114), from_vector_i64({3, -100, 0, 6, -100, 2}, {6})};
         },
         [](const V& x) { return ag::cross_entropy(x[0], x[1], -100); },
         {true, false}});
  r.add({"cross_entropy",
         "logits [5,4]^T, int32 targets, ignore 1",
         [=] {
           return V{in({5, 4}, 115), from_vector_i64({1, 4, 0, 2}, {4}, DType::i32)};
         },
         [](const V& x) { return ag::cross_entropy(ag::transpose(x[0], 0, 1), x[1], 1); },
         {true, false}});
  r.add({"dropout", "p=0.3 seed 42 on [4,6]",
         [=] {
           return V{in({4, 6}, 116)};
         },
         [](const V& x) { return ag::dropout(x[0], 0.3, 42, 0); }});
  r.add({"dropout", "p=0.3 seed 7 offset 100 on [5,3]^T",
         [=] {
           return V{in({5, 3}, 117)};
         },
         [](const V& x) { return ag::dropout(ag::transpose(x[0], 0, 1), 0.3, 7, 100); }});
}

}  // namespace qkv::autograd
