#include <pybind11/stl.h>

#include "python/src/bindings.h"
#include "python/src/convert.h"

namespace py = pybind11;

namespace qkv::python {

void bind_tensor(py::module_& m) {
  py::class_<Tensor>(m, "Tensor", py::buffer_protocol())
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def("numpy", &to_numpy, "The numpy array sharing this tensor's memory (no copy).");
  m.def(
      "tensor", [](py::handle obj) { return as_tensor(obj, "obj"); }, py::arg("obj"),
      "A qkv.Tensor over obj's memory (numpy arrays are shared, not copied).");
}

}  // namespace qkv::python
