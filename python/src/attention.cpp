#include "python/src/bindings.h"

namespace qkv::python {

void bind_attention(pybind11::module_& m) {}

}  // namespace qkv::python
