// qkv.Model: a loaded model as the Python module holds it, shared by the model bindings
// (model.cpp) and the analysis ones (analysis.cpp), which take a qkv.Model argument.
#pragma once
#include <memory>
#include <string>

#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"

namespace qkv::python {

struct Model {
  std::shared_ptr<nn::DecoderModel> model;  // eval mode
  train::CheckpointMeta meta;               // config, tokenizer (may be null), path
  Numerics numerics = Numerics::standard;   // every call on this model runs under it (NumericsGuard)
  std::string device = "cpu";
};

}  // namespace qkv::python
