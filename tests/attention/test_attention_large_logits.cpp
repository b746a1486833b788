// The stable softmax where it matters: both CPU attention kernels (fused and reference), forward
// and backward, on logits far past float32's exp overflow (e^88.7), against a naive float64
// formula written here. Every other attention test draws q and k from N(0, 1), so its logits stay
// within a few units and a kernel that forgot to subtract the row maximum (or the fused kernel's
// running maximum and its rescale, attention/cpu/fused_forward.cpp) would pass it.
//
// Two kinds of inputs:
//   * random: q ~ N(0, 30²), k ~ N(0, 4²), D 16, scale 1/4: logits ~ N(0, 120²), hundreds in size;
//   * exact: small integers with scale 1/16 chosen so every float32 logit is exact, about 1000 plus
//     a trend of ±1/16 per key and integer noise: with the trend up, each 64-key tile has a larger
//     row maximum than the one before (the online rescale by exp(m_old − m_new) runs every tile,
//     with factors near e^-4, so a wrong rescale is visible); with it down, the first tile holds it.
// On both, a constant c ∈ {+100, +1000, −1000} added to every logit through the bias input must
// change nothing (softmax is shift-invariant): on the exact inputs the shifted logits are exact
// too, so the forward of both kernels and the reference kernel's gradients are bitwise unchanged;
// the fused backward recomputes P = exp(S − lse) from a float32 lse ≈ 2000, whose rounding
// (ulp 1.2e-4) bounds its agreement instead.
//
// Tolerances, as max|Δ| / max|ref| per tensor (measured worst in brackets): exact inputs 2e-5 for
// out (7e-7) and 2e-4 for the gradients (4e-5); random inputs 3e-4 (4e-5: float32 logits of size
// ~500 carry absolute rounding ~3e-5, which moves P by as much); the fused gradients after a shift
// 5e-4 (1.2e-4: lse ≈ 2013 is stored to ulp 1.2e-4, and P = exp(S − lse) inherits that relative
// error). A kernel without the max subtraction gives e^88 saturation, inf or NaN: errors of order 1.
//
// Mutants (tests/emulation/run_cuda_mutants.sh, section "CPU attention kernels"): the fused
// forward without the max subtraction, the fused backward recomputing P as exp(S)·exp(−lse), and
// the CPU softmax (the reference kernel's) without the max subtraction each fail all three cases
// here and pass every other [attention], [leakcheck] and [gradcheck] case.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "autograd/engine.h"
#include "compare_util.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One attention problem, with every mask held as plain full-size arrays so the naive loop below
// reads them without any of attention/'s code (the mask predicate, the head mapping, MaskPlan).
struct Spec {
  int64_t B = 2, Hq = 4, Hkv = 2, Nq = 0, Nk = 0, D = 16;
  double scale = 0;  // 0 -> 1/sqrt(D)
  bool causal = false;
  int64_t window = 0;
  std::vector<uint8_t> key_valid;    // [B, Nk]
  std::vector<int64_t> key_lengths;  // [B]
  std::vector<int64_t> segment;      // [B, Nk]
  std::vector<uint8_t> allow;        // [B, Hq, Nq, Nk]
  std::vector<double> bias;          // [B, Hq, Nq, Nk]; -inf masks
  std::vector<float> alibi;          // [Hq]
  FullyMasked fully_masked = FullyMasked::zero;
  size_t cells() const { return static_cast<size_t>(B * Hq * Nq * Nk); }
};

struct Inputs {
  std::vector<double> q, k, v, dout;  // every value exactly a float32
};

struct Result {
  std::vector<double> out, dq, dk, dv;
};

Tensor bool_tensor(const std::vector<uint8_t>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::boolean);
  for (size_t e = 0; e < v.size(); ++e) t.data<bool>()[e] = v[e] != 0;
  return t;
}

// The options for `s` with `shift` added to every logit through the bias input.
AttentionOptions options(const Spec& s, Kernel kernel, double shift) {
  AttentionOptions o;
  o.kernel = kernel;
  o.scale = s.scale;
  o.causal = s.causal;
  o.window = s.window;
  o.fully_masked = s.fully_masked;
  if (!s.key_valid.empty()) o.key_padding = bool_tensor(s.key_valid, {s.B, s.Nk});
  o.key_lengths = s.key_lengths;
  if (!s.segment.empty()) o.segment_ids = from_vector_i64(s.segment, {s.B, s.Nk});
  if (!s.allow.empty()) o.allow_mask = bool_tensor(s.allow, {s.B, s.Hq, s.Nq, s.Nk});
  if (!s.bias.empty() || shift != 0) {
    std::vector<double> b = s.bias.empty() ? std::vector<double>(s.cells(), 0.0) : s.bias;
    for (double& x : b) x += shift;
    o.bias = from_vector(b, {s.B, s.Hq, s.Nq, s.Nk}, DType::f32);
  }
  o.alibi_slopes = s.alibi;
  return o;
}

bool visible(const Spec& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t p = s.Nk - s.Nq + i;
  if (s.causal && j > p) return false;
  if (s.window > 0 && (j > p || j <= p - s.window)) return false;
  if (!s.key_valid.empty() && !s.key_valid[static_cast<size_t>(b * s.Nk + j)]) return false;
  if (!s.key_lengths.empty() && j >= s.key_lengths[static_cast<size_t>(b)]) return false;
  if (!s.segment.empty() &&
      s.segment[static_cast<size_t>(b * s.Nk + p)] != s.segment[static_cast<size_t>(b * s.Nk + j)])
    return false;
  if (!s.allow.empty() && !s.allow[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.Nk + j)]) return false;
  return true;
}

// Logit (b, h, i, j) in float64, -inf where masked.
double logit(const Spec& s, const Inputs& in, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!visible(s, b, h, i, j)) return -kInf;
  const int64_t hk = h / (s.Hq / s.Hkv), p = s.Nk - s.Nq + i;
  const double scale = s.scale != 0 ? s.scale : 1 / std::sqrt(static_cast<double>(s.D));
  const double* qi = &in.q[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.D)];
  const double* kj = &in.k[static_cast<size_t>(((b * s.Hkv + hk) * s.Nk + j) * s.D)];
  double dot = 0;
  for (int64_t d = 0; d < s.D; ++d) dot += qi[d] * kj[d];
  double x = scale * dot;
  if (!s.bias.empty()) x += s.bias[static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * s.Nk + j)];
  if (!s.alibi.empty()) x -= static_cast<double>(s.alibi[static_cast<size_t>(h)]) * static_cast<double>(p - j);
  return x;
}

// The textbook formulas in float64 (attention.h): P = softmax(S) with the row max subtracted,
// O = P·V; dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(dO∘O)), dQ = s·dS·K, dK = s·dSᵀ·Q. A row
// with no visible key gives zeros.
Result naive(const Spec& s, const Inputs& in) {
  const int64_t G = s.Hq / s.Hkv, D = s.D;
  const double scale = s.scale != 0 ? s.scale : 1 / std::sqrt(static_cast<double>(D));
  Result r;
  r.out.assign(in.q.size(), 0.0);
  r.dq.assign(in.q.size(), 0.0);
  r.dk.assign(in.k.size(), 0.0);
  r.dv.assign(in.v.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(s.Nk)), dp(static_cast<size_t>(s.Nk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        const int64_t hk = h / G;
        const size_t qrow = static_cast<size_t>(((b * s.Hq + h) * s.Nq + i) * D);
        auto krow = [&](int64_t j) { return static_cast<size_t>(((b * s.Hkv + hk) * s.Nk + j) * D); };
        double mx = -kInf;
        for (int64_t j = 0; j < s.Nk; ++j) mx = std::max(mx, p[static_cast<size_t>(j)] = logit(s, in, b, h, i, j));
        if (mx == -kInf) continue;
        double z = 0;
        for (double& x : p) z += (x = x == -kInf ? 0.0 : std::exp(x - mx));
        for (double& x : p) x /= z;
        double di = 0;
        for (int64_t j = 0; j < s.Nk; ++j) {
          const double pj = p[static_cast<size_t>(j)];
          double dpj = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[qrow + d] += pj * in.v[krow(j) + d];
            r.dv[krow(j) + d] += pj * in.dout[qrow + d];
            dpj += in.dout[qrow + d] * in.v[krow(j) + d];
          }
          dp[static_cast<size_t>(j)] = dpj;
          di += pj * dpj;
        }
        for (int64_t j = 0; j < s.Nk; ++j) {
          const double ds = scale * p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - di);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qrow + d] += ds * in.k[krow(j) + d];
            r.dk[krow(j) + d] += ds * in.q[qrow + d];
          }
        }
      }
  return r;
}

// Forward and backward through attention() in float32.
Result run(const Spec& s, const Inputs& in, Kernel kernel, double shift = 0) {
  Tensor q = from_vector(in.q, {s.B, s.Hq, s.Nq, s.D}).set_requires_grad(true);
  Tensor k = from_vector(in.k, {s.B, s.Hkv, s.Nk, s.D}).set_requires_grad(true);
  Tensor v = from_vector(in.v, {s.B, s.Hkv, s.Nk, s.D}).set_requires_grad(true);
  Tensor out = attention(q, k, v, options(s, kernel, shift));
  autograd::backward(out, from_vector(in.dout, {s.B, s.Hq, s.Nq, s.D}));
  return {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
}

// max|a − b| / max|b| (NaN or inf anywhere: inf).
double rel(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 1e-300;
  for (size_t e = 0; e < a.size(); ++e) {
    const double d = std::fabs(a[e] - b[e]);
    if (!std::isfinite(d)) return kInf;
    num = std::max(num, d);
    den = std::max(den, std::fabs(b[e]));
  }
  return num / den;
}

struct Errors {
  double out = 0, dq = 0, dk = 0, dv = 0;
};
Errors compare(const Result& got, const Result& want) {
  return {rel(got.out, want.out), rel(got.dq, want.dq), rel(got.dk, want.dk), rel(got.dv, want.dv)};
}

const char* kernel_name(Kernel k) { return k == Kernel::fused ? "fused" : "reference"; }

// ---- inputs ----

std::vector<double> normal(int64_t n, uint64_t seed, double std) {
  return randn({n}, seed, 0, 0.0, std, DType::f32).to_vector();
}

Inputs random_inputs(const Spec& s, uint64_t seed) {
  const int64_t nq = s.B * s.Hq * s.Nq * s.D, nk = s.B * s.Hkv * s.Nk * s.D;
  return {normal(nq, seed, 30.0), normal(nk, seed + 1, 4.0), normal(nk, seed + 2, 1.0), normal(nq, seed + 3, 1.0)};
}

// A small integer in [-2, 2] from a hash of (a, b).
double small_int(uint64_t a, uint64_t b) {
  uint64_t x = (a * 0x9e3779b97f4a7c15ULL) ^ (b + 0x632be59bd9b4e9b1ULL);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return static_cast<double>(x % 5) - 2.0;
}

// Exact logits (scale 1/16): q_i = (16000, dir, r…), k_j = (1, j, r'…) so s·q_i·k_j =
// 1000 + dir·j/16 + Σ r r'/16, with |Σ r r'| <= 56: all integers below 2^24 divided by a power of
// two. dir = +1: the row max grows by ~4 per 64-key tile; dir = -1: it falls.
Inputs exact_inputs(Spec& s, double dir, uint64_t seed) {
  s.scale = 1.0 / 16;
  Inputs in;
  in.q.resize(static_cast<size_t>(s.B * s.Hq * s.Nq * s.D));
  in.k.resize(static_cast<size_t>(s.B * s.Hkv * s.Nk * s.D));
  for (size_t r = 0; r < in.q.size() / s.D; ++r)
    for (int64_t d = 0; d < s.D; ++d) in.q[r * s.D + d] = d == 0 ? 16000.0 : d == 1 ? dir : small_int(seed + r, d);
  for (size_t r = 0; r < in.k.size() / s.D; ++r)
    for (int64_t d = 0; d < s.D; ++d)
      in.k[r * s.D + d] = d == 0 ? 1.0 : d == 1 ? static_cast<double>(r % s.Nk) : small_int(~seed - r, d);
  in.v = normal(static_cast<int64_t>(in.k.size()), seed + 2, 1.0);
  in.dout = normal(static_cast<int64_t>(in.q.size()), seed + 3, 1.0);
  return in;
}

// ---- the mask kinds ----

// Sets `kind` on s (sizes already set). Kinds: none, causal, window, key padding, key lengths,
// segments, bool mask, additive mask, alibi, fully masked rows.
void set_mask(Spec& s, const std::string& kind) {
  const size_t bk = static_cast<size_t>(s.B * s.Nk);
  if (kind == "causal") {
    s.causal = true;
  } else if (kind == "window") {
    s.window = 40;
  } else if (kind == "key padding") {
    s.key_valid.assign(bk, 1);
    for (size_t e = 0; e < bk; ++e) s.key_valid[e] = (e % s.Nk) % 5 != 3;
  } else if (kind == "key lengths") {
    s.causal = true;
    s.key_lengths = {s.Nk, s.Nk / 2 + 3};
  } else if (kind == "segments") {
    s.causal = true;
    s.segment.assign(bk, 0);
    for (size_t e = 0; e < bk; ++e) s.segment[e] = static_cast<int64_t>((e % s.Nk) / (e < bk / 2 ? 50 : 90));
  } else if (kind == "bool mask") {  // at least key 0 visible in every row
    s.allow.assign(s.cells(), 1);
    for (size_t e = 0; e < s.cells(); ++e) s.allow[e] = e % s.Nk == 0 || (e * 2654435761u >> 7) % 3 != 0;
  } else if (kind == "additive mask") {  // -inf (never on key 0) and finite offsets up to ±8
    s.bias.assign(s.cells(), 0.0);
    for (size_t e = 0; e < s.cells(); ++e)
      s.bias[e] = e % s.Nk != 0 && (e * 40503u >> 5) % 4 == 0 ? -kInf : small_int(e, 7) * 4;
  } else if (kind == "alibi") {  // powers of two: the exact inputs' logits stay exact
    s.causal = true;
    for (int64_t h = 0; h < s.Hq; ++h) s.alibi.push_back(std::ldexp(1.0f, -static_cast<int>(h) - 1));
  } else if (kind == "fully masked rows") {  // batch 1 left-padded: its first rows see no key
    s.causal = true;
    s.key_valid.assign(bk, 1);
    const int64_t pad = s.Nk - s.Nq + 5;
    for (int64_t j = 0; j < pad; ++j) s.key_valid[static_cast<size_t>(s.Nk + j)] = 0;
  } else {
    REQUIRE(kind == "none");
  }
}

const char* const kMasks[] = {"none",     "causal",    "window",        "key padding", "key lengths",
                              "segments", "bool mask", "additive mask", "alibi",       "fully masked rows"};

struct Layout {
  int64_t Hq, Hkv, Nq, Nk;
};
// GQA 4:2 and MQA 3:1; Nq = Nk = 150 (3 query blocks, 3 key tiles) and Nq = 70 < Nk = 200 (bottom
// right, 4 key tiles).
const Layout kLayouts[] = {{4, 2, 150, 150}, {3, 1, 70, 200}};

// Largest |logit| over visible cells, to show the case is in the overflow regime.
double max_abs_logit(const Spec& s, const Inputs& in) {
  double m = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i)
        for (int64_t j = 0; j < s.Nk; ++j) {
          const double x = logit(s, in, b, h, i, j);
          if (x != -kInf) m = std::max(m, std::fabs(x));
        }
  return m;
}

// Rows of `s` whose running max (over visible keys, tile by tile of 64) rises in a later tile
// than the first that holds a visible key: the online rescale by exp(m_old − m_new) runs on them.
int64_t rows_with_growing_max(const Spec& s, const Inputs& in) {
  int64_t rows = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.Nq; ++i) {
        double m = -kInf;
        int rises = 0;
        for (int64_t j0 = 0; j0 < s.Nk; j0 += 64) {
          double t = -kInf;
          for (int64_t j = j0; j < std::min(s.Nk, j0 + 64); ++j) t = std::max(t, logit(s, in, b, h, i, j));
          if (m != -kInf && t > m) ++rises;
          m = std::max(m, t);
        }
        rows += rises >= 1;
      }
  return rows;
}

// Rows of batch 1 with no visible key: the kernels' output and dq rows there are exactly zero.
void check_fully_masked_rows_zero(const Spec& s, const Inputs& in, const Result& r) {
  int64_t empty = 0;
  double worst = 0;
  for (int64_t h = 0; h < s.Hq; ++h)
    for (int64_t i = 0; i < s.Nq; ++i) {
      bool any = false;
      for (int64_t j = 0; j < s.Nk && !any; ++j) any = logit(s, in, 1, h, i, j) != -kInf;
      if (any) continue;
      ++empty;
      const size_t row = static_cast<size_t>(((s.Hq + h) * s.Nq + i) * s.D);
      for (int64_t d = 0; d < s.D; ++d) worst = std::max({worst, std::fabs(r.out[row + d]), std::fabs(r.dq[row + d])});
    }
  CHECK(empty == 5 * s.Hq);
  CHECK(worst == 0.0);
}

}  // namespace

TEST_CASE("attention with q scaled 30x matches naive float64 forward and backward on every mask",
          "[attention][large_logits]") {
  Errors worst_f, worst_r;
  double smallest_max_logit = kInf;
  uint64_t seed = 100;
  for (const Layout& l : kLayouts)
    for (const char* mask : kMasks) {
      Spec s;
      s.Hq = l.Hq, s.Hkv = l.Hkv, s.Nq = l.Nq, s.Nk = l.Nk;
      set_mask(s, mask);
      const Inputs in = random_inputs(s, seed += 10);
      const Result want = naive(s, in);
      smallest_max_logit = std::min(smallest_max_logit, max_abs_logit(s, in));
      for (Kernel kern : {Kernel::fused, Kernel::reference}) {
        const Result got = run(s, in, kern);
        const Errors e = compare(got, want);
        INFO(kernel_name(kern) << ", " << mask << ", Hq=" << l.Hq << " Hkv=" << l.Hkv << " Nq=" << l.Nq << " Nk="
                               << l.Nk << ": out " << e.out << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
        CHECK(e.out <= 3e-4);
        CHECK(e.dq <= 3e-4);
        CHECK(e.dk <= 3e-4);
        CHECK(e.dv <= 3e-4);
        Errors& w = kern == Kernel::fused ? worst_f : worst_r;
        w = {std::max(w.out, e.out), std::max(w.dq, e.dq), std::max(w.dk, e.dk), std::max(w.dv, e.dv)};
        if (std::string(mask) == "fully masked rows") check_fully_masked_rows_zero(s, in, got);
      }
    }
  // The premise: every case has logits far past exp's float32 overflow at 88.7.
  CHECK(smallest_max_logit > 300);
  std::printf(
      "[large_logits] q x30, max|logit| >= %.0f; worst rel err fused out %.2e dq %.2e dk %.2e dv %.2e; "
      "reference out %.2e dq %.2e dk %.2e dv %.2e\n",
      smallest_max_logit, worst_f.out, worst_f.dq, worst_f.dk, worst_f.dv, worst_r.out, worst_r.dq, worst_r.dk,
      worst_r.dv);
}

TEST_CASE("attention on exact logits near 1000 growing or falling tile to tile matches naive float64",
          "[attention][large_logits][long]") {
  Errors worst;
  for (double dir : {1.0, -1.0})
    for (const Layout& l : kLayouts)
      for (const char* mask : kMasks) {
        Spec s;
        s.Hq = l.Hq, s.Hkv = l.Hkv, s.Nq = l.Nq, s.Nk = l.Nk;
        set_mask(s, mask);
        const Inputs in = exact_inputs(s, dir, 7);
        const Result want = naive(s, in);
        const std::string m = mask;
        // The premise: with the trend up the running max rises from tile to tile (on every row
        // when no mask cuts the keys), with it down (and no ALiBi or bias to turn it) it never does.
        const int64_t growing = rows_with_growing_max(s, in), rows = s.B * s.Hq * s.Nq;
        if (dir > 0) CHECK(growing >= (m == "none" ? rows : 1));
        if (dir < 0 && m == "none") CHECK(growing == 0);
        for (Kernel kern : {Kernel::fused, Kernel::reference}) {
          const Result got = run(s, in, kern);
          const Errors e = compare(got, want);
          INFO(kernel_name(kern) << ", " << mask << ", trend " << dir << ", Hq=" << l.Hq << " Hkv=" << l.Hkv
                                 << " Nq=" << l.Nq << " Nk=" << l.Nk << ": out " << e.out << " dq " << e.dq << " dk "
                                 << e.dk << " dv " << e.dv);
          CHECK(e.out <= 2e-5);
          CHECK(e.dq <= 2e-4);
          CHECK(e.dk <= 2e-4);
          CHECK(e.dv <= 2e-4);
          worst = {std::max(worst.out, e.out), std::max(worst.dq, e.dq), std::max(worst.dk, e.dk),
                   std::max(worst.dv, e.dv)};
          if (m == "fully masked rows") check_fully_masked_rows_zero(s, in, got);
        }
      }
  std::printf("[large_logits] exact logits ~1000: worst rel err out %.2e dq %.2e dk %.2e dv %.2e\n", worst.out,
              worst.dq, worst.dk, worst.dv);
}

TEST_CASE("adding a constant to every logit changes no output or gradient of either kernel",
          "[attention][large_logits][long]") {
  // Exact inputs: the shifted logits are exact, so the forward is bitwise unchanged and so are the
  // reference kernel's gradients; the fused backward reads a float32 lse near 1000 + c.
  double fused_grad_worst = 0, random_worst = 0;
  for (double dir : {1.0, -1.0})
    for (const Layout& l : kLayouts)
      for (const char* mask : kMasks) {
        Spec s;
        s.Hq = l.Hq, s.Hkv = l.Hkv, s.Nq = l.Nq, s.Nk = l.Nk;
        set_mask(s, mask);
        const Inputs in = exact_inputs(s, dir, 11);
        for (Kernel kern : {Kernel::fused, Kernel::reference}) {
          const Result base = run(s, in, kern);
          for (double c : {100.0, 1000.0, -1000.0}) {
            const Result shifted = run(s, in, kern, c);
            const Errors e = compare(shifted, base);
            INFO(kernel_name(kern) << ", " << mask << ", trend " << dir << ", shift " << c << ", Hq=" << l.Hq
                                   << " Nq=" << l.Nq << " Nk=" << l.Nk << ": out " << e.out << " dq " << e.dq << " dk "
                                   << e.dk << " dv " << e.dv);
            CHECK(e.out == 0.0);
            if (kern == Kernel::reference) {
              CHECK(e.dq == 0.0);
              CHECK(e.dk == 0.0);
              CHECK(e.dv == 0.0);
            } else {
              CHECK(e.dq <= 5e-4);
              CHECK(e.dk <= 5e-4);
              CHECK(e.dv <= 5e-4);
              fused_grad_worst = std::max({fused_grad_worst, e.dq, e.dk, e.dv});
            }
          }
        }
      }
  // Random inputs (q x30): the shifted logits round, so to the random cases' tolerance.
  uint64_t seed = 500;
  for (const Layout& l : kLayouts)
    for (const char* mask : {"none", "causal", "additive mask", "alibi", "fully masked rows"}) {
      Spec s;
      s.Hq = l.Hq, s.Hkv = l.Hkv, s.Nq = l.Nq, s.Nk = l.Nk;
      set_mask(s, mask);
      const Inputs in = random_inputs(s, seed += 10);
      for (Kernel kern : {Kernel::fused, Kernel::reference}) {
        const Result base = run(s, in, kern);
        for (double c : {100.0, 1000.0, -1000.0}) {
          const Errors e = compare(run(s, in, kern, c), base);
          INFO(kernel_name(kern) << ", random, " << mask << ", shift " << c << ": out " << e.out << " dq " << e.dq
                                 << " dk " << e.dk << " dv " << e.dv);
          CHECK(e.out <= 3e-4);
          CHECK(e.dq <= 3e-4);
          CHECK(e.dk <= 3e-4);
          CHECK(e.dv <= 3e-4);
          random_worst = std::max({random_worst, e.out, e.dq, e.dk, e.dv});
        }
      }
    }
  std::printf(
      "[large_logits] shift by +100/+1000/-1000: exact inputs: forward and reference gradients bitwise "
      "equal, fused gradients within %.2e; random inputs within %.2e\n",
      fused_grad_worst, random_worst);
}
