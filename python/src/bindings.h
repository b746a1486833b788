// The parts of the Python module qkv._qkv, one function per room of the product; module.cpp calls
// them in order (tensors first: the others take and return qkv.Tensor).
#pragma once
#include <pybind11/pybind11.h>

namespace qkv::python {

void bind_tensor(pybind11::module_& m);     // tensor.cpp: qkv.Tensor, numpy / DLPack sharing
void bind_attention(pybind11::module_& m);  // attention.cpp: attention forward + vjp, op gradcheck
void bind_model(pybind11::module_& m);      // model.cpp: checkpoints, logits, generate, tokenizer, train
void bind_analysis(pybind11::module_& m);   // analysis.cpp: leakcheck, attention maps, heads, cost, study

}  // namespace qkv::python
