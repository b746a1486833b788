#include "nn/layers.h"

#include "autograd/functions.h"

namespace qkv::nn {

// Parameters are created zero-filled here; the model's init() draws the values.
Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  weight = register_parameter("weight", zeros({out, in}));
  if (has_bias) bias = register_parameter("bias", zeros({out}), /*decay=*/false);
}
Tensor Linear::forward(const Tensor& x) const { return ag::linear(x, weight, bias); }

Embedding::Embedding(int64_t num, int64_t dim) { weight = register_parameter("weight", zeros({num, dim})); }
Tensor Embedding::forward(const Tensor& ids) const { return ag::embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t dim, double e, bool has_bias) : eps(e) {
  weight = register_parameter("weight", ones({dim}), /*decay=*/false);
  if (has_bias) bias = register_parameter("bias", zeros({dim}), /*decay=*/false);
}
Tensor LayerNorm::forward(const Tensor& x) const { return ag::layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double e) : eps(e) { weight = register_parameter("weight", ones({dim}), false); }
Tensor RMSNorm::forward(const Tensor& x) const { return ag::rms_norm(x, weight, eps); }

Tensor dropout(const Tensor& x, double p, bool training, RngContext& rng) {
  if (!training || p == 0.0) return x;
  return ag::dropout(x, p, rng.seed, rng.next_offset());
}

}  // namespace qkv::nn
