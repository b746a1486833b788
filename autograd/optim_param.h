// One parameter as an optimizer sees it: a name, the tensor whose .grad() it reads, and whether
// weight decay applies. Declared here, below both train/ (AdamW, the trainer) and distributed/
// (which slices parameters into ZeRO-1 pieces before the optimizer is built over them).
#pragma once
#include <string>

#include "tensor/tensor.h"

namespace qkv::autograd {

struct OptimParam {
  std::string name;   // unique; the checkpoint key /optimizer/<name>/...
  Tensor param;       // float32, contiguous, all on one device; its .grad() is read at step()
  bool decay = true;  // convention: 2-D and higher weights decay; biases, norm gains do not
};

}  // namespace qkv::autograd
