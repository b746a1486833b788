// Sparse attention patterns (attention.h, attention/pattern/pattern.h) in the kernels: both kernels'
// forward and backward against a float64 brute force built from the predicate written out again
// from the formulas alone (sparse_cases.h; naive loops, no mask code of the library) over inputs
// spanning several of the kernels' tiles (kTileQ × kTileK, mask.h), and the strided walk. The
// layouts and masks themselves are tested in test_attention_sparse_layout.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "compare_util.h"
#include "sparse_cases.h"
#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

using namespace qkv;
using namespace qkv::attn;
using namespace qkv::test;

namespace {

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// Float64 brute force: naive loops over doc_allows (sparse_cases.h), the causal rule and key padding;
// the dropout multipliers are the documented draw (dropout_scale_mask).
Grads brute(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
            const std::vector<double>& dout, int64_t B, int64_t Hq, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t D,
            const SparsePattern& sp, bool causal, const std::vector<int>& pad, const AttentionOptions& o) {
  const int64_t G = Hq / Hkv, off = Nk - Nq;
  const double sc = 1.0 / std::sqrt(double(D));
  std::vector<double> Z(size_t(B * Hq * Nq * Nk), 1.0);
  if (o.dropout_p > 0) Z = dropout_scale_mask({B, Hq, Hkv, Nq, Nk}, o, DType::f64).to_vector();
  Grads g;
  g.out.assign(size_t(B * Hq * Nq * D), 0);
  g.dq.assign(g.out.size(), 0);
  g.dk.assign(size_t(B * Hkv * Nk * D), 0);
  g.dv.assign(g.dk.size(), 0);
  std::vector<double> P(Nk), dP(Nk);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t p = off + i;
        const double* qi = &q[((b * Hq + h) * Nq + i) * D];
        const double* zi = &Z[((b * Hq + h) * Nq + i) * Nk];
        double mx = -INFINITY;
        std::vector<char> vis(Nk);
        for (int64_t j = 0; j < Nk; ++j) {
          vis[j] = (!causal || j <= p) && (pad.empty() || pad[b * Nk + j]) && doc_allows(sp, Nk, causal, p, j);
          if (!vis[j]) continue;
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += qi[e] * k[((b * Hkv + hk) * Nk + j) * D + e];
          P[j] = s * sc;
          mx = std::max(mx, P[j]);
        }
        if (mx == -INFINITY) continue;  // fully masked: zero output and gradients
        double sum = 0;
        for (int64_t j = 0; j < Nk; ++j) sum += vis[j] ? (P[j] = std::exp(P[j] - mx)) : (P[j] = 0);
        for (int64_t j = 0; j < Nk; ++j) P[j] /= sum;
        double* oi = &g.out[((b * Hq + h) * Nq + i) * D];
        const double* di = &dout[((b * Hq + h) * Nq + i) * D];
        double Di = 0;
        for (int64_t j = 0; j < Nk; ++j) {
          if (!vis[j]) continue;
          double dpj = 0;
          for (int64_t e = 0; e < D; ++e) {
            const double vv = v[((b * Hkv + hk) * Nk + j) * D + e];
            oi[e] += P[j] * zi[j] * vv;
            dpj += di[e] * vv;
            g.dv[((b * Hkv + hk) * Nk + j) * D + e] += P[j] * zi[j] * di[e];
          }
          dP[j] = dpj * zi[j];
          Di += P[j] * dP[j];
        }
        for (int64_t j = 0; j < Nk; ++j) {
          if (!vis[j]) continue;
          const double ds = P[j] * (dP[j] - Di) * sc;
          for (int64_t e = 0; e < D; ++e) {
            g.dq[((b * Hq + h) * Nq + i) * D + e] += ds * k[((b * Hkv + hk) * Nk + j) * D + e];
            g.dk[((b * Hkv + hk) * Nk + j) * D + e] += ds * qi[e];
          }
        }
      }
    }
  return g;
}

double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  REQUIRE(got.size() == want.size());
  for (size_t e = 0; e < got.size(); ++e) {
    num = std::max(num, std::abs(got[e] - want[e]));
    den = std::max(den, std::abs(want[e]));
  }
  return den > 0 ? num / den : num;
}

// Key padding for batches of 2: batch 0 pads its last `tail` keys, batch 1 its first `head` (left
// padding). Fills `pad` (1 = a real key) for the brute force and returns the boolean mask.
Tensor tail_and_head_padding(int64_t Nk, int64_t tail, int64_t head, std::vector<int>& pad) {
  pad.assign(size_t(2 * Nk), 1);
  for (int64_t j = 0; j < Nk; ++j) {
    if (j >= Nk - tail) pad[j] = 0;
    if (j < head) pad[Nk + j] = 0;
  }
  Tensor kp = Tensor::empty({2, Nk}, DType::boolean);
  for (int64_t e = 0; e < 2 * Nk; ++e) kp.data<bool>()[e] = pad[e];
  return kp;
}

// attention(q0, k0, v0, o) and its gradients for upstream g, each within 1e-5 of the brute force.
void check_against_brute(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g,
                         const AttentionOptions& o, const Grads& want) {
  Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
         v = v0.clone().set_requires_grad(true);
  const Tensor out = attention(q, k, v, o);
  autograd::backward(out, g);
  CHECK(rel_err(out.to_vector(), want.out) <= 1e-5);
  CHECK(rel_err(q.grad().to_vector(), want.dq) <= 1e-5);
  CHECK(rel_err(k.grad().to_vector(), want.dk) <= 1e-5);
  CHECK(rel_err(v.grad().to_vector(), want.dv) <= 1e-5);
}

}  // namespace

TEST_CASE("sparse: fused and reference kernels match the float64 brute force, forward and backward",
          "[attention][sparse][slow]") {
  const int64_t B = 2, Nq = 300, Nk = 300, D = 8;
  for (const Case& c : patterns_at_300())
    for (int causal = 0; causal < 2; ++causal)
      for (int gqa = 0; gqa < 2; ++gqa)
        for (int padding = 0; padding < 2; ++padding)
          for (int drop = 0; drop < 2; ++drop) {
            const int64_t Hq = 2, Hkv = gqa ? 1 : 2;
            AttentionOptions o;
            o.causal = causal;
            o.pattern = c.pattern;
            std::vector<int> pad;
            if (padding) o.key_padding = tail_and_head_padding(Nk, 40, 70, pad);
            if (drop) {
              o.dropout_p = 0.2;
              o.dropout_seed = 17;
              o.dropout_offset = 4;
            }
            // Large logits (q scaled by 4) so the stable softmax's max subtraction matters.
            const Tensor q0 = randn({B, Hq, Nq, D}, 100, 0, 0.0, 4.0), k0 = randn({B, Hkv, Nk, D}, 101),
                         v0 = randn({B, Hkv, Nk, D}, 102), g = randn({B, Hq, Nq, D}, 103);
            const Grads want = brute(q0.to_vector(), k0.to_vector(), v0.to_vector(), g.to_vector(), B, Hq, Hkv, Nq, Nk,
                                     D, *c.pattern, causal, pad, o);
            for (Kernel kern : {Kernel::fused, Kernel::reference}) {
              INFO(c.name << (causal ? " causal" : "") << (gqa ? " GQA" : " MHA") << (padding ? " padding" : "")
                          << (drop ? " dropout" : "") << (kern == Kernel::fused ? " fused" : " reference"));
              o.kernel = kern;
              check_against_brute(q0, k0, v0, g, o, want);
            }
          }
}

TEST_CASE("sparse: decode rows (Nq = 1 over a growing cache) equal the full forward's rows", "[attention][sparse]") {
  for (const Case& c : patterns_at_300()) {
    INFO(c.name);
    AttentionOptions o;
    o.causal = true;
    o.pattern = c.pattern;
    if (c.pattern->kind == Pattern::strided && c.pattern->stride == 0) continue;  // auto stride follows Nk
    const int64_t N = 200, D = 8;
    const Tensor q = randn({1, 2, N, D}, 7), k = randn({1, 2, N, D}, 8), v = randn({1, 2, N, D}, 9);
    const auto full = attention(q, k, v, o).to_vector();
    for (int64_t t : {int64_t(0), int64_t(63), int64_t(64), int64_t(150), N - 1}) {
      const Tensor y = attention(q.narrow(2, t, 1), k.narrow(2, 0, t + 1), v.narrow(2, 0, t + 1), o);
      const auto yv = y.to_vector();
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t e = 0; e < D; ++e) CHECK(yv[h * D + e] == Approx(full[(h * N + t) * D + e]).margin(1e-6));
    }
  }
}

namespace {

// Grid tiles (kT × kT) holding at least one visible pair of the first (b, h) slice: what a walk over
// the block layout's grid visits, counted from the mask alone.
int64_t grid_tiles_with_pairs(const AttentionShape& s, const AttentionOptions& o) {
  const Tensor m = visibility_mask(s, o);
  const int64_t nqt = (s.nq + kT - 1) / kT, nkt = (s.nk + kT - 1) / kT;
  std::vector<char> hit(size_t(nqt * nkt), 0);
  for (int64_t i = 0; i < s.nq; ++i)
    for (int64_t j = 0; j < s.nk; ++j)
      if (m.data<bool>()[i * s.nk + j]) hit[(i / kT) * nkt + j / kT] = 1;
  int64_t n = 0;
  for (char c : hit) n += c;
  return n;
}

// Turns the regrouped strided walk off for a scope (the grid walk then runs instead).
struct GridWalkOnly {
  GridWalkOnly() { set_strided_regroup(false); }
  ~GridWalkOnly() { set_strided_regroup(true); }
};

}  // namespace

TEST_CASE("sparse: causal strided takes the regrouped walk, O(N·sqrt(N)) tiles instead of the grid's O(N²)",
          "[attention][sparse]") {
  AttentionOptions o;
  o.causal = true;
  o.pattern = make(Pattern::strided);  // s = l = 64 at N = 4096
  const PatternStats st = pattern_stats({1, 1, 1, 4096, 4096}, o);
  // The walk's tiles are 8 rows tall; visited_tiles is the logits it computes in kT × kT tiles.
  // Band: rows [i0, i0 + 8) compute keys [max(0, i0 - 63), i0 + 8): 8, 16, …, 64 wide for the
  // first eight blocks, 71 for the other 504. Stride: 64 residue groups of 64 rows; rows
  // [n0, n0 + 8) of a group see its keys m <= n0 + 6: 7, 15, …, 63 wide.
  REQUIRE(kWalkQ == 8);
  const int64_t band = 8 * (8 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8) + 71 * 504),
                stride = 64 * 8 * (7 + 15 + 23 + 31 + 39 + 47 + 55 + 63);
  const int64_t area = kT * kT, n4k = 4096 / kT, n1k = 1024 / kT;
  CHECK(st.visited_tiles == (band + stride + area - 1) / area);  // 422 of 32×32, the grid's 8256
  CHECK(st.full_tiles == 0);
  CHECK(st.total_tiles == n4k * n4k);
  // The grid would visit every tile on or below the diagonal: each holds a stride column.
  CHECK(grid_tiles_with_pairs({1, 1, 1, 1024, 1024}, o) == n1k * (n1k + 1) / 2);
  // At N = 1024 (s = l = 32): band blocks 8, 16, 24, 32, then 124 × 39 keys wide; 32 groups of 32
  // rows whose four row blocks see 7, 15, 23 and 31 keys.
  CHECK(pattern_stats({1, 1, 1, 1024, 1024}, o).visited_tiles ==
        (8 * (8 + 16 + 24 + 32) + 8 * 39 * 124 + 32 * 8 * (7 + 15 + 23 + 31) + area - 1) / area);
  // Several tiles per group: s = 10, l = 25 at N = 1303 gives 10 groups of 130 or 131 rows
  // (3 row blocks); the walk must stay far below the grid's count.
  o.pattern = make(Pattern::strided, [](SparsePattern& p) {
    p.stride = 10;
    p.local = 25;
  });
  const int64_t grid = grid_tiles_with_pairs({1, 1, 1, 1303, 1303}, o);
  const int64_t walk = pattern_stats({1, 1, 1, 1303, 1303}, o).visited_tiles;
  const int64_t n1303 = (1303 + kT - 1) / kT;
  CHECK(grid == n1303 * (n1303 + 1) / 2);
  CHECK(walk < grid / 2);
  // Non-causal strided keeps the grid walk (the regrouped one is for causal rules only).
  o.causal = false;
  CHECK(pattern_stats({1, 1, 1, 1303, 1303}, o).visited_tiles == grid_tiles_with_pairs({1, 1, 1, 1303, 1303}, o));
}

TEST_CASE("sparse: the regrouped strided walk matches the float64 brute force (many groups, several tiles each)",
          "[attention][sparse][slow]") {
  const int64_t B = 2, Nk = 1303, D = 8;
  const std::vector<Case> cases = {
      {"strided s=10 l=25", make(Pattern::strided,
                                 [](SparsePattern& p) {
                                   p.stride = 10;
                                   p.local = 25;
                                 })},
      {"strided s=30 l=7", make(Pattern::strided,
                                [](SparsePattern& p) {
                                  p.stride = 30;
                                  p.local = 7;
                                })},
      {"strided auto (s=l=37)", make(Pattern::strided)},
  };
  for (const Case& c : cases)
    for (int64_t Nq : {Nk, int64_t(333)})  // 333: q_offset = 970, not a multiple of s or 64
      for (int gqa = 0; gqa < 2; ++gqa)
        for (int padding = 0; padding < 2; ++padding)
          for (int drop = 0; drop < 2; ++drop) {
            if (Nq != Nk && (gqa || padding)) continue;  // keep the case count down
            const int64_t Hq = 2, Hkv = gqa ? 1 : 2;
            AttentionOptions o;
            o.causal = true;
            o.pattern = c.pattern;
            REQUIRE(pattern_stats({B, Hq, Hkv, Nq, Nk}, o).visited_tiles <
                    grid_tiles_with_pairs({1, 1, 1, Nq, Nk}, o));  // the walk is taken
            std::vector<int> pad;
            if (padding) o.key_padding = tail_and_head_padding(Nk, 101, 90, pad);
            if (drop) {
              o.dropout_p = 0.2;
              o.dropout_seed = 23;
              o.dropout_offset = 9;
            }
            const Tensor q0 = randn({B, Hq, Nq, D}, 200, 0, 0.0, 4.0), k0 = randn({B, Hkv, Nk, D}, 201),
                         v0 = randn({B, Hkv, Nk, D}, 202), g = randn({B, Hq, Nq, D}, 203);
            const Grads want = brute(q0.to_vector(), k0.to_vector(), v0.to_vector(), g.to_vector(), B, Hq, Hkv, Nq, Nk,
                                     D, *c.pattern, true, pad, o);
            INFO(c.name << " Nq " << Nq << (gqa ? " GQA" : " MHA") << (padding ? " padding" : "")
                        << (drop ? " dropout" : ""));
            check_against_brute(q0, k0, v0, g, o, want);
          }
}

TEST_CASE("sparse: the strided walk's dot products cover each row group's kept keys and skip the rest",
          "[attention][sparse]") {
  // s = l = 64 at N = 4096. A band block of 8 rows sees keys [i0 − 63, i0 + 8): 71 columns, of
  // which rows 0-3 keep [0, 67) and rows 4-7 keep [4, 71). A residue group's rows n0..n0+7 keep
  // m < n0 + 1 + r: rows 0-3 the first n0 + 4 keys of the tile's n0 + 8.
  const Tensor q = randn({1, 1, 4096, 8}, 1);
  AttentionOptions o;
  o.causal = true;
  o.pattern = make(Pattern::strided);
  const Problem p = check_problem(q, q, q, o);
  const MaskPlan plan(p.shape(), o, p.dtype);
  REQUIRE(plan.layout().regrouped);
  const StridedWalk& w = plan.layout().walk;
  const WalkRows band(plan, w, 0, StridedTile{800, 1, 8, 800 - 63, 1, 71, true});
  CHECK((band.a[0] == 0 && band.e[0] == 67 && band.a[1] == 4 && band.e[1] == 71));
  for (int64_t r = 0; r < 8; ++r) CHECK((band.ca[r] == r && band.ce[r] == 64 + r));
  // Residue group 5, rows n = 16..23 (i = 5 + 64·n), keys m < 23 (j = 5 + 64·m): row n keeps m <= n − 1.
  const WalkRows group(plan, w, 0, StridedTile{5 + 64 * 16, 64, 8, 5, 64, 23, false});
  CHECK((group.a[0] == 0 && group.e[0] == 19 && group.a[1] == 0 && group.e[1] == 23));
  for (int64_t r = 0; r < 8; ++r) CHECK((group.ca[r] == 0 && group.ce[r] == 16 + r));
}

TEST_CASE("sparse: the strided walk and a causal window band-only walk agree with the grid under every mask",
          "[attention][sparse][long]") {
  // float64, so both walks (different summation orders) agree to ~1e-12 and any masking
  // difference shows. Window, key_lengths, segments, ALiBi, a bias, GQA, dropout, q_offset > 0,
  // fewer query rows than the stride.
  // s = 3, l = 260 at Nk = 1000: the band (l + kWalkQ − 1 keys) and each residue group (~Nk/3
  // keys) are wider than one walk tile, so both are split into key tiles (plain and key_lengths +
  // dropout only). A causal window, the pattern's or the sliding window (AttentionOptions::window
  // without a pattern), walks the band alone, its forward in chunks of kWalkChunkRows rows
  // (Nq = 700, 1000: several chunks, the last one partial).
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 8;
  const auto narrow = make(Pattern::strided, [](SparsePattern& p) {
    p.stride = 9;
    p.local = 12;
  });
  const auto wide = make(Pattern::strided, [](SparsePattern& p) {
    p.stride = 3;
    p.local = 260;
  });
  const auto narrow_window = make(Pattern::window, [](SparsePattern& p) { p.local = 12; });
  const auto wide_window = make(Pattern::window, [](SparsePattern& p) { p.local = 260; });
  const auto none = make(Pattern::full);  // with AttentionOptions::window: the sliding window
  REQUIRE(260 + kWalkQ - 1 > kWalkK);
  REQUIRE(1000 / 3 > kWalkK);
  REQUIRE(700 % kWalkChunkRows != 0);
  struct Walked {
    std::shared_ptr<const SparsePattern> pattern;
    int64_t window, Nk;  // window: the structural one (0: none)
    bool wide;
  };
  for (const Walked& c :
       {Walked{narrow, 0, 700, false}, Walked{wide, 0, 1000, true}, Walked{narrow_window, 0, 700, false},
        Walked{wide_window, 0, 1000, true}, Walked{none, 12, 700, false}, Walked{none, 260, 1000, true}}) {
    const auto& pattern = c.pattern;
    const int64_t Nk = c.Nk;
    Tensor seg = Tensor::empty({B, Nk}, DType::i64);
    for (int64_t j = 0; j < Nk; ++j) {
      seg.data<int64_t>()[j] = j < 250 ? 0 : 1;
      seg.data<int64_t>()[Nk + j] = j / 300;
    }
    for (int variant = 0; variant < 6; ++variant)
      for (int64_t Nq : {Nk, int64_t(130), int64_t(5)}) {  // 5 < s = 9: residues without rows, so keys no group holds
        if (c.wide && (Nq == 5 || (variant != 0 && variant != 2))) continue;
        if (c.window > 0 && variant == 1) continue;  // the sliding window is already set
        AttentionOptions o;
        o.causal = true;
        o.pattern = pattern;
        o.window = c.window;
        std::string what;
        switch (variant) {
          case 0:
            what = "plain";
            break;
          case 1:
            what = "window 300";
            o.window = 300;
            break;
          case 2:
            what = "key_lengths + dropout";
            o.key_lengths = {700, 411};
            o.dropout_p = 0.3;
            o.dropout_seed = 5;
            break;
          case 3:
            what = "segments";
            o.segment_ids = seg;
            break;
          case 4:
            what = "alibi + bias";
            o.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
            o.bias = randn({Nq, Nk}, 55).to(DType::f64);
            break;
          case 5:
            what = "allow_mask";
            o.allow_mask = Tensor::empty({B, 1, Nq, Nk}, DType::boolean);
            for (int64_t e = 0; e < B * Nq * Nk; ++e) o.allow_mask.data<bool>()[e] = (e * 2654435761u) % 7 != 0;
            break;
        }
        INFO(pattern_name(pattern->kind) << " " << what << " Nq " << Nq << " s " << pattern->stride << " l "
                                         << pattern->local << " window " << o.window);
        const AttentionShape shape{B, Hq, Hkv, Nq, Nk};
        REQUIRE(block_layout(*pattern, mask_rules(shape, o), Nq, Nk, kT, kT)->regrouped);  // the walk runs
        AttentionOptions structural;  // the grid walk visits the layout's tiles: pattern and structural rules
        structural.causal = true;
        structural.window = o.window;
        structural.pattern = pattern;
        const int64_t walked = pattern_stats(shape, o).visited_tiles,
                      grid = grid_tiles_with_pairs({1, 1, 1, Nq, Nk}, structural);
        // Strided's walk computes fewer tiles' worth of logits than the grid visits; a window's
        // band at most as many (both round a 5-row call up to one tile).
        if (pattern->kind == Pattern::strided) CHECK(walked < grid);
        else CHECK(walked <= grid);
        const Tensor q0 = randn({B, Hq, Nq, D}, 300, 0, 0.0, 4.0).to(DType::f64),
                     k0 = randn({B, Hkv, Nk, D}, 301).to(DType::f64), v0 = randn({B, Hkv, Nk, D}, 302).to(DType::f64),
                     g = randn({B, Hq, Nq, D}, 303).to(DType::f64);
        std::vector<std::vector<double>> got[3];
        for (int path = 0; path < 3; ++path) {  // regrouped, grid, reference kernel
          std::unique_ptr<GridWalkOnly> grid_only;
          if (path == 1) grid_only = std::make_unique<GridWalkOnly>();
          o.kernel = path == 2 ? Kernel::reference : Kernel::fused;
          Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
                 v = v0.clone().set_requires_grad(true);
          const Tensor out = attention(q, k, v, o);
          autograd::backward(out, g);
          got[path] = {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
        }
        for (int e = 0; e < 4; ++e) {
          CHECK(rel_err(got[0][e], got[1][e]) <= 1e-10);
          CHECK(rel_err(got[0][e], got[2][e]) <= 1e-10);
        }
      }
  }
}

TEST_CASE("sparse: bigbird's random blocks are a function of (seed, block) only", "[attention][sparse]") {
  SparsePattern p;
  p.kind = Pattern::bigbird;
  p.block_size = 4;
  p.random_blocks = 3;
  p.seed = 42;
  const PatternPredicate a(p, 64, true), b(p, 400, true);
  for (int64_t qb = 0; qb < 16; ++qb)
    for (int64_t k = 0; k < 3; ++k) {
      CHECK(a.random_block(qb, k) == b.random_block(qb, k));  // causal: independent of Nk (decode)
      CHECK(a.random_block(qb, k) <= qb);                     // and drawn from the past
    }
  p.seed = 43;
  const PatternPredicate c(p, 64, true);
  int differ = 0;
  for (int64_t qb = 4; qb < 16; ++qb) differ += c.random_block(qb, 0) != a.random_block(qb, 0);
  CHECK(differ > 3);
}

TEST_CASE("sparse: on the GPU a pattern gives the CPU kernel's values (the tiled CUDA kernels walk its layout)",
          "[attention][sparse][cuda]") {
  if (!test::cuda_device_present()) return;
  for (const Case& c : patterns_at_300())
    for (int causal = 0; causal < 2; ++causal) {
      INFO(c.name << " causal " << causal);
      AttentionOptions o;
      o.causal = causal;
      o.pattern = c.pattern;
      Tensor q = randn({1, 2, 300, 8}, 5, 0, 0.0, 3.0), k = randn({1, 1, 300, 8}, 6), v = randn({1, 1, 300, 8}, 7);
      const Tensor g = randn({1, 2, 300, 8}, 8);
      std::vector<std::vector<double>> res[2];
      for (int dev = 0; dev < 2; ++dev) {
        const Device d = dev ? Device::cuda : Device::cpu;
        Tensor qq = q.to(d).set_requires_grad(true), kk = k.to(d).set_requires_grad(true),
               vv = v.to(d).set_requires_grad(true);
        const Tensor out = attention(qq, kk, vv, o);
        autograd::backward(out, g.to(d));
        res[dev] = {out.to(Device::cpu).to_vector(), qq.grad().to(Device::cpu).to_vector(),
                    kk.grad().to(Device::cpu).to_vector(), vv.grad().to(Device::cpu).to_vector()};
      }
      for (int t = 0; t < 4; ++t) CHECK(rel_err(res[1][t], res[0][t]) <= 1e-5);
    }
}

TEST_CASE("sparse: full tiles cut by key_lengths or an elementwise mask are still masked (fused = reference)",
          "[attention][sparse]") {
  // window l=200 and block_sparse bs=64 have full kernel tiles; key_lengths ends inside one, and
  // segment ids split them, so the fused kernel must not take the no-mask path there.
  for (auto pat : {make(Pattern::window, [](SparsePattern& p) { p.local = 200; }),
                   make(Pattern::block_sparse, [](SparsePattern& p) { p.block_size = 64; })}) {
    REQUIRE(pattern_stats({1, 1, 1, 300, 300},
                          [&] {
                            AttentionOptions o;
                            o.pattern = pat;
                            return o;
                          }())
                .full_tiles > 0);
    for (int variant = 0; variant < 2; ++variant) {
      INFO(pat->describe() << " variant " << variant);
      AttentionOptions o;
      o.causal = true;
      o.pattern = pat;
      if (variant == 0) {
        o.key_lengths = {300, 230};
      } else {
        Tensor seg = Tensor::empty({2, 300}, DType::i64);
        for (int64_t e = 0; e < 600; ++e) seg.data<int64_t>()[e] = (e % 300) < 100 + 37 * (e / 300) ? 0 : 1;
        o.segment_ids = seg;
      }
      const Tensor q0 = randn({2, 2, 300, 4}, 31, 0, 0.0, 1.0, DType::f64),
                   k0 = randn({2, 2, 300, 4}, 32, 0, 0.0, 1.0, DType::f64),
                   v0 = randn({2, 2, 300, 4}, 33, 0, 0.0, 1.0, DType::f64),
                   g = randn({2, 2, 300, 4}, 34, 0, 0.0, 1.0, DType::f64);
      std::vector<std::vector<double>> res[2];
      for (int kern = 0; kern < 2; ++kern) {
        o.kernel = kern ? Kernel::reference : Kernel::fused;
        Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
               v = v0.clone().set_requires_grad(true);
        const Tensor out = attention(q, k, v, o);
        autograd::backward(out, g);
        res[kern] = {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
      }
      for (int t = 0; t < 4; ++t) CHECK(rel_err(res[0][t], res[1][t]) <= 1e-12);
    }
  }
}
