// Crossing between Python objects and qkv tensors. Every binding that takes or returns a tensor
// goes through these, so the sharing rules live in one place (convert.cpp):
//   in:  a qkv.Tensor as is; a numpy array (or any buffer) of float16/float32/float64/int32/int64/
//        bool shared without a copy when its strides are non-negative multiples of its item size,
//        it is aligned and writable; anything with __dlpack__ (a torch tensor) or a "dltensor"
//        capsule shared through DLPack under the same rules (CPU memory only); a Python
//        list/scalar converted (a copy, nothing to share). What cannot be shared is refused with
//        a qkv.Error naming the argument and saying how to copy it: never a silent copy.
//   out: a numpy array over the tensor's memory (CPU tensors) or a DLPack capsule, each keeping
//        the tensor's storage alive.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::python {

// `what` names the argument in errors ("q", "ids", ...).
Tensor as_tensor(pybind11::handle obj, const char* what);
std::optional<Tensor> as_optional_tensor(pybind11::handle obj, const char* what);  // None -> nullopt
// obj as a tensor of `dtype`: 2-byte elements (numpy uint16/float16) asked for as bfloat16 or
// float16 are reinterpreted in place (no copy); the same dtype is obj itself; any other dtype is a
// converted copy.
Tensor as_tensor_of(pybind11::handle obj, const char* what, DType dtype);
// The numpy array sharing t's memory (t on the CPU; bf16/f16 appear as uint16).
pybind11::array to_numpy(const Tensor& t);

// A numpy dtype's kind ('f', 'i', 'u', 'b', ...), item size in bytes and whether it is in this
// machine's byte order, read through the dtype's Python attributes. pybind11 before 2.12 reads
// py::dtype::kind()/itemsize() (and py::array::itemsize()) from numpy 1's C struct layout, whose
// item size under numpy 2 is another field (flags): every dtype then looks unknown. The attributes
// are the same under numpy 1 and 2, whichever pybind11 built the module.
struct NumpyItem {
  char kind;
  pybind11::ssize_t size;
  bool native;
};
NumpyItem numpy_item(const pybind11::dtype& dt);

// A new C-contiguous numpy array of `shape` holding a copy of data[0 .. product(shape)). Its strides
// come from sizeof(T): pybind11's count-only array constructors (before 2.12) take them from the
// dtype's item size, which under numpy 2 they misread (see NumpyItem), making every stride 0.
template <class T>
pybind11::array_t<T> numpy_copy(std::vector<pybind11::ssize_t> shape, const T* data) {
  return pybind11::array_t<T>(std::move(shape), data);
}

// DLPack (https://dmlc.github.io/dlpack/latest/): obj is a producer (has __dlpack__) or a capsule
// named "dltensor"; the tensor shares its memory and keeps it alive until the last view is gone.
Tensor from_dlpack(pybind11::handle obj, const char* what);
// A "dltensor" capsule over t's memory that keeps t's storage alive until the consumer is done.
pybind11::capsule to_dlpack(const Tensor& t);
// (device type, device id) as __dlpack_device__ spells them: (1, 0) for the CPU, (2, id) for CUDA.
pybind11::tuple dlpack_device(const Tensor& t);

// A dtype given as its qkv name ("float32", "bfloat16", ...), a numpy dtype or a torch dtype.
DType parse_dtype(pybind11::handle obj, const char* what);

}  // namespace qkv::python
