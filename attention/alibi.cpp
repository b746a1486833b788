#include "attention/alibi.h"

#include <cmath>

namespace qkv::attn {

namespace {
std::vector<double> power_of_two_slopes(int64_t n) {
  std::vector<double> s(n);
  for (int64_t h = 0; h < n; ++h) s[h] = std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(n));
  return s;
}
}  // namespace

std::vector<float> alibi_slopes(int64_t n_heads) {
  QKV_CHECK(n_heads > 0, "[alibi] need at least one head, got ", n_heads);
  int64_t p = 1;
  while (p * 2 <= n_heads) p *= 2;
  std::vector<double> s = power_of_two_slopes(p);
  if (p < n_heads) {
    const std::vector<double> extra = power_of_two_slopes(2 * p);
    for (int64_t e = 0; static_cast<int64_t>(s.size()) < n_heads; e += 2) s.push_back(extra[e]);
  }
  return std::vector<float>(s.begin(), s.end());
}

Tensor alibi_bias(const std::vector<float>& slopes, int64_t nq, int64_t nk, DType dtype) {
  const int64_t H = static_cast<int64_t>(slopes.size());
  Tensor t = Tensor::empty({1, H, nq, nk}, DType::f64);
  double* d = t.data<double>();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t j = 0; j < nk; ++j)
        d[(h * nq + i) * nk + j] = -static_cast<double>(slopes[h]) * static_cast<double>(nk - nq + i - j);
  return dtype == DType::f64 ? t : t.to(dtype);
}

}  // namespace qkv::attn
