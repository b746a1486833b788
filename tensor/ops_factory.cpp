// Factories and in-place fills/copies. Values are produced on the CPU; a CUDA result is the CPU
// tensor moved over (factories are not hot).
//
// Random tensors (rand, randn) use Philox 4x32-10 (tensor/philox.h), counter layout:
//   key     = (k0, k1) = (low 32 bits of seed, high 32 bits of seed)
//   counter = (c0, c1, c2, c3) = (low 32 of e, high 32 of e, 0, 0),  e = offset + i
// where i is the element's row-major index in the result. One Philox call per element gives four
// 32-bit words w0..w3, used as:
//   rand  float32: u = w0 >> 8 scaled to [0,1)                  (uniform_from_bits)
//   rand  float64: u = 53 bits of (w0, w1)                      (uniform53_from_bits)
//   randn float32: u1 = uniform(w0), u2 = uniform(w1)
//   randn float64: u1 = uniform53(w0, w1), u2 = uniform53(w2, w3)
//   randn = mean + std * sqrt(-2 ln(1 - u1)) * cos(2 pi u2)      (Box-Muller; 1 - u1 is in (0, 1])
// So element i depends only on (seed, offset + i): any thread count, any chunking, CPU or CUDA,
// gives the same tensor, and drawing [0, n) then [n, 2n) with offset n equals one draw of 2n.
// c2 is the stream (tensor/cpu/random_bits.h): 0 for these factories, so dropout with the same seed
// never reuses their bits.
#include <omp.h>

#include <cmath>

#include "tensor/cpu/copy.h"
#include "tensor/cpu/elementwise.h"
#include "tensor/cpu/loops.h"
#include "tensor/cpu/random_bits.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"
#include "tensor/philox.h"

namespace qkv {

namespace {

constexpr double kTwoPi = 6.283185307179586476925;

Tensor on_device(Tensor t, Device device) { return device == Device::cpu ? t : t.to(device); }

inline Philox4 draw(uint64_t e, uint64_t seed) { return cpu::random_bits(seed, e, cpu::RandomStream::factories); }

// Fills a contiguous buffer element by element from its own counter; OpenMP over chunks.
template <class T, class F>
void fill_random(T* out, int64_t n, F&& value_of) {
#pragma omp parallel for schedule(static) if (n >= 2 * cpu::kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) out[i] = value_of(i);
}

}  // namespace

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu);
  cpu::fill(t, value);
  return on_device(t, device);
}

Tensor arange(int64_t start, int64_t end, DType dtype, Device device) {
  QKV_CHECK(end >= start, "[arange] end ", end, " is before start ", start);
  Tensor t = Tensor::empty({end - start}, DType::i64, Device::cpu);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < end - start; ++i) p[i] = start + i;
  return on_device(t.to(dtype), device);
}

Tensor rand(const Shape& shape, uint64_t seed, uint64_t offset, double lo, double hi, DType dtype) {
  QKV_CHECK(dtype == DType::f32 || dtype == DType::f64, "[rand] dtype must be float32 or float64, not ",
            dtype_name(dtype));
  QKV_CHECK(hi >= lo, "[rand] hi ", hi, " is below lo ", lo);
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  if (dtype == DType::f32) {
    // lo + w u can round up to hi itself; the largest value below hi keeps the interval half-open.
    const float l = static_cast<float>(lo), w = static_cast<float>(hi - lo), h = static_cast<float>(hi);
    const float below = hi > lo ? std::nextafter(h, l) : l;
    fill_random(t.data<float>(), n, [&](int64_t i) {
      const Philox4 r = draw(offset + static_cast<uint64_t>(i), seed);
      const float v = l + w * uniform_from_bits(r.v[0]);
      return v < h ? v : below;
    });
  } else {
    const double w = hi - lo, below = hi > lo ? std::nextafter(hi, lo) : lo;
    fill_random(t.data<double>(), n, [&](int64_t i) {
      const Philox4 r = draw(offset + static_cast<uint64_t>(i), seed);
      const double v = lo + w * uniform53_from_bits(r.v[0], r.v[1]);
      return v < hi ? v : below;
    });
  }
  return t;
}

Tensor randn(const Shape& shape, uint64_t seed, uint64_t offset, double mean, double std, DType dtype) {
  QKV_CHECK(dtype == DType::f32 || dtype == DType::f64, "[randn] dtype must be float32 or float64, not ",
            dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  if (dtype == DType::f32) {
    fill_random(t.data<float>(), n, [&](int64_t i) {
      const Philox4 r = draw(offset + static_cast<uint64_t>(i), seed);
      const float u1 = 1.0f - uniform_from_bits(r.v[0]), u2 = uniform_from_bits(r.v[1]);
      const float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(static_cast<float>(kTwoPi) * u2);
      return static_cast<float>(mean + std * static_cast<double>(z));
    });
  } else {
    fill_random(t.data<double>(), n, [&](int64_t i) {
      const Philox4 r = draw(offset + static_cast<uint64_t>(i), seed);
      const double u1 = 1.0 - uniform53_from_bits(r.v[0], r.v[1]), u2 = uniform53_from_bits(r.v[2], r.v[3]);
      return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    });
  }
  return t;
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  const int64_t n = checked_numel(shape);
  QKV_CHECK(static_cast<int64_t>(values.size()) == n, "[from_vector] ", values.size(), " values for shape ",
            shape_str(shape), " (", n, " elements)");
  Tensor src = Tensor::empty(shape, DType::f64);
  double* p = src.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = values[i];
  return src.to(dtype);
}

Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  const int64_t n = checked_numel(shape);
  QKV_CHECK(static_cast<int64_t>(values.size()) == n, "[from_vector_i64] ", values.size(), " values for shape ",
            shape_str(shape), " (", n, " elements)");
  Tensor src = Tensor::empty(shape, DType::i64);
  int64_t* p = src.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = values[i];
  return src.to(dtype);
}

Tensor zeros_like(const Tensor& t) {
  detail::require_defined("zeros_like", t, "input");
  return zeros(t.shape(), t.dtype(), t.device());
}

Tensor empty_like(const Tensor& t) {
  detail::require_defined("empty_like", t, "input");
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}

void fill_(const Tensor& t, double value) {
  detail::require_defined("fill_", t, "tensor");
  if (t.device() == Device::cuda) cuda::fill(t, value);
  else cpu::fill(t, value);
}

Tensor round_to_bf16(const Tensor& x) {
  detail::require_defined("round_to_bf16", x, "x");
  QKV_CHECK(x.dtype() == DType::f32, "[round_to_bf16] needs a float32 tensor, got ", dtype_name(x.dtype()));
  if (x.device() == Device::cuda) return x.to(DType::bf16).to(DType::f32);
  Tensor out = Tensor::empty(x.shape(), DType::f32, Device::cpu);
  cpu::round_bf16_values(x, out);
  return out;
}

void copy_(const Tensor& dst, const Tensor& src) {
  detail::require_defined("copy_", dst, "destination");
  detail::require_defined("copy_", src, "source");
  QKV_CHECK(broadcast_shapes(src.shape(), dst.shape(), "copy_") == dst.shape(), "[copy_] source ",
            shape_str(src.shape()), " does not broadcast to destination ", shape_str(dst.shape()));
  if (dst.device() == Device::cuda) {
    // A host source crosses once, compactly, and is converted on the device.
    const Tensor s = src.device() == Device::cuda ? src : src.contiguous().to(Device::cuda);
    cuda::copy_cast(s.expand(dst.shape()), dst);
  } else {
    const Tensor s = src.device() == Device::cpu ? src : src.to(Device::cpu);
    cpu::copy_cast(s.expand(dst.shape()), dst);
  }
}

}  // namespace qkv
