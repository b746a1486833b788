// RoPE forward and backward (formulas in rope.h). One kernel serves both: the backward is the
// same rotation with sin negated (cpu::rope in tensor/cpu/rope.cpp, its twin cuda::rope in
// tensor/cuda/rope.cu). Shapes: x, out [B, H, N, D]; positions [B, N] (a [N] tensor is broadcast
// over B).
#include "attention/rope.h"

#include <cmath>
#include <vector>

#include "autograd/node.h"
#include "tensor/cpu/nn_kernels.h"
#include "tensor/cuda/kernels.h"

namespace qkv::attn {

namespace {

// inv_freq_f = theta^(−2f/D), f < D/2: shared by the CPU and CUDA kernels.
std::vector<double> rope_inv_freq(double theta, int64_t D) {
  std::vector<double> inv_freq(D / 2);
  for (int64_t f = 0; f < D / 2; ++f)
    inv_freq[f] = std::pow(theta, -2.0 * static_cast<double>(f) / static_cast<double>(D));
  return inv_freq;
}

Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, double theta, double sign) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  const std::vector<double> inv_freq = rope_inv_freq(theta, x.size(3));
  if (x.device() == Device::cuda) cuda::rope(x, pos, per_row, inv_freq, sign, out);
  else cpu::rope(x, pos, per_row, inv_freq, sign, out);
  return out;
}

// dx = rope(dy) with the angle negated (the transpose of a rotation is its inverse)
struct RopeBackward : autograd::Node {
  std::vector<int64_t> pos;
  bool per_row = false;
  double theta = 10000.0;
  const char* name() const override { return "RopeBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {rope_apply(dy, pos, per_row, theta, -1.0)}; }
  void release() override { pos.clear(); }
};

Tensor rope_impl(const Tensor& x, std::vector<int64_t> pos, bool per_row, double theta) {
  Tensor out = rope_apply(x, pos, per_row, theta, 1.0);
  if (!autograd::any_requires_grad({&x})) return out;
  auto node = std::make_shared<RopeBackward>();
  node->pos = std::move(pos);
  node->per_row = per_row;
  node->theta = theta;
  return autograd::record(out, node, {x});
}

void check_x(const Tensor& x, double theta) {
  QKV_CHECK(x.defined() && x.dim() == 4, "[rope] x must be [B,H,N,D], got ",
            x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  QKV_CHECK(x.size(3) % 2 == 0, "[rope] head dim must be even for rotate-half pairs, x is ", shape_str(x.shape()));
  QKV_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, "[rope] x must be float32/float64, got ",
            dtype_name(x.dtype()));
  QKV_CHECK(theta > 0, "[rope] theta must be positive, got ", theta);
}

}  // namespace

Tensor apply_rope(const Tensor& x, const Tensor& positions, double theta) {
  check_x(x, theta);
  const int64_t B = x.size(0), N = x.size(2);
  QKV_CHECK(positions.defined() && is_integral(positions.dtype()),
            "[rope] positions must be an int tensor [N] or [B,N]");
  const bool per_row = positions.dim() == 2;
  QKV_CHECK(
      (positions.dim() == 1 && positions.size(0) == N) || (per_row && positions.size(0) == B && positions.size(1) == N),
      "[rope] positions are ", shape_str(positions.shape()), " but x ", shape_str(x.shape()), " needs [N] = [", N,
      "] or [B,N] = ", shape_str({B, N}));
  const std::vector<double> pv = positions.to_vector();
  std::vector<int64_t> pos(pv.begin(), pv.end());
  return rope_impl(x, std::move(pos), per_row, theta);
}

Tensor apply_rope(const Tensor& x, int64_t start_pos, double theta) {
  check_x(x, theta);
  std::vector<int64_t> pos(x.size(2));
  for (size_t n = 0; n < pos.size(); ++n) pos[n] = start_pos + static_cast<int64_t>(n);
  return rope_impl(x, std::move(pos), false, theta);
}

}  // namespace qkv::attn
