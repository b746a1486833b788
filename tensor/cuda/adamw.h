// AdamW over all parameters in one kernel launch (train/optimizer.cpp on the GPU; the CPU twin is
// tensor/cpu/adamw.h): every parameter is cut into chunks of kAdamWChunk elements and one block
// updates one chunk, so a model's ~150 tensors cost one launch, not one each.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/adamw_scalars.h"

namespace qkv::cuda {

constexpr int64_t kAdamWChunk = 4096;  // elements per block

// adamw_element (tensor/adamw_scalars.h) on every element of every slice, with `with_decay` or
// `without_decay` by the slice's flag. Element-wise, so the result does not depend on chunking.
void adamw_update_many(const std::vector<AdamWSlice>& slices, const AdamWScalars& with_decay,
                       const AdamWScalars& without_decay);

}  // namespace qkv::cuda
