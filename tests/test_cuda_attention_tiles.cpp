// The tiled CUDA attention kernels (attention/cuda/fused_attention.cu) against the untiled "simple"
// kernels of attention/cuda/dev/ (compiled only into this binary): same per-row arithmetic in the
// same order, so any difference is the tiling's (which rows are staged, which tiles are visited).
// Cases carry the [cuda] tag and report "skipped: no CUDA device" where none is present.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "compare_util.h"
#include "attention/attention.h"
#include "attention/mask.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"
#ifdef QKV_WITH_CUDA
#include "attention/cuda/dev/simple_attention.h"
#include "attention/cuda/fused_cuda.h"
#endif

using namespace qkv;

namespace {

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }

// max |a - b| / max(|b|, tiny) over two device tensors of one shape (infinities must agree).
double rel_diff(const Tensor& a_dev, const Tensor& b_dev) {
  REQUIRE(a_dev.shape() == b_dev.shape());
  const auto x = a_dev.to(Device::cpu).to_vector(), y = b_dev.to(Device::cpu).to_vector();
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::isfinite(x[i]) == std::isfinite(y[i]));
    if (std::isfinite(y[i])) {
      d = std::max(d, std::fabs(x[i] - y[i]));
      s = std::max(s, std::fabs(y[i]));
    } else {
      REQUIRE(x[i] == y[i]);
    }
  }
  return d / s;
}

struct TileCase {
  const char* name;
  int64_t Hq, Hkv, Nq, Nk, D;
  bool causal = true;
  int64_t window = 0;
  bool padding = false, lengths = false, segments = false, alibi = false;
  double dropout = 0;
  DType dtype = DType::f32;
};

// The options of `c` for batch 2, on the device.
attn::AttentionOptions options_of(const TileCase& c) {
  const int64_t B = 2;
  attn::AttentionOptions o;
  o.causal = c.causal;
  o.window = c.window;
  if (c.padding) {
    std::vector<double> kp(static_cast<size_t>(B * c.Nk), 1.0);
    for (int64_t j = 0; j < 5; ++j) kp[static_cast<size_t>(c.Nk + j)] = 0.0;  // batch 1: 5 pads on the left
    o.key_padding = gpu(from_vector(kp, {B, c.Nk}).to(DType::boolean));
  }
  if (c.lengths) o.key_lengths = {c.Nk, c.Nk / 2 + 3};
  if (c.segments) {
    std::vector<int64_t> seg(static_cast<size_t>(B * c.Nk));
    for (size_t t = 0; t < seg.size(); ++t) seg[t] = static_cast<int64_t>((t % static_cast<size_t>(c.Nk)) / 13);
    o.segment_ids = gpu(from_vector_i64(seg, {B, c.Nk}));
  }
  if (c.alibi)
    for (int64_t h = 0; h < c.Hq; ++h) o.alibi_slopes.push_back(0.5f / static_cast<float>(h + 1));
  if (c.dropout > 0) {
    o.dropout_p = c.dropout;
    o.dropout_seed = 31;
    o.dropout_offset = 4;
  }
  return o;
}

}  // namespace

TEST_CASE("CUDA attention: the tiled kernels equal the untiled simple kernels (forward, dQ, dK, dV)",
          "[cuda][simple]") {
  if (!test::cuda_device_present()) return;
#ifdef QKV_WITH_CUDA
  // Several tiles per side (8 query rows per block, 32 keys per tile below D + Dv = 384 floats),
  // sizes off the tile grid, logits up to ~±40 (q and k scaled by 2.5).
  const std::vector<TileCase> cases = {
      {"causal MHA", 2, 2, 77, 77, 16},
      {"no mask, GQA 4:2, decode-shaped Nq < Nk", 4, 2, 9, 70, 32, false},
      {"window 19, MQA", 4, 1, 70, 70, 24, true, 19},
      {"left padding + key lengths (fully masked rows)", 2, 2, 41, 41, 8, true, 0, true, true},
      {"segments + ALiBi", 4, 2, 50, 50, 16, true, 0, false, false, true, true},
      {"dropout 0.2, head dim 100", 2, 2, 45, 45, 100, true, 0, false, false, false, false, 0.2},
      {"float64, head dim 256 (8-row tiles), window 9", 2, 1, 29, 37, 256, true, 9, false, true, false, false, 0.0,
       DType::f64},
  };
  for (const TileCase& c : cases) {
    INFO(c.name);
    const int64_t B = 2;
    const Tensor q = gpu(randn({B, c.Hq, c.Nq, c.D}, 70, 0, 0.0, 2.5, c.dtype)),
                 k = gpu(randn({B, c.Hkv, c.Nk, c.D}, 71, 0, 0.0, 2.5, c.dtype)),
                 v = gpu(randn({B, c.Hkv, c.Nk, c.D}, 72, 0, 0.0, 1.0, c.dtype)),
                 dout = gpu(randn({B, c.Hq, c.Nq, c.D}, 73, 0, 0.0, 1.0, c.dtype));
    const attn::AttentionOptions o = options_of(c);
    const attn::Problem p = attn::check_problem(q, k, v, o);
    const auto plan = attn::cuda_fused::make_plan(o, p);
    const attn::FusedForward ft = attn::cuda_fused::forward(q, k, v, *plan);
    const attn::FusedForward fs = attn::cuda_simple::forward(q, k, v, *plan);
    const attn::FusedGrads gt = attn::cuda_fused::backward(dout, q, k, v, ft.out, ft.lse, *plan);
    const attn::FusedGrads gs = attn::cuda_simple::backward(dout, q, k, v, fs.out, fs.lse, *plan);
    const double d[5] = {rel_diff(ft.out, fs.out), rel_diff(ft.lse, fs.lse), rel_diff(gt.dq, gs.dq),
                         rel_diff(gt.dk, gs.dk), rel_diff(gt.dv, gs.dv)};
    std::printf("[cuda] tiled vs simple, %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", c.name, d[0], d[1], d[2],
                d[3], d[4]);
    // Same operations in the same order: equal up to the compiler's choice of fused multiply-adds.
    const double tol = c.dtype == DType::f32 ? 1e-6 : 1e-14;
    for (double x : d) CHECK(x <= tol);
  }
#endif
}
