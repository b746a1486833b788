// A node of the recorded graph: one differentiable primitive's backward rule (its vjp) plus the
// tensors it saved. Rules live in autograd/rules/<group>.cpp, each a Node subclass named
// <Op>Backward with its formula in a comment; release() drops what it saved once it has run.
#pragma once
#include <initializer_list>
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::autograd {

// While a node's backward runs, the engine may already hold gradients for some of its inputs (sums
// from nodes that ran earlier). A node whose vjp is a scatter into a larger zero tensor (narrow,
// embedding) can add its part straight into such a buffer instead of allocating and zero-filling
// its own full-size gradient for the engine to add afterwards.
class PendingGrads {
 public:
  virtual ~PendingGrads() = default;
  // The gradient pending for input i, if the engine holds the only reference to it (no view of it
  // exists anywhere) and it is a contiguous `dtype` tensor of `shape`; else nullptr. The caller may
  // add into it in place and then return an undefined gradient for input i.
  virtual const Tensor* exclusive(size_t i, const Shape& shape, DType dtype) = 0;
};

// True when nothing but `t` refers to its data: one handle on its impl and no other view of its
// storage. The engine then may update it in place or hand it over without a copy.
bool exclusively_owned(const Tensor& t);

class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // Gradients w.r.t. each recorded input, in order; an undefined Tensor where none is needed
  // (check needs_grad(i) to skip work).
  virtual std::vector<Tensor> backward(const Tensor& grad_out) = 0;
  // What the engine calls: backward(grad_out) unless the node accumulates into pending gradients.
  virtual std::vector<Tensor> backward_accumulate(const Tensor& grad_out, PendingGrads& pending) {
    return backward(grad_out);
  }
  virtual void release() {}

  bool needs_grad(size_t i) const { return i < next_.size() && next_[i] != nullptr; }
  const std::vector<std::shared_ptr<Node>>& next() const { return next_; }
  void set_next(std::vector<std::shared_ptr<Node>> next) { next_ = std::move(next); }

 private:
  std::vector<std::shared_ptr<Node>> next_;  // per input: its producer, a leaf's accumulator, or null
};

// Writes the incoming gradient into a leaf's .grad with += (so micro-batches accumulate). The
// first gradient is taken over without a copy when nothing else refers to it.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::weak_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> backward(const Tensor& grad_out) override;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

// True when grad mode is on and some input requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
// Connects `out` to `node` (whose inputs are `inputs`, in the order backward returns grads) when
// any input requires grad and grad mode is on; returns `out` either way.
Tensor record(Tensor out, const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs);
Tensor record(Tensor out, const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs);

}  // namespace qkv::autograd
