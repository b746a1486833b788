// The tiled CUDA attention kernels (attention/cuda/fused_attention.cu) against the untiled "simple"
// kernels of attention/cuda/dev/ (compiled only into this binary): same per-row arithmetic in the
// same order, so any difference is the tiling's (which rows are staged, which tiles are visited).
// Sparse patterns on those kernels: forward and gradients against the CPU fused kernel for every
// pattern under every other option, and the tiles the kernels walk against a brute-force layout
// built from the CPU's visibility mask. Cases carry the [cuda] tag and report "skipped: no CUDA
// device" where none is present.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compare_util.h"
#include "attention/attention.h"
#include "attention/mask.h"
#include "attention/pattern/pattern.h"
#include "autograd/engine.h"
#include "autograd/node.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"
#ifdef QKV_WITH_CUDA
#include "attention/cuda/dev/simple_attention.h"
#include "attention/cuda/fused_cuda.h"
#endif

using namespace qkv;

namespace {

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }

// max |a - b| / max(|b|, tiny) over two device tensors of one shape (non-finite values must agree).
double rel_diff(const Tensor& a_dev, const Tensor& b_dev) {
  REQUIRE(a_dev.shape() == b_dev.shape());
  const auto x = a_dev.to(Device::cpu).to_vector(), y = b_dev.to(Device::cpu).to_vector();
  double d = 0, s = 1e-30;
  size_t odd = 0;  // elements where one side is finite and the other not, or the infinities differ
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isfinite(y[i]) && std::isfinite(x[i])) {
      d = std::max(d, std::fabs(x[i] - y[i]));
      s = std::max(s, std::fabs(y[i]));
    } else {
      odd += !(x[i] == y[i]);
    }
  }
  CHECK(odd == 0);
  return d / s;
}

std::shared_ptr<const attn::SparsePattern> make_pattern(attn::Pattern kind,
                                                        const std::function<void(attn::SparsePattern&)>& set = {}) {
  auto p = std::make_shared<attn::SparsePattern>();
  p->kind = kind;
  if (set) set(*p);
  return p;
}

// One of each pattern, with blocks and widths that cut the kernels' tiles (8 query rows, 32 keys;
// 32 query rows, 8 keys) at odd places.
std::vector<std::shared_ptr<const attn::SparsePattern>> every_pattern() {
  using attn::Pattern;
  using attn::SparsePattern;
  return {
      make_pattern(Pattern::window, [](SparsePattern& p) { p.local = 13; }),
      make_pattern(Pattern::strided,
                   [](SparsePattern& p) {
                     p.stride = 7;
                     p.local = 5;
                   }),
      make_pattern(Pattern::strided),  // s = l = ceil(sqrt(Nk))
      make_pattern(Pattern::global,
                   [](SparsePattern& p) {
                     p.global = 3;
                     p.local = 4;
                   }),
      make_pattern(Pattern::global,
                   [](SparsePattern& p) {
                     p.global_tokens = {50, 0, 77, 50};
                   }),
      make_pattern(Pattern::bigbird,
                   [](SparsePattern& p) {
                     p.block_size = 16;
                     p.random_blocks = 2;
                     p.local = 9;
                     p.global = 2;
                     p.seed = 5;
                   }),
      make_pattern(Pattern::block_sparse, [](SparsePattern& p) { p.block_size = 16; }),  // local_global
      make_pattern(Pattern::block_sparse,
                   [](SparsePattern& p) {
                     p.block_size = 12;
                     p.layout = "fixed";
                   }),
      // A layout table (as load_layout leaves it) whose query block 2 sees nothing: fully masked rows.
      make_pattern(Pattern::block_sparse,
                   [](SparsePattern& p) {
                     p.block_size = 20;
                     p.layout = "table in the test";
                     p.layout_rows = p.layout_cols = 10;
                     p.layout_table.assign(100, 0);
                     for (int64_t r = 0; r < 10; ++r)
                       for (int64_t c = 0; c < 10; ++c)
                         p.layout_table[r * 10 + c] = r != 2 && (c == r || c == (r * 3) % 10 || c == 9 - r);
                   }),
  };
}

struct TileCase {
  const char* name;
  int64_t Hq, Hkv, Nq, Nk, D;
  bool causal = true;
  int64_t window = 0;
  bool padding = false, lengths = false, segments = false, alibi = false;
  double dropout = 0;
  DType dtype = DType::f32;
  std::shared_ptr<const attn::SparsePattern> pattern = nullptr;
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
    for (size_t t = 0; t < seg.size(); ++t) seg[t] = static_cast<int64_t>((t % static_cast<size_t>(c.Nk)) / 29);
    o.segment_ids = gpu(from_vector_i64(seg, {B, c.Nk}));
  }
  if (c.alibi)
    for (int64_t h = 0; h < c.Hq; ++h) o.alibi_slopes.push_back(0.5f / static_cast<float>(h + 1));
  if (c.dropout > 0) {
    o.dropout_p = c.dropout;
    o.dropout_seed = 31;
    o.dropout_offset = 4;
  }
  o.pattern = c.pattern;
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
  // Every pattern once more, causal, GQA, with key lengths (tiles past them are skipped).
  std::vector<TileCase> all = cases;
  for (const auto& pat : every_pattern()) {
    TileCase c{"pattern", 4, 2, 101, 101, 16};
    c.lengths = true;
    c.pattern = pat;
    all.push_back(c);
  }
  for (const TileCase& c : all) {
    const std::string name = std::string(c.name) + (c.pattern ? ": " + c.pattern->describe() : "");
    INFO(name);
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
    std::printf("[cuda] tiled vs simple, %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", name.c_str(), d[0], d[1],
                d[2], d[3], d[4]);
    // Same operations in the same order: equal up to the compiler's choice of fused multiply-adds.
    const double tol = c.dtype == DType::f32 ? 1e-6 : 1e-14;
    for (double x : d) CHECK(x <= tol);
  }
#endif
}

TEST_CASE("CUDA attention with a sparse pattern matches the CPU fused kernel: every pattern, under every other option",
          "[cuda][pattern]") {
  if (!test::cuda_device_present()) return;
  // Several tiles per side, sizes off the tile grid, logits up to ~±40 (q and k scaled by 2.5).
  std::vector<TileCase> shapes = {
      {"causal MHA", 2, 2, 101, 101, 16},
      {"no causal, GQA 4:2", 4, 2, 77, 77, 16, false},
      {"decode-shaped Nq < Nk (q_offset), MQA", 4, 1, 11, 90, 16},
      {"left padding + key lengths", 2, 2, 70, 70, 8, true, 0, true, true},
      {"window 21 + segments + ALiBi", 4, 2, 83, 83, 16, true, 21, false, false, true, true},
      {"dropout 0.15, head dim 40", 2, 1, 66, 66, 40, false, 0, false, false, false, false, 0.15},
  };
  for (const auto& pat : every_pattern())
    for (TileCase c : shapes) {
      c.pattern = pat;
      const std::string name = std::string(c.name) + ": " + pat->describe();
      INFO(name);
      const int64_t B = 2;
      Tensor q = randn({B, c.Hq, c.Nq, c.D}, 80, 0, 0.0, 2.5), k = randn({B, c.Hkv, c.Nk, c.D}, 81, 0, 0.0, 2.5),
             v = randn({B, c.Hkv, c.Nk, c.D}, 82);
      const Tensor dout = randn({B, c.Hq, c.Nq, c.D}, 83);
      attn::AttentionOptions og = options_of(c), o = og;  // og on the device, o on the host
      if (o.key_padding.defined()) o.key_padding = o.key_padding.to(Device::cpu);
      if (o.segment_ids.defined()) o.segment_ids = o.segment_ids.to(Device::cpu);
      std::vector<Tensor> res[2];
      for (int dev = 0; dev < 2; ++dev) {
        Tensor qq = dev ? gpu(q) : q.clone(), kk = dev ? gpu(k) : k.clone(), vv = dev ? gpu(v) : v.clone();
        for (Tensor* t : {&qq, &kk, &vv}) t->set_requires_grad(true);
        const Tensor out = attn::attention(qq, kk, vv, dev ? og : o);
        REQUIRE(out.grad_fn());
        if (dev) CHECK(std::string(out.grad_fn()->name()) == "CudaAttentionBackward");  // not the reference path
        autograd::backward(out, dev ? gpu(dout) : dout);
        res[dev] = {out, qq.grad(), kk.grad(), vv.grad()};
      }
      double d[4];
      for (int t = 0; t < 4; ++t) d[t] = rel_diff(res[1][t], gpu(res[0][t]));
      std::printf("[cuda] sparse vs CPU, %s: out %.1e dq %.1e dk %.1e dv %.1e\n", name.c_str(), d[0], d[1], d[2], d[3]);
      for (double x : d) CHECK(x <= 1e-5);
    }
}

TEST_CASE("CUDA attention with a sparse pattern: fully masked rows are zeros, or the error under fully_masked=error",
          "[cuda][pattern]") {
  if (!test::cuda_device_present()) return;
  const auto pat = every_pattern().back();  // query block 2 (positions 40..59) sees nothing
  attn::AttentionOptions o;
  o.pattern = pat;
  Tensor q = gpu(randn({1, 2, 90, 8}, 90)), k = gpu(randn({1, 2, 90, 8}, 91)), v = gpu(randn({1, 2, 90, 8}, 92));
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  const Tensor out = attn::attention(q, k, v, o);
  autograd::backward(out, gpu(randn({1, 2, 90, 8}, 93)));
  const std::vector<double> o_h = out.to(Device::cpu).to_vector(), dq = q.grad().to(Device::cpu).to_vector();
  int64_t nonfinite = 0, masked_nonzero = 0, open_zero = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 90; ++i) {
      double norm = 0;
      for (int64_t c = 0; c < 8; ++c) {
        const size_t e = static_cast<size_t>((h * 90 + i) * 8 + c);
        nonfinite += !std::isfinite(o_h[e]) || !std::isfinite(dq[e]);
        norm += std::fabs(o_h[e]) + std::fabs(dq[e]);
      }
      if (i >= 40 && i < 60) masked_nonzero += norm != 0;
      else open_zero += norm == 0;
    }
  CHECK(nonfinite == 0);
  CHECK(masked_nonzero == 0);
  CHECK(open_zero == 0);
  o.fully_masked = attn::FullyMasked::error;
  CHECK_THROWS_WITH(attn::attention(q.detach(), k.detach(), v.detach(), o), Catch::Contains("query row 40 of batch 0"));
}

TEST_CASE("CUDA attention with a sparse pattern visits only the non-empty tiles of the brute-force layout",
          "[cuda][pattern]") {
  if (!test::cuda_device_present()) return;
#ifdef QKV_WITH_CUDA
  struct Shape {
    int64_t Nq, Nk, D;
    bool causal;
  };
  for (const auto& pat : every_pattern())
    for (const Shape s : {Shape{200, 200, 16, true}, Shape{150, 150, 64, false}, Shape{9, 130, 16, true}}) {
      INFO(pat->describe() << " Nq=" << s.Nq << " Nk=" << s.Nk << " D=" << s.D << " causal " << s.causal);
      attn::AttentionOptions o;
      o.causal = s.causal;
      o.pattern = pat;
      const Tensor q = gpu(randn({1, 1, s.Nq, s.D}, 1)), k = gpu(randn({1, 1, s.Nk, s.D}, 2));
      const attn::Problem p = attn::check_problem(q, k, k, o);
      const auto plan = attn::cuda_fused::make_plan(o, p);
      // The visibility of every (i, j) by the CPU's mask predicate, tiled by hand.
      const Tensor vis = attn::visibility_mask({1, 1, 1, s.Nq, s.Nk}, o);
      const bool* seen = vis.data<bool>();
      for (const bool by_key : {false, true}) {
        const attn::cuda_fused::TileWalk w = attn::cuda_fused::tile_walk(*plan, by_key);
        REQUIRE(w.tq > 0);
        REQUIRE(w.tk > 0);
        CHECK((by_key ? w.tk : w.tq) == 8);  // the blocks' 8 rows (8 warps)
        int64_t visited = 0, full = 0, total = 0;
        for (int64_t i0 = 0; i0 < s.Nq; i0 += w.tq)
          for (int64_t j0 = 0; j0 < s.Nk; j0 += w.tk) {
            int64_t n = 0, area = 0;
            for (int64_t i = i0; i < std::min(s.Nq, i0 + w.tq); ++i)
              for (int64_t j = j0; j < std::min(s.Nk, j0 + w.tk); ++j, ++area) n += seen[i * s.Nk + j];
            ++total;
            visited += n > 0;
            full += n == area;
          }
        INFO((by_key ? "dK/dV walk" : "forward/dQ walk") << " " << w.tq << "x" << w.tk);
        if (s.Nq == 200)
          std::printf("[cuda] %s, N=200 causal, %s walk %lldx%lld: %lld of %lld tiles visited, %lld full\n",
                      pat->describe().c_str(), by_key ? "dK/dV" : "forward/dQ", static_cast<long long>(w.tq),
                      static_cast<long long>(w.tk), static_cast<long long>(w.visited), static_cast<long long>(w.total),
                      static_cast<long long>(w.full));
        CHECK(w.total == total);
        CHECK(w.visited == visited);
        CHECK(w.full == full);
        // Something is skipped (a strided pattern meets every tile but the causal upper triangle).
        if (pat->kind != attn::Pattern::strided || (s.causal && s.Nq == s.Nk)) CHECK(w.visited < w.total);
      }
    }
#endif
}
