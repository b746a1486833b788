// Shared by the tests: tolerance checks of results against reference values (usually naive
// float64 loops), a scope that runs code on a given number of OpenMP threads, and the skip of
// [cuda] cases where no GPU is visible.
#pragma once
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <vector>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/tensor.h"

namespace qkv::test {

// A [cuda] case starts with `if (!cuda_device_present()) return;`: where no device is visible it
// prints "[cuda] skipped: no CUDA device" (once per process; CI has no GPU) and checks nothing.
inline bool cuda_device_present() {
  if (cuda::device_count() > 0) return true;
  static bool said = false;
  if (!said) std::printf("[cuda] skipped: no CUDA device\n");
  said = true;
  return false;
}

// Every element within atol + rtol |want| (NaN where want is NaN); reports the worst element once
// (one Catch assertion per tensor keeps large checks fast).
inline void check_close(const Tensor& got, const std::vector<double>& want, double rtol, double atol = 0) {
  const std::vector<double> g = got.to_vector();
  REQUIRE(g.size() == want.size());
  size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == want[i] || (std::isnan(want[i]) && std::isnan(g[i]))) continue;
    const double excess = std::fabs(g[i] - want[i]) - (atol + rtol * std::fabs(want[i]));
    if (!(excess <= 0)) {
      if (bad == 0 || !(excess <= worst_excess)) {
        worst = i;
        worst_excess = excess;
      }
      ++bad;
    }
  }
  INFO(bad << " of " << g.size() << " elements off; worst at " << worst << ": got " << (g.empty() ? 0 : g[worst])
           << " want " << (want.empty() ? 0 : want[worst]));
  CHECK(bad == 0);
}

// max_i |got_i - want_i| / (1 + |want_i|) <= tol: absolute near zero, relative for large values;
// reported with the worst index.
inline void check_mixed_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / (1 + std::fabs(want[i]));
    if (!(e <= worst)) worst = e, at = i;
  }
  INFO("worst relative error " << worst << " at " << at);
  CHECK(worst <= tol);
}

// max |a - b| / max |b|: relative to the tensor's scale (elementwise ratios blow up near zero).
inline double rel_err(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double num = 0, den = 1e-30;
  for (size_t e = 0; e < x.size(); ++e) {
    num = std::max(num, std::fabs(x[e] - y[e]));
    den = std::max(den, std::fabs(y[e]));
  }
  return num / den;
}

// Runs f with OpenMP limited to `n` threads, restoring the previous limit.
template <class F>
auto with_threads(int n, F&& f) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(n);
  auto r = f();
  omp_set_num_threads(prev);
  return r;
}

}  // namespace qkv::test
