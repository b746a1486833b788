// RoPE forward and backward (formulas in rope.h). One kernel serves both: the backward is the
// same rotation with sin negated. Shapes: x, out [B, H, N, D]; positions [B, N] (a [N] tensor is
// broadcast over B). cos/sin are computed once per (b, n) and reused across the H heads.
#include "attention/rope.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "autograd/node.h"
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

// out = rotate(x, sign·angle); out contiguous [B,H,N,D].
template <class T>
void rope_kernel(const Tensor& x, const std::vector<int64_t>& pos, bool pos_per_row, double theta, double sign,
                 const Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3), half = D / 2;
  const int64_t sb = x.stride(0), sh = x.stride(1), sn = x.stride(2), sd = x.stride(3);
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  const std::vector<double> inv_freq = rope_inv_freq(theta, D);
  const int64_t rows = B * N;
#pragma omp parallel if (rows * H * D > (1 << 15) && !omp_in_parallel())
  {
    std::vector<T> c(half), s(half);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / N, n = r % N;
      const double p = static_cast<double>(pos[pos_per_row ? r : n]);
      for (int64_t f = 0; f < half; ++f) {
        const double a = p * inv_freq[f];
        c[f] = static_cast<T>(std::cos(a));
        s[f] = static_cast<T>(sign * std::sin(a));
      }
      for (int64_t h = 0; h < H; ++h) {
        const T* xr = xp + b * sb + h * sh + n * sn;
        T* orow = op + ((b * H + h) * N + n) * D;
        for (int64_t f = 0; f < half; ++f) {
          const T x1 = xr[f * sd], x2 = xr[(f + half) * sd];
          orow[f] = x1 * c[f] - x2 * s[f];
          orow[f + half] = x2 * c[f] + x1 * s[f];
        }
      }
    }
  }
}

Tensor rope_apply(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, double theta, double sign) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.device() == Device::cuda) cuda::rope(x, pos, per_row, rope_inv_freq(theta, x.size(3)), sign, out);
  else if (x.dtype() == DType::f32) rope_kernel<float>(x, pos, per_row, theta, sign, out);
  else rope_kernel<double>(x, pos, per_row, theta, sign, out);
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
  QKV_CHECK(positions.defined() && is_integral(positions.dtype()), "[rope] positions must be an int tensor [N] or [B,N]");
  const bool per_row = positions.dim() == 2;
  QKV_CHECK((positions.dim() == 1 && positions.size(0) == N) ||
                (per_row && positions.size(0) == B && positions.size(1) == N),
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
