// qkv._qkv: the C++ core as a Python extension module. Every qkv::Error raised below a binding
// reaches Python as qkv.Error (a RuntimeError) carrying the one-line message the CLI prints.
#include <pybind11/pybind11.h>

#include "python/src/bindings.h"
#include "tensor/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_qkv, m) {
  m.doc() = "qkv: tensors, autograd, attention and small decoder-only Transformers (C++ core)";
  m.attr("__version__") = QKV_VERSION;
  py::register_exception<qkv::Error>(m, "Error", PyExc_RuntimeError).attr("__doc__") =
      "An error of the C++ core or of a binding's arguments; its text is the line the CLI prints after 'qkv: '.";
  qkv::python::bind_tensor(m);
  qkv::python::bind_attention(m);
  qkv::python::bind_model(m);
  qkv::python::bind_analysis(m);
}
