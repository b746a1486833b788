#pragma once
#include "tensor/tensor.h"

namespace qkv::cpu {
// dst[i] = convert(src[i]) elementwise over equal shapes; any strides, any dtype pair.
void copy_cast(const Tensor& src, const Tensor& dst);
}  // namespace qkv::cpu
