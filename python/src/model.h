// qkv.Model: a loaded model as the Python module holds it, shared by the model bindings
// (model.cpp) and the analysis ones (analysis.cpp), which take a qkv.Model argument.
#pragma once
#include <memory>
#include <string>

#include "nn/transformer.h"
#include "tensor/cpu/parallel.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"

namespace qkv::python {

struct Model {
  std::shared_ptr<nn::DecoderModel> model;  // eval mode
  train::CheckpointMeta meta;               // config, tokenizer (may be null), path
  Numerics numerics = Numerics::standard;   // every call on this model runs under it (ModelScope)
  int threads = 1;                          // the OpenMP threads every call runs on (ModelScope)
  std::string device = "cpu";
};

// What every call on a model runs under, on the calling thread only, until the call returns: the
// model's numerics mode (a NumericsGuard) and thread count (omp_set_num_threads sets the calling
// thread's). Two models used at once from two Python threads each compute as they would alone.
class ModelScope {
 public:
  explicit ModelScope(const Model& m) : numerics_(m.numerics), threads_(m.threads) {}

 private:
  NumericsGuard numerics_;
  cpu::OmpThreadsGuard threads_;
};

}  // namespace qkv::python
