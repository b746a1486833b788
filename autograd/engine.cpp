#include "autograd/engine.h"

#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"
#include "tensor/ops.h"

namespace qkv::autograd {

namespace {
thread_local bool g_grad_enabled = true;
thread_local bool g_autocast_bf16 = false;
}  // namespace
bool grad_enabled() { return g_grad_enabled; }
void set_grad_enabled(bool on) { g_grad_enabled = on; }
bool autocast_bf16() { return g_autocast_bf16; }
void set_autocast_bf16(bool on) { g_autocast_bf16 = on; }

bool exclusively_owned(const Tensor& t) {
  return t.defined() && t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && !t.impl()->autograd;
}

std::vector<Tensor> AccumulateGrad::backward(const Tensor& grad_out) {
  auto impl = leaf_.lock();
  if (!impl) return {};
  Tensor leaf(impl);
  QKV_CHECK(grad_out.shape() == leaf.shape(), "[backward] gradient ", shape_str(grad_out.shape()),
            " does not match leaf ", shape_str(leaf.shape()));
  // The first gradient is taken over when the engine's handle is the only one (it drops it after
  // this call); otherwise owned as a copy: the incoming tensor may be a view or shared.
  const auto first = [&] {
    if (grad_out.dtype() == leaf.dtype() && grad_out.is_contiguous() && grad_out.device() == leaf.device() &&
        exclusively_owned(grad_out))
      return grad_out;
    return grad_out.dtype() == leaf.dtype() ? grad_out.clone() : grad_out.to(leaf.dtype());
  };
  if (GradSink* sink = GradSinkScope::current()) {
    Tensor& g = sink->slot(impl.get());
    if (g.defined()) add_(g, grad_out);
    else g = first();
    return {};
  }
  Tensor g = leaf.grad();
  if (g.defined()) add_(g, grad_out);
  else leaf.set_grad(first());
  if (impl->autograd && impl->autograd->post_accumulate_hook) impl->autograd->post_accumulate_hook();
  return {};
}

namespace {
thread_local GradSink* t_sink = nullptr;
}  // namespace

GradSinkScope::GradSinkScope(GradSink& sink) : previous_(t_sink) { t_sink = &sink; }
GradSinkScope::~GradSinkScope() { t_sink = previous_; }
GradSink* GradSinkScope::current() { return t_sink; }
Tensor GradSink::take(const Tensor& leaf) {
  auto it = grads_.find(leaf.impl());
  if (it == grads_.end()) return Tensor();
  Tensor g = std::move(it->second);
  grads_.erase(it);
  return g;
}
Tensor take_leaf_grad(const Tensor& leaf) {
  if (GradSink* sink = GradSinkScope::current()) return sink->take(leaf);
  return leaf.grad();
}
Tensor GradSink::grad(const Tensor& leaf) const {
  auto it = grads_.find(leaf.impl());
  return it == grads_.end() ? Tensor() : it->second;
}

namespace {

// The engine's pending gradients, seen from the node whose backward is running.
class EnginePending : public PendingGrads {
 public:
  EnginePending(std::unordered_map<Node*, Tensor>& grads, Node* node) : grads_(grads), node_(node) {}
  const Tensor* exclusive(size_t i, const Shape& shape, DType dtype) override {
    if (i >= node_->next().size() || !node_->next()[i]) return nullptr;
    auto it = grads_.find(node_->next()[i].get());
    if (it == grads_.end()) return nullptr;
    const Tensor& t = it->second;
    if (t.shape() != shape || t.dtype() != dtype || !t.is_contiguous() || !exclusively_owned(t)) return nullptr;
    return &t;
  }

 private:
  std::unordered_map<Node*, Tensor>& grads_;
  Node* node_;
};

// slot += in, in place when one of the two buffers belongs to the engine alone (a + b == b + a
// bitwise, so which one is updated does not change the result).
void accumulate(Tensor& slot, Tensor&& in) {
  if (slot.shape() == in.shape() && slot.dtype() == in.dtype() && slot.device() == in.device()) {
    if (slot.is_contiguous() && exclusively_owned(slot)) {
      add_(slot, in);
      return;
    }
    if (in.is_contiguous() && exclusively_owned(in)) {
      add_(in, slot);
      slot = std::move(in);
      return;
    }
  }
  slot = add(slot, in);
}

}  // namespace

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && (t->requires_grad() || t->grad_fn())) return true;
  return false;
}

static std::shared_ptr<Node> edge_for(const Tensor& t) {
  if (!t.defined()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  if (!t.requires_grad()) return nullptr;
  AutogradMeta& m = t.autograd_meta();
  // The impl owns its meta; the accumulator points back weakly to avoid a cycle. One accumulator
  // per leaf, so every use of the leaf sums into the same engine slot.
  if (!m.grad_accumulator) m.grad_accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
  return m.grad_accumulator;
}

template <class Range>
static Tensor record_impl(Tensor out, const std::shared_ptr<Node>& node, const Range& inputs) {
  if (!grad_enabled()) return out;
  bool any = false;
  std::vector<std::shared_ptr<Node>> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    auto e = edge_for(t);
    any = any || e != nullptr;
    next.push_back(std::move(e));
  }
  if (!any) return out;
  node->set_next(std::move(next));
  out.autograd_meta().grad_fn = node;
  return out;
}

void prepare_leaves(const std::vector<Tensor>& leaves) {
  for (const Tensor& t : leaves) edge_for(t);
}

Tensor record(Tensor out, const std::shared_ptr<Node>& node, std::initializer_list<Tensor> inputs) {
  return record_impl(std::move(out), node, inputs);
}
Tensor record(Tensor out, const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs) {
  return record_impl(std::move(out), node, inputs);
}

void backward(const Tensor& root, Tensor grad) {
  QKV_CHECK(root.defined(), "[backward] undefined tensor");
  QKV_CHECK(root.requires_grad() || root.grad_fn(), "[backward] tensor does not require grad");
  Tensor seed = std::move(grad);
  if (!seed.defined()) {
    QKV_CHECK(root.numel() == 1, "[backward] root of shape ", shape_str(root.shape()),
              " is not a scalar: pass its gradient");
    seed = ones(root.shape(), root.dtype(), root.device());
  }
  QKV_CHECK(seed.shape() == root.shape(), "[backward] gradient ", shape_str(seed.shape()), " does not match root ",
            shape_str(root.shape()));
  if (seed.device() != root.device()) seed = seed.to(root.device());  // e.g. a host gradient for a device root
  std::shared_ptr<Node> start = root.grad_fn();
  if (!start) start = edge_for(root);

  // Iterative DFS post-order; reversed, it lists every node before the nodes it feeds into.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<Node*, size_t>> stack{{start.get(), 0}};
  visited.insert(start.get());
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (i < n->next().size()) {
      Node* child = n->next()[i++].get();
      if (child && visited.insert(child).second) stack.push_back({child, 0});
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }

  NoGradGuard no_grad;
  std::unordered_map<Node*, Tensor> grads;
  grads[start.get()] = std::move(seed);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    auto found = grads.find(n);
    if (found == grads.end()) continue;
    Tensor g = std::move(found->second);
    grads.erase(found);
    std::vector<Tensor> in_grads;
    EnginePending pending(grads, n);
    if (profiling_enabled()) {
      const auto t0 = profile_now();
      in_grads = n->backward_accumulate(g, pending);
      profile_add(std::string("backward ") + n->name(),
                  std::chrono::duration<double, std::milli>(profile_now() - t0).count());
    } else {
      in_grads = n->backward_accumulate(g, pending);
    }
    n->release();
    g = Tensor();  // so that a gradient a node passed through unchanged counts as exclusively owned below
    for (size_t i = 0; i < in_grads.size() && i < n->next().size(); ++i) {
      Node* child = n->next()[i].get();
      if (!child || !in_grads[i].defined()) continue;
      auto slot = grads.find(child);
      if (slot == grads.end()) {
        grads.emplace(child, std::move(in_grads[i]));
      } else {
        accumulate(slot->second, std::move(in_grads[i]));
      }
    }
  }
}

void zero_grad(const std::vector<Tensor>& params) {
  for (const Tensor& p : params)
    if (p.defined() && p.impl()->autograd) p.impl()->autograd->grad = Tensor();
}

}  // namespace qkv::autograd
