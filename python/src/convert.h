// Crossing between Python objects and qkv tensors. Every binding that takes or returns a tensor
// goes through these, so the sharing rules live in one place (convert.cpp):
//   in:  a qkv.Tensor as is; a numpy array (or any buffer) of float32/float64/int32/int64/bool
//        shared without a copy when its strides are non-negative multiples of its item size and
//        it is aligned; a Python list/scalar converted (a copy, nothing to share).
//   out: a numpy array over the tensor's memory (CPU tensors), which keeps the storage alive.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "tensor/tensor.h"

namespace qkv::python {

// `what` names the argument in errors ("q", "ids", ...).
Tensor as_tensor(pybind11::handle obj, const char* what);
std::optional<Tensor> as_optional_tensor(pybind11::handle obj, const char* what);  // None -> nullopt
// The numpy array sharing t's memory (t on the CPU; bf16/f16 appear as uint16).
pybind11::array to_numpy(const Tensor& t);

}  // namespace qkv::python
