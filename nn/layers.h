// Basic layers. Shapes: x [..., in] unless stated; weights follow PyTorch's nn layouts
// (Linear weight [out, in]); the checkpoint code maps names/layouts to Hugging Face's.
#pragma once
#include <cstdint>

#include "nn/module.h"
#include "tensor/ops.h"

namespace qkv::nn {

// Where dropout draws its masks from: Philox counters keyed by (seed, step, site), so a step's
// masks are a pure function of the step number (resume continues exactly; recompute reproduces).
struct RngContext {
  uint64_t seed = 0;
  uint64_t step = 0;
  uint32_t site = 0;  // incremented by every dropout call within one forward
  // Counter offset of the next dropout site: high bits the step, then the site; the low 32 bits
  // are left for the element index.
  uint64_t next_offset() { return (step << 40) | (static_cast<uint64_t>(site++ & 0xff) << 32); }
};

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias);
  Tensor forward(const Tensor& x) const;  // x W^T + b
  Tensor weight, bias;
  int64_t in_features, out_features;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim);
  Tensor forward(const Tensor& ids) const;
  Tensor weight;
};

class LayerNorm : public Module {
 public:
  LayerNorm(int64_t dim, double eps, bool bias);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) const;
  Tensor weight;
  double eps;
};

// Inverted dropout, active only in training mode with p > 0.
Tensor dropout(const Tensor& x, double p, bool training, RngContext& rng);

}  // namespace qkv::nn
