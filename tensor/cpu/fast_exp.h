// exp for float32 inner loops that the compiler can vectorise (std::exp is a libm call per element
// without -ffast-math). exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in
// [-ln2/2, ln2/2] (ln 2 split in two parts so r is exact), exp(r) by a degree-6 polynomial (the
// Cephes expf coefficients); 2^n is built in the exponent bits. Max relative error ~2 ulp.
// x is clamped to [-88, 88]: exp of anything below about -87.7 (the float32 denormals) comes out
// as exactly 0, so exp(-inf) = 0; NaN in gives NaN out.
#pragma once
#include <cstdint>
#include <cstring>

namespace qkv::cpu {

inline float fast_exp(float x) {
  const float xc = x > -88.0f ? (x < 88.0f ? x : 88.0f) : -88.0f;  // NaN -> -88, fixed below
  // Round to nearest with the 1.5 * 2^23 trick: plain adds, so the loop stays vectorisable.
  constexpr float kShift = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kShift) - kShift;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  const float y = er * two_n;
  return x != x ? x : y;
}

}  // namespace qkv::cpu
