// AdamW over all parameters on the CPU (train/optimizer.cpp; the CUDA twin is tensor/cuda/adamw.h).
#pragma once
#include <vector>

#include "tensor/adamw_scalars.h"

namespace qkv::cpu {

// adamw_element (tensor/adamw_scalars.h) on every element of every slice, with `with_decay` or
// `without_decay` by the slice's flag. Element-wise, so the result does not depend on the split.
void adamw_update_many(const std::vector<AdamWSlice>& slices, const AdamWScalars& with_decay,
                       const AdamWScalars& without_decay);

}  // namespace qkv::cpu
