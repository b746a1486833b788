#include "tensor/tensor.h"

#include <algorithm>
#include <numeric>

#include "tensor/cpu/copy.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/kernels.h"

namespace qkv {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) { data_ = device_alloc(device, bytes); }
Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {
  QKV_CHECK(owner_ != nullptr, "[from_external] borrowed memory needs an owner to keep it alive");
}
Storage::~Storage() {
  if (!owner_) device_free(device_, data_, bytes_);
}

Tensor Tensor::from_external(void* data, size_t bytes, const Shape& shape, const Strides& strides, DType dtype,
                             Device device, std::shared_ptr<void> owner) {
  QKV_CHECK(strides.size() == shape.size(), "[from_external] ", strides.size(), " strides for a shape of ",
            shape.size(), " dims");
  const int64_t n = checked_numel(shape);
  const size_t es = dtype_size(dtype);
  QKV_CHECK(reinterpret_cast<uintptr_t>(data) % es == 0, "[from_external] data at ", data, " is not aligned to its ",
            es, "-byte elements");
  int64_t last = 0;  // the furthest element the view reaches
  for (size_t d = 0; d < shape.size(); ++d) {
    QKV_CHECK(strides[d] >= 0, "[from_external] negative stride ", strides[d], " in dim ", d,
              " (qkv views have non-negative strides)");
    int64_t reach = 0;
    QKV_CHECK(!__builtin_mul_overflow(shape[d] - (shape[d] > 0), strides[d], &reach) &&
                  !__builtin_add_overflow(last, reach, &last),
              "[from_external] the view of shape ", shape_str(shape), " overflows int64 offsets");
  }
  QKV_CHECK(n == 0 || static_cast<uint64_t>(last + 1) * es <= bytes, "[from_external] a view of shape ",
            shape_str(shape), " reaches past the ", bytes, " bytes it was given");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, bytes, device, std::move(owner));
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const int64_t n = checked_numel(shape);
  const size_t es = dtype_size(dtype);
  QKV_CHECK(static_cast<uint64_t>(n) <= SIZE_MAX / es, "[empty] byte size of ", shape_str(shape), " overflows");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(n) * es, device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl_->storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.impl_->dtype;
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int d) const { return impl_->shape[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int d) const { return impl_->strides[normalize_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : impl_->shape) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (impl_->shape[d] == 1) continue;
    if (impl_->strides[d] != expected) return false;
    expected *= impl_->shape[d];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<int64_t>(element_size());
}

// Infers one -1 dimension and checks the element count.
static Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      QKV_CHECK(infer < 0, "[", op, "] only one dimension may be -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      QKV_CHECK(out[i] >= 0, "[", op, "] invalid shape ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    QKV_CHECK(known != 0 && numel % known == 0, "[", op, "] cannot view ", shape_str(from), " as ", shape_str(shape));
    out[infer] = numel / known;
    known *= out[infer];
  }
  QKV_CHECK(known == numel, "[", op, "] cannot view ", shape_str(from), " (", numel, " elements) as ",
            shape_str(shape));
  return out;
}

// Strides for viewing a tensor with a new shape without copying, when its strides allow it.
// Walk the old dims from the innermost out, grouping dims that are contiguous with each other
// ("chunks"); each chunk must map onto a run of new dims with the same element count, which then
// get strides counted up from the chunk's innermost stride.
static bool view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape, Strides& out) {
  out.assign(new_shape.size(), 1);
  const int64_t numel = std::accumulate(old_shape.begin(), old_shape.end(), int64_t{1}, std::multiplies<>());
  if (numel == 0 || old_shape.empty()) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int view_d = static_cast<int>(new_shape.size()) - 1;
  int64_t chunk_stride = old_strides.back();
  int64_t old_numel = 1, new_numel = 1;
  for (int d = static_cast<int>(old_shape.size()) - 1; d >= 0; --d) {
    old_numel *= old_shape[d];
    const bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != old_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (new_numel < old_numel || new_shape[view_d] == 1)) {
      out[view_d] = new_numel * chunk_stride;
      new_numel *= new_shape[view_d];
      --view_d;
    }
    if (new_numel != old_numel) return false;
    if (d > 0) {
      chunk_stride = old_strides[d - 1];
      old_numel = 1;
      new_numel = 1;
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "view", impl_->shape);
  Strides st;
  QKV_CHECK(view_strides(impl_->shape, impl_->strides, s, st), "[view] ", shape_str(impl_->shape), " with strides ",
            shape_str(impl_->strides), " cannot be viewed as ", shape_str(s), " without a copy");
  return make_view(*this, s, st, impl_->offset);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = infer_shape(shape, numel(), "reshape", impl_->shape);
  Strides st;
  if (view_strides(impl_->shape, impl_->strides, s, st)) return make_view(*this, s, st, impl_->offset);
  return contiguous().view(s);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  QKV_CHECK(static_cast<int>(dims.size()) == dim(), "[permute] ", dims.size(), " dims given for ", shape_str(shape()));
  Shape s(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int d = normalize_dim(dims[i], dim(), "permute");
    QKV_CHECK(!seen[d], "[permute] dim ", d, " repeated");
    seen[d] = true;
    s[i] = impl_->shape[d];
    st[i] = impl_->strides[d];
  }
  return make_view(*this, s, st, impl_->offset);
}

Tensor Tensor::transpose(int d0, int d1) const {
  std::vector<int> p(dim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[normalize_dim(d0, dim(), "transpose")], p[normalize_dim(d1, dim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  d = normalize_dim(d, dim(), "narrow");
  QKV_CHECK(start >= 0 && length >= 0 && start + length <= impl_->shape[d], "[narrow] range [", start, ", ",
            start + length, ") out of bounds for dim ", d, " of ", shape_str(shape()));
  Shape s = impl_->shape;
  s[d] = length;
  return make_view(*this, s, impl_->strides, impl_->offset + start * impl_->strides[d]);
}

Tensor Tensor::select(int d, int64_t index) const {
  d = normalize_dim(d, dim(), "select");
  if (index < 0) index += impl_->shape[d];
  QKV_CHECK(index >= 0 && index < impl_->shape[d], "[select] index ", index, " out of range for dim ", d, " of ",
            shape_str(shape()));
  Shape s = impl_->shape;
  Strides st = impl_->strides;
  const int64_t off = impl_->offset + index * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, s, st, off);
}

Tensor Tensor::expand(const Shape& shape) const {
  QKV_CHECK(shape.size() >= impl_->shape.size(), "[expand] cannot expand ", shape_str(impl_->shape), " to ",
            shape_str(shape));
  const size_t lead = shape.size() - impl_->shape.size();
  Strides st(shape.size(), 0);
  Shape s = shape;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      QKV_CHECK(shape[i] >= 0, "[expand] invalid size in ", shape_str(shape));
      continue;
    }
    const int64_t cur = impl_->shape[i - lead];
    if (shape[i] == -1 || shape[i] == cur) {
      s[i] = cur;
      st[i] = impl_->strides[i - lead];
    } else {
      QKV_CHECK(cur == 1, "[expand] cannot expand ", shape_str(impl_->shape), " to ", shape_str(shape));
      st[i] = 0;
    }
  }
  return make_view(*this, s, st, impl_->offset);
}

Tensor Tensor::unsqueeze(int d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape s = impl_->shape;
  Strides st = impl_->strides;
  const int64_t stride = d < dim() ? impl_->strides[d] * impl_->shape[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view(*this, s, st, impl_->offset);
}

Tensor Tensor::squeeze(int d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (impl_->shape[d] != 1) return make_view(*this, impl_->shape, impl_->strides, impl_->offset);
  Shape s = impl_->shape;
  Strides st = impl_->strides;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, s, st, impl_->offset);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  if (device() == Device::cuda) cuda::copy_cast(*this, out);
  else cpu::copy_cast(*this, out);
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty(shape(), t, device());
  if (device() == Device::cuda) cuda::copy_cast(*this, out);
  else cpu::copy_cast(*this, out);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), d);
  const size_t bytes = static_cast<size_t>(numel()) * element_size();
  if (bytes) cuda::memcpy(out.raw_data(), src.raw_data(), bytes, d == Device::cuda ? 0 : 1);
  return out;
}

std::vector<double> Tensor::to_vector() const {
  Tensor c = device() == Device::cpu ? *this : to(Device::cpu);
  Tensor d = c.to(DType::f64).contiguous();
  const double* p = d.data<double>();
  return std::vector<double>(p, p + d.numel());
}

double Tensor::item() const {
  QKV_CHECK(numel() == 1, "[item] tensor of shape ", shape_str(shape()), " has ", numel(), " elements, not 1");
  return to_vector()[0];
}

double Tensor::at(const std::vector<int64_t>& idx) const {
  QKV_CHECK(static_cast<int>(idx.size()) == dim(), "[at] ", idx.size(), " indices for ", shape_str(shape()));
  Tensor t = *this;
  for (int d = static_cast<int>(idx.size()) - 1; d >= 0; --d) t = t.select(d, idx[d]);
  return t.item();
}

// ---- autograd slot ----
AutogradMeta& Tensor::autograd_meta() const {
  if (!impl_->autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  return *impl_->autograd;
}
bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }
Tensor& Tensor::set_requires_grad(bool on) {
  QKV_CHECK(!on || is_floating(dtype()), "[requires_grad] only floating tensors can require grad, not ",
            dtype_name(dtype()));
  QKV_CHECK(!grad_fn(), "[requires_grad] can only be set on leaf tensors");
  autograd_meta().requires_grad = on;
  return *this;
}
Tensor Tensor::grad() const { return impl_->autograd ? impl_->autograd->grad : Tensor(); }
void Tensor::set_grad(const Tensor& g) { autograd_meta().grad = g; }
void Tensor::set_data(const Tensor& src) {
  QKV_CHECK(src.defined(), "[set_data] source is undefined");
  impl_->storage = src.impl_->storage;
  impl_->shape = src.impl_->shape;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->dtype = src.impl_->dtype;
}
const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  return impl_->autograd ? impl_->autograd->grad_fn : none;
}
bool Tensor::is_leaf() const { return !grad_fn(); }

}  // namespace qkv
