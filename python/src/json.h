// nlohmann::json -> Python objects, for the analysis tools whose C++ side reports as JSON (the
// same object the CLI prints with --json): objects become dicts (in the object's key order), arrays lists,
// numbers int or float, null None, strings str
// (bytes that are not UTF-8 replaced by U+FFFD). Array data a binding builds itself goes out as numpy instead.
#pragma once
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

namespace qkv::python {

pybind11::object to_python(const nlohmann::json& j);

}  // namespace qkv::python
