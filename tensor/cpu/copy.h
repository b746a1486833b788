#pragma once
#include "tensor/tensor.h"

namespace qkv::cpu {
// dst[i] = convert(src[i]) elementwise over equal shapes; any strides, any dtype pair.
void copy_cast(const Tensor& src, const Tensor& dst);
// dst[i] = src[i] rounded to bfloat16 and widened back (float32 both): src.to(bf16).to(f32) in one
// pass, the same bits (nearest, ties to even; a NaN stays a NaN, quieted).
void round_bf16_values(const Tensor& src, const Tensor& dst);
}  // namespace qkv::cpu
