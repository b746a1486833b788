#include "python/src/convert.h"

#include <memory>

#include "tensor/error.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

// Keeps a Python object alive from C++ (a Storage's owner): released with the GIL held, from
// whichever thread drops the last reference.
std::shared_ptr<void> keep_alive(py::object obj) {
  return std::shared_ptr<void>(new py::object(std::move(obj)), [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
}

DType dtype_of_numpy(const py::dtype& dt, const char* what) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'b' && size == 1) return DType::boolean;
  fail("argument '", what, "': numpy dtype ", dt.attr("name").cast<std::string>(),
       " has no qkv counterpart (float32, float64, int32, int64, bool)");
  return DType::f32;
}

py::dtype numpy_dtype_of(DType t) {
  switch (t) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f64:
      return py::dtype::of<double>();
    case DType::i32:
      return py::dtype::of<int32_t>();
    case DType::i64:
      return py::dtype::of<int64_t>();
    case DType::bf16:
    case DType::f16:
      return py::dtype::of<uint16_t>();
    case DType::boolean:
      return py::dtype::of<bool>();
  }
  fail("unknown dtype");
  return py::dtype::of<float>();
}

}  // namespace

Tensor as_tensor(py::handle obj, const char* what) {
  if (py::isinstance<Tensor>(obj)) return obj.cast<Tensor>();
  QKV_CHECK(!obj.is_none(), "argument '", what, "' is None; a tensor or array is required");
  py::array arr = py::array::ensure(obj);
  QKV_CHECK(arr, "argument '", what, "' of type ", py::str(py::type::of(obj)).cast<std::string>(),
            " is not a tensor, an array or a sequence of numbers");
  const DType dtype = dtype_of_numpy(arr.dtype(), what);
  const auto item = static_cast<int64_t>(arr.itemsize());
  Shape shape(arr.ndim());
  Strides strides(arr.ndim());
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    shape[d] = arr.shape(d);
    QKV_CHECK(arr.strides(d) % item == 0, "argument '", what, "': stride ", arr.strides(d), " bytes of dim ", d,
              " is not a multiple of the ", item, "-byte items; pass a copy (numpy.ascontiguousarray)");
    QKV_CHECK(arr.strides(d) >= 0 || arr.shape(d) <= 1, "argument '", what, "': negative stride in dim ", d,
              " cannot be shared; pass a copy (numpy.ascontiguousarray)");
    strides[d] = arr.shape(d) <= 1 ? 0 : arr.strides(d) / item;
  }
  QKV_CHECK(arr.writeable(), "argument '", what,
            "' is a read-only array; qkv tensors share memory for writing, so pass a writable copy");
  int64_t span = 1;  // elements from the first to one past the last reached
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) span += (shape[d] - 1) * strides[d];
  if (arr.size() == 0) span = 0;
  return Tensor::from_external(arr.mutable_data(), static_cast<size_t>(span * item), shape, strides, dtype, Device::cpu,
                               keep_alive(arr));
}

std::optional<Tensor> as_optional_tensor(py::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return as_tensor(obj, what);
}

py::array to_numpy(const Tensor& t) {
  QKV_CHECK(t.defined(), "an undefined tensor has no array");
  QKV_CHECK(t.device() == Device::cpu, "a ", device_name(t.device()),
            " tensor cannot be shared with numpy; copy it to the CPU first (tensor.to('cpu'))");
  const auto item = static_cast<py::ssize_t>(t.element_size());
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(s * item);
  // The capsule owns a handle to the tensor: the array keeps its storage alive.
  py::capsule base(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(numpy_dtype_of(t.dtype()), shape, strides, t.raw_data(), base);
}

}  // namespace qkv::python
