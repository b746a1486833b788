// The CPU RoPE kernel (front end and formulas: attention/rope.h; the CUDA twin is
// tensor/cuda/rope.cu): out_f = x_f·cos a − x_{f+D/2}·sin a, out_{f+D/2} = x_{f+D/2}·cos a + x_f·sin a,
// a = sign·pos·inv_freq_f in float64. cos/sin are computed once per (b, n) and reused across the
// H heads.
#include <omp.h>

#include <cmath>
#include <vector>

#include "tensor/cpu/nn_kernels.h"

namespace qkv::cpu {

namespace {

template <class T>
void rope_typed(const Tensor& x, const std::vector<int64_t>& pos, bool pos_per_row, const std::vector<double>& inv_freq,
                double sign, const Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3), half = D / 2;
  const int64_t sb = x.stride(0), sh = x.stride(1), sn = x.stride(2), sd = x.stride(3);
  const T* xp = x.data<T>();
  T* op = out.data<T>();
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

}  // namespace

void rope(const Tensor& x, const std::vector<int64_t>& pos, bool per_row, const std::vector<double>& inv_freq,
          double sign, const Tensor& out) {
  if (x.dtype() == DType::f32) rope_typed<float>(x, pos, per_row, inv_freq, sign, out);
  else rope_typed<double>(x, pos, per_row, inv_freq, sign, out);
}

}  // namespace qkv::cpu
