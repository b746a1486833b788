#include "python/src/bindings.h"

namespace qkv::python {

void bind_analysis(pybind11::module_& m) {}

}  // namespace qkv::python
