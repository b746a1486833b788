// qkv.Tensor: the C++ handle (tensor/tensor.h) with PyTorch's spelling of its properties. Memory
// crosses to numpy (buffer protocol, numpy()) and to DLPack consumers (__dlpack__) without copies;
// qkv.tensor / qkv.from_dlpack take it back the same way (convert.cpp holds the rules).
#include <pybind11/stl.h>

#include <sstream>

#include "autograd/engine.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

std::string buffer_format(DType t) {
  switch (t) {
    case DType::f32:
      return py::format_descriptor<float>::format();
    case DType::f64:
      return py::format_descriptor<double>::format();
    case DType::i32:
      return py::format_descriptor<int32_t>::format();
    case DType::i64:
      return py::format_descriptor<int64_t>::format();
    case DType::bf16:
    case DType::f16:
      return py::format_descriptor<uint16_t>::format();
    case DType::boolean:
      return py::format_descriptor<bool>::format();
  }
  return "B";
}

py::tuple as_tuple(const std::vector<int64_t>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}

std::string repr(const Tensor& t) {
  std::ostringstream s;
  s << "qkv.Tensor(shape=(";
  for (int d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << (t.dim() == 1 ? ",)" : ")") << ", dtype=" << dtype_name(t.dtype()) << ", device=" << device_name(t.device());
  if (t.requires_grad()) s << ", requires_grad=True";
  s << ")";
  return s.str();
}

// "cpu" / "cuda" move the tensor; anything else names a dtype.
Tensor convert_to(const Tensor& t, py::handle target) {
  if (py::isinstance<py::str>(target)) {
    const auto name = target.cast<std::string>();
    if (name == "cpu") return t.to(Device::cpu);
    if (name == "cuda") return t.to(Device::cuda);
  }
  return t.to(parse_dtype(target, "dtype"));
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol(),
                     "A view over qkv memory: shape, strides (in elements), dtype, device. Shares memory with "
                     "numpy (np.asarray(t), t.numpy()) and DLPack consumers (torch.from_dlpack(t)).")
      .def_buffer([](const Tensor& t) {
        QKV_CHECK(t.device() == Device::cpu, "a ", device_name(t.device()),
                  " tensor has no buffer; copy it to the CPU first (t.to('cpu'))");
        const auto item = static_cast<py::ssize_t>(t.element_size());
        std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
        for (int64_t s : t.strides()) strides.push_back(s * item);
        return py::buffer_info(t.raw_data(), item, buffer_format(t.dtype()), t.dim(), shape, strides);
      })
      .def_property_readonly(
          "shape", [](const Tensor& t) { return as_tuple(t.shape()); }, "The size of each dim, a tuple.")
      .def_property_readonly(
          "strides", [](const Tensor& t) { return as_tuple(t.strides()); },
          "Strides in elements (not bytes, unlike numpy).")
      .def_property_readonly(
          "dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); },
          "The element type's name: 'float32', 'float64', 'int32', 'int64', 'bfloat16', 'float16' or 'bool'.")
      .def_property_readonly(
          "device", [](const Tensor& t) { return std::string(device_name(t.device())); },
          "Where the memory is: 'cpu' or 'cuda'.")
      .def_property_readonly("ndim", &Tensor::dim, "The number of dims.")
      .def("numel", &Tensor::numel, "The number of elements.")
      .def("dim", &Tensor::dim, "The number of dims (as ndim).")
      .def(
          "__len__",
          [](const Tensor& t) {
            QKV_CHECK(t.dim() > 0, "len() of a 0-d tensor");
            return t.size(0);
          },
          "The size of dim 0.")
      .def(
          "data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()); },
          "Address of the first element (after the view's offset).")
      .def("is_contiguous", &Tensor::is_contiguous, "Whether the elements are packed in row-major order.")
      .def_property(
          "requires_grad", [](const Tensor& t) { return t.requires_grad(); },
          [](Tensor& t, bool on) { t.set_requires_grad(on); }, "Settable on leaves (tensors no op produced).")
      .def_property_readonly(
          "grad",
          [](const Tensor& t) -> py::object {
            const Tensor g = t.grad();
            return g.defined() ? py::cast(g) : py::none();
          },
          "The gradient backward() accumulated into this leaf, or None.")
      .def_property_readonly("is_leaf", &Tensor::is_leaf, "Whether no op produced this tensor (its grad is kept).")
      .def(
          "backward",
          [](const Tensor& t, py::handle grad) {
            const Tensor g = grad.is_none() ? Tensor() : as_tensor(grad, "grad");
            py::gil_scoped_release release;
            autograd::backward(t, g);
          },
          py::arg("grad") = py::none(), "Backpropagates from this tensor (a scalar, or with grad of its shape).")
      .def("detach", &Tensor::detach, "The same memory without autograd history (requires_grad False).")
      .def("numpy", &to_numpy, "The numpy array sharing this tensor's memory (no copy; bf16/f16 appear as uint16).")
      .def(
          "__array__", [](const Tensor& t, py::handle) { return to_numpy(t); }, py::arg("dtype") = py::none(),
          "numpy's array protocol: the array sharing this tensor's memory (dtype is not applied).")
      .def(
          "__dlpack__", [](const Tensor& t, py::handle) { return to_dlpack(t); }, py::arg("stream") = py::none(),
          "A DLPack capsule over this tensor's memory (no copy); it keeps the memory alive.")
      .def("__dlpack_device__", &dlpack_device, "(device type, id) as DLPack numbers them: (1, 0) for the CPU.")
      .def("to", &convert_to, py::arg("target"), "A copy in another dtype ('float64', ...) or on another device.")
      .def("contiguous", &Tensor::contiguous, "self when already contiguous, else a contiguous copy")
      .def("clone", &Tensor::clone, "a fresh contiguous copy")
      .def(
          "tolist",
          [](const Tensor& t) {
            const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
            const bool half = host.dtype() == DType::bf16 || host.dtype() == DType::f16;
            return to_numpy(half ? host.to(DType::f32) : host).attr("tolist")();
          },
          "The elements as nested Python lists (bfloat16/float16 as their float values).")
      .def("item", &Tensor::item, "The value of a one-element tensor as a Python float.")
      .def("__repr__", &repr, "qkv.Tensor(shape=..., dtype=..., device=...).");

  m.def(
      "tensor",
      [](py::handle obj, bool copy, py::handle dtype) {
        Tensor t = dtype.is_none() ? as_tensor(obj, "obj") : as_tensor_of(obj, "obj", parse_dtype(dtype, "dtype"));
        return copy ? t.clone() : t;
      },
      py::arg("obj"), py::arg("copy") = false, py::arg("dtype") = py::none(),
      "A qkv.Tensor over obj's memory: numpy arrays and buffers are shared, torch tensors through DLPack, "
      "lists copied. dtype='bfloat16'/'float16' reads a uint16 array's words as that type (no copy); another "
      "dtype converts (a copy). copy=True always copies. What cannot be shared (negative strides, unaligned, "
      "read-only, non-CPU, no qkv dtype) raises qkv.Error.");
  m.def(
      "from_dlpack",
      [](py::handle x) {
        QKV_CHECK(PyCapsule_CheckExact(x.ptr()) || py::hasattr(x, "__dlpack__"), "argument 'x' of type ",
                  py::str(py::type::of(x).attr("__name__")).cast<std::string>(),
                  " is neither a DLPack capsule nor an object with __dlpack__");
        return as_tensor(x, "x");
      },
      py::arg("x"), "A qkv.Tensor sharing the memory of x (a torch tensor, anything with __dlpack__, or a capsule).");
}

}  // namespace qkv::python
