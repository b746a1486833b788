// The backward engine: topological order from the root, a reverse sweep under no-grad, gradients
// summed per node and += into leaf .grad.
#pragma once
#include <unordered_map>

#include "tensor/tensor.h"

namespace qkv::autograd {

// root must be a scalar unless `grad` (same shape as root) is given. A gradient moved in (nothing
// else referring to it) may be updated in place and handed on without copies.
void backward(const Tensor& root, Tensor grad = Tensor());
// Sets .grad of each tensor to undefined (the next backward writes fresh gradients).
void zero_grad(const std::vector<Tensor>& params);

// While a GradSinkScope is alive on a thread, the backward passes run on that thread write leaf
// gradients into its GradSink instead of the leaves' .grad (summed the same way, in the same order;
// no post-accumulate hook runs). Several threads can then run backward at once over graphs that
// share leaves, each into its own sink: the rows of invariant training (train/row_step.h). The
// leaves' accumulators must exist before that (prepare_leaves, on one thread), since building a
// graph otherwise creates them on first use.
class GradSink {
 public:
  // The gradient collected for `leaf`; undefined when no backward reached it.
  Tensor grad(const Tensor& leaf) const;
  // The slot of the leaf implementation `leaf` (created undefined).
  Tensor& slot(const TensorImpl* leaf) { return grads_[leaf]; }
  // The gradient collected for `leaf`, removed from the sink (a leaf made for one replay, whose
  // address a later tensor may reuse).
  Tensor take(const Tensor& leaf);

 private:
  std::unordered_map<const TensorImpl*, Tensor> grads_;
};
class GradSinkScope {
 public:
  explicit GradSinkScope(GradSink& sink);
  ~GradSinkScope();
  GradSinkScope(const GradSinkScope&) = delete;
  GradSinkScope& operator=(const GradSinkScope&) = delete;
  // The calling thread's innermost sink, or null.
  static GradSink* current();

 private:
  GradSink* previous_;
};
// The gradient backward() left for `leaf` on the calling thread: taken out of the thread's sink
// while one is in scope, else leaf.grad(). For a leaf made inside a node's backward (the block
// replay of recomputation), which must read its gradient wherever the engine put it.
Tensor take_leaf_grad(const Tensor& leaf);
// Makes each leaf's gradient accumulator now (what the first graph using the leaf would do).
void prepare_leaves(const std::vector<Tensor>& leaves);

}  // namespace qkv::autograd
