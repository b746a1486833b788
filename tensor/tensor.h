// Tensor: a handle to a view (shape, strides, offset, dtype) over a shared Storage.
// Copying a Tensor copies the handle (like PyTorch); views share storage but are separate handles.
// The autograd slot (grad, producing node) is opaque here: tensor/ never includes autograd/.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/shape.h"

namespace qkv {

namespace autograd {
class Node;
}
class Tensor;

// One device buffer: either allocated here (freed back to the device's caching allocator) or
// borrowed from another owner (a numpy array, a DLPack capsule), which the storage keeps alive
// and never frees itself.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool borrowed() const { return owner_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::cpu;
  std::shared_ptr<void> owner_;  // set for borrowed memory; released after the storage is gone
};

struct AutogradMeta;  // defined below: grad, producing node, requires_grad

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;     // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised contiguous tensor (factories with values live in tensor/ops.h).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  // A tensor over memory owned elsewhere (no copy): `owner` lives as long as any view of it.
  // The geometry must stay inside [data, data + bytes) (checked) with non-negative strides.
  static Tensor from_external(void* data, size_t bytes, const Shape& shape, const Strides& strides, DType dtype,
                              Device device, std::shared_ptr<void> owner);
  // A view over `base`'s storage with the given geometry (no copy, no checks beyond bounds).
  static Tensor make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset);
  // The same storage and geometry without the autograd slot (no grad_fn, no requires_grad): what
  // a backward node saves, so that it never holds its own output's slot (a cycle through grad_fn).
  Tensor detach() const { return make_view(*this, shape(), strides(), offset()); }

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int dim() const { return static_cast<int>(impl_->shape.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t stride(int d) const;
  int64_t numel() const;
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  size_t element_size() const { return dtype_size(impl_->dtype); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // Pointer to the first element of the view (offset applied). T must match dtype
  // (uint16_t for bf16/f16, bool for boolean).
  template <class T>
  T* data() const;
  void* raw_data() const;

  // Views without copies. reshape copies only when the strides cannot express the new shape.
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int>& dims) const;
  Tensor transpose(int d0, int d1) const;
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor select(int dim, int64_t index) const;  // drops dim
  Tensor expand(const Shape& shape) const;      // broadcast: size-1 dims get stride 0
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;
  Tensor flatten() const { return reshape({numel()}); }

  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;

  // Reads one element as double (any dtype); for tests and small host-side logic.
  double item() const;  // numel() must be 1
  double at(const std::vector<int64_t>& idx) const;
  std::vector<double> to_vector() const;  // all elements in row-major order as double

  // Autograd slot (the machinery lives in autograd/).
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);  // only on leaves
  Tensor grad() const;                 // undefined until a backward reached it
  void set_grad(const Tensor& g);
  // Points this tensor (and every handle sharing it) at src's data, shape and strides, keeping its
  // autograd slot: how a module's parameters move between devices in place.
  void set_data(const Tensor& src);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  AutogradMeta& autograd_meta() const;  // creates the slot on first use
  bool is_leaf() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;           // null for leaves
  std::shared_ptr<autograd::Node> grad_accumulator;  // leaves: the node that writes .grad (shared by all uses)
  // Leaves: called after a backward has written this leaf's gradient for that pass (its .grad is
  // final for the pass), e.g. to start reducing it across ranks while backward goes on.
  std::function<void()> post_accumulate_hook;
};

template <class T>
T* Tensor::data() const {
  return static_cast<T*>(impl_->storage->data()) + impl_->offset;
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

}  // namespace qkv
