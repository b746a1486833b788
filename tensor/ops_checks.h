// Input checks shared by the raw-op front ends (tensor/ops_*.cpp): each names the op and the
// offending shapes/dtypes so a bad call reads as one line, e.g. "[add] a is float32 but b is float64".
#pragma once
#include "tensor/tensor.h"

namespace qkv::detail {

inline void require_defined(const char* op, const Tensor& t, const char* what) {
  QKV_CHECK(t.defined(), "[", op, "] ", what, " is an undefined tensor");
}

inline void require_float(const char* op, const Tensor& t, const char* what = "input") {
  QKV_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "[", op, "] ", what,
            " must be float32 or float64, not ", dtype_name(t.dtype()));
}

inline void require_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  QKV_CHECK(a.dtype() == b.dtype(), "[", op, "] a is ", dtype_name(a.dtype()), " ", shape_str(a.shape()), " but b is ",
            dtype_name(b.dtype()), " ", shape_str(b.shape()));
}

inline void require_same_device(const char* op, const Tensor& a, const Tensor& b) {
  QKV_CHECK(a.device() == b.device(), "[", op, "] a is on ", device_name(a.device()), " but b is on ",
            device_name(b.device()));
}

}  // namespace qkv::detail
