// Attention semantics as attention.h states them: the worked examples, the mask rules,
// fully masked rows, bad input, runtime invariants and the planted faults.
#include <catch2/catch.hpp>

#include <cmath>

#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "attention/cpu/reference.h"
#include "autograd/engine.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

Tensor t64(const std::vector<double>& v, const Shape& s) { return from_vector(v, s, DType::f64); }

Tensor bools(const std::vector<int>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::boolean);
  for (size_t e = 0; e < v.size(); ++e) t.data<bool>()[e] = v[e] != 0;
  return t;
}

void check_values(const Tensor& t, const std::vector<double>& want, double margin) {
  const auto got = t.to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t e = 0; e < want.size(); ++e) CHECK(got[e] == Approx(want[e]).margin(margin));
}

// The 2x2 worked example: Q = K = I2, V = [[10, 0], [0, 20]], D = 2, with figures worked by hand.
struct WorkedExample {
  Tensor q = t64({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor k = t64({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor v = t64({10, 0, 0, 20}, {1, 1, 2, 2});
};

// Explicit rules for `o` at shape `s`, changed by `edit` (tests build wrong ones on purpose).
template <class Edit>
std::shared_ptr<const MaskRules> rules_for(const AttentionShape& s, const AttentionOptions& o, Edit edit) {
  MaskRules r = mask_rules(s, o);
  edit(r);
  return std::make_shared<const MaskRules>(r);
}

}  // namespace

// The hand-worked output reads [[6.6976, 6.6041], [3.302, 13.3959]], but its own weights give
// 20·0.330238 = 6.6048 and 20·0.669762 = 13.3952 (and 10·0.330238 = 3.3024): the second column is
// off by 7e-4 there. We assert the exact closed form w = 1/(1 + e^(1/√2)) to 1e-9, and the
// hand-worked figures to the precision they are actually right to.
TEST_CASE("the 2x2 worked example gives the hand-worked weights and output", "[attention]") {
  WorkedExample ex;
  const double w = 1.0 / (1.0 + std::exp(1.0 / std::sqrt(2.0)));  // 0.330238
  const std::vector<double> exact = {10 * (1 - w), 20 * w, 10 * w, 20 * (1 - w)};
  const AttentionWeights r = attention_with_weights(ex.q, ex.k, ex.v);
  check_values(r.weights, {0.6698, 0.3302, 0.3302, 0.6698}, 5e-5);  // by hand, to 4 decimals
  check_values(r.out, {6.6976, 6.6041, 3.302, 13.3959}, 1e-3);      // the hand-worked output
  check_values(r.out, exact, 1e-9);
  CHECK(r.fully_masked_rows == 0);
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    AttentionOptions o;
    o.kernel = kern;
    check_values(attention(ex.q, ex.k, ex.v, o), exact, 1e-9);
    check_values(attention(ex.q.to(DType::f32), ex.k.to(DType::f32), ex.v.to(DType::f32), o), exact, 1e-5);
  }
}

TEST_CASE("the 2x2 causal example: the first query reads only itself", "[attention]") {
  WorkedExample ex;
  AttentionOptions o;
  o.causal = true;
  const AttentionWeights r = attention_with_weights(ex.q, ex.k, ex.v, o);
  const double w = 1.0 / (1.0 + std::exp(1.0 / std::sqrt(2.0)));
  check_values(r.weights, {1, 0, 0.3302, 0.6698}, 5e-5);
  CHECK(r.weights.at({0, 0, 0, 1}) == 0.0);            // exactly zero, not just small
  check_values(r.out, {10, 0, 3.302, 13.3959}, 1e-3);  // the hand-worked output (see above)
  check_values(r.out, {10, 0, 10 * w, 20 * (1 - w)}, 1e-9);
  o.kernel = Kernel::fused;
  check_values(attention(ex.q, ex.k, ex.v, o), {10, 0, 10 * w, 20 * (1 - w)}, 1e-9);
}

TEST_CASE("softmax then multiplying by the mask is not a distribution; masking the logits first is", "[attention]") {
  // One query, D = 1, scale 1: logits S = q·k = [1, 2]; the mask hides the second key.
  const Tensor q = t64({1}, {1, 1, 1, 1}), k = t64({1, 2}, {1, 1, 2, 1}), v = t64({3, 5}, {1, 1, 2, 1});
  AttentionOptions o;
  o.scale = 1;
  o.allow_mask = bools({1, 0}, {1, 2});
  const AttentionWeights right = attention_with_weights(q, k, v, o);
  check_values(right.weights, {1, 0}, 1e-12);
  {
    AttentionOptions unmasked = o;
    unmasked.allow_mask = Tensor();
    const Tensor bad =
        mul(attention_with_weights(q, k, v, unmasked).weights, visibility_mask({1, 1, 1, 1, 2}, o).to(DType::f64));
    check_values(bad, {0.2689, 0}, 5e-5);  // softmax([1,2]) = [0.269, 0.731], times [1, 0]
    const auto w = bad.to_vector();
    CHECK(w[0] + w[1] == Approx(0.2689).margin(5e-5));  // sums to 0.269: not a distribution
  }
  CHECK(attention(q, k, v, o).item() == Approx(3.0));  // the fused kernel reads only the visible key
}

TEST_CASE("scaling by 1/sqrt(d) keeps the logits' standard deviation near 1", "[attention]") {
  for (int64_t d : {16, 64, 256}) {
    const int64_t n = 256;
    const Tensor q = randn({1, 1, n, d}, 11 + d, 0, 0.0, 1.0, DType::f64);
    const Tensor k = randn({1, 1, n, d}, 12 + d, 0, 0.0, 1.0, DType::f64);
    const std::vector<double> s = matmul(q, k.transpose(2, 3)).to_vector();
    double m = 0, m2 = 0;
    for (double x : s) m += x;
    m /= s.size();
    for (double x : s) m2 += (x - m) * (x - m);
    const double sd = std::sqrt(m2 / s.size());
    INFO("d = " << d << ": unscaled logit std " << sd << ", scaled " << sd / std::sqrt(double(d)));
    CHECK(sd == Approx(std::sqrt(double(d))).epsilon(0.05));
    CHECK(sd / std::sqrt(double(d)) == Approx(1.0).epsilon(0.05));
    // And attention's default scale is exactly that 1/sqrt(d).
    const Tensor v = randn({1, 1, n, 4}, 13 + d, 0, 0.0, 1.0, DType::f64);
    AttentionOptions explicit_scale;
    explicit_scale.scale = 1.0 / std::sqrt(double(d));
    CHECK(max_abs_diff(attention(q, k, v), attention(q, k, v, explicit_scale)) == 0.0);
  }
}

TEST_CASE("causal alignment is bottom-right when there are fewer queries than keys", "[attention]") {
  const AttentionShape s{1, 1, 1, 2, 4};
  AttentionOptions o;
  o.causal = true;
  // Query i sits at position Nk - Nq + i = 2 + i.
  check_values(visibility_mask(s, o).to(DType::f64), {1, 1, 1, 0, 1, 1, 1, 1}, 0);
  o.window = 2;  // keys pos-1 .. pos
  check_values(visibility_mask(s, o).to(DType::f64), {0, 1, 1, 0, 0, 0, 1, 1}, 0);
  o.window = 0;
  check_values(visibility_mask(s, o).to(DType::f64), {1, 1, 1, 0, 1, 1, 1, 1}, 0);
  o.rules = rules_for(s, o, [](MaskRules& r) { r.q_offset = 0; });  // the top-left bug: query i at position i
  check_values(visibility_mask(s, o).to(DType::f64), {1, 0, 0, 0, 1, 1, 0, 0}, 0);
}

TEST_CASE("every mask kind combines by AND exactly as the documented predicate", "[attention]") {
  const int64_t B = 2, H = 2, Nq = 5, Nk = 7;
  AttentionOptions o;
  o.causal = true;
  o.window = 4;
  const std::vector<int> pad = {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
  o.key_padding = bools(pad, {B, Nk});
  o.key_lengths = {7, 6};
  o.segment_ids = from_vector_i64({0, 0, 0, 1, 1, 1, 1, 5, 5, 5, 5, 6, 6, 6}, {B, Nk});
  std::vector<int> allow(H * Nq * Nk);
  for (size_t e = 0; e < allow.size(); ++e) allow[e] = (e * 7 + 3) % 5 != 0;
  o.allow_mask = bools(allow, {1, H, Nq, Nk});
  const Tensor m = visibility_mask({B, H, H, Nq, Nk}, o);
  const auto seg = o.segment_ids.to_vector();
  int64_t visible = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i)
        for (int64_t j = 0; j < Nk; ++j) {
          const int64_t p = Nk - Nq + i;
          const bool want = j <= p && j > p - 4 && pad[b * Nk + j] && j < (b == 0 ? 7 : 6) &&
                            seg[b * Nk + p] == seg[b * Nk + j] && allow[(h * Nq + i) * Nk + j];
          CHECK(m.at({b, h, i, j}) == double(want));
          visible += want;
        }
  CHECK(visible > 10);  // the case is not vacuous
}

TEST_CASE("a fully masked row gives a zero output, -inf lse and zero gradients, never NaN", "[attention]") {
  // Left padding: batch 1's first 3 keys are padding, so its first 3 causal rows see nothing.
  const int64_t B = 2, H = 2, N = 6, D = 4;
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    Tensor q = randn({B, H, N, D}, 1, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
    Tensor k = randn({B, H, N, D}, 2, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
    Tensor v = randn({B, H, N, D}, 3, 0, 0.0, 1.0, DType::f64).set_requires_grad(true);
    AttentionOptions o;
    o.kernel = kern;
    o.causal = true;
    o.key_padding = bools({1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1}, {B, N});
    CHECK(count_fully_masked_rows({B, H, H, N, N}, o) == H * 3);
    Tensor out = attention(q, k, v, o);
    autograd::backward(out, ones(out.shape(), DType::f64));
    CHECK(all_finite(out));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t d = 0; d < D; ++d) {
          CHECK(out.at({1, h, i, d}) == 0.0);
          CHECK(q.grad().at({1, h, i, d}) == 0.0);
        }
    CHECK(all_finite(q.grad()));
    CHECK(all_finite(k.grad()));
    CHECK(all_finite(v.grad()));
    // Padded keys receive no gradient: nobody may read them.
    for (int64_t j = 0; j < 3; ++j) CHECK(v.grad().at({1, 0, j, 0}) == 0.0);
  }
  // The fused kernel's saved lse is -inf exactly on those rows.
  const Tensor q = randn({B, H, N, D}, 1), k = randn({B, H, N, D}, 2), v = randn({B, H, N, D}, 3);
  AttentionOptions o;
  o.causal = true;
  o.key_padding = bools({1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1}, {B, N});
  const Problem p = check_problem(q, k, v, o);
  const MaskPlan plan(p.shape(), o, p.dtype);
  const FusedForward f = fused_attention_forward(q, k, v, p, plan, DropoutDraw(o, H), FullyMasked::zero);
  CHECK(f.fully_masked_rows == H * 3);
  CHECK(std::isinf(f.lse.at({1, 1, 2})));
  CHECK(f.lse.at({1, 1, 2}) < 0);
  CHECK(std::isfinite(f.lse.at({1, 1, 3})));
}

TEST_CASE("fully_masked = error names the batch, head and row", "[attention]") {
  const Tensor q = randn({2, 2, 3, 4}, 1), k = randn({2, 1, 3, 4}, 2), v = randn({2, 1, 3, 4}, 3);
  AttentionOptions o;
  o.causal = true;
  o.key_lengths = {3, 0};  // batch 1 has no keys at all
  o.fully_masked = FullyMasked::error;
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    o.kernel = kern;
    CHECK_THROWS_WITH(attention(q, k, v, o), Catch::Contains("query row 0 of batch 1, head 0"));
  }
  o.key_lengths = {3, 1};
  CHECK_NOTHROW(attention(q, k, v, o));
}

TEST_CASE("bad attention input throws an error naming the shapes", "[attention]") {
  const Tensor q = randn({1, 4, 3, 8}, 1), k = randn({1, 2, 5, 8}, 2), v = randn({1, 2, 5, 6}, 3);
  CHECK_NOTHROW(attention(q, k, v));
  CHECK_THROWS_WITH(attention(q, randn({1, 2, 5, 7}, 4), v),
                    Catch::Contains("head dims differ") && Catch::Contains("k [1,2,5,7]"));
  CHECK_THROWS_WITH(attention(q, k, randn({1, 2, 4, 6}, 5)), Catch::Contains("Nk=5") && Catch::Contains("v [1,2,4,6]"));
  CHECK_THROWS_WITH(attention(randn({1, 3, 3, 8}, 6), k, v),
                    Catch::Contains("Hq=3") && Catch::Contains("Hkv=2") && Catch::Contains("q [1,3,3,8]"));
  AttentionOptions o;
  o.allow_mask = bools(std::vector<int>(12, 1), {3, 4});
  CHECK_THROWS_WITH(attention(q, k, v, o), Catch::Contains("allow_mask [3,4]") && Catch::Contains("[1,4,3,5]"));
  AttentionOptions kp;
  kp.key_padding = bools(std::vector<int>(4, 1), {1, 4});
  CHECK_THROWS_WITH(attention(q, k, v, kp), Catch::Contains("key_padding is [1,4]") && Catch::Contains("[1,5]"));
  AttentionOptions bias;
  bias.bias = randn({2, 4, 3, 5}, 7);
  CHECK_THROWS_WITH(attention(q, k, v, bias), Catch::Contains("bias [2,4,3,5]"));
  CHECK_THROWS_AS(attention(q.to(DType::f64), k, v), Error);
}

TEST_CASE("check_invariants passes correct kernels and catches a broken one", "[attention]") {
  const Tensor q = randn({2, 4, 9, 8}, 1), k = randn({2, 2, 11, 8}, 2), v = randn({2, 2, 11, 8}, 3);
  AttentionOptions o;
  o.causal = true;
  o.key_lengths = {11, 4};
  o.bias = randn({1, 4, 9, 11}, 5);
  o.check_invariants = true;
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    o.kernel = kern;
    CHECK_NOTHROW(attention(q, k, v, o));
    o.dropout_p = 0.2;
    CHECK_NOTHROW(attention(q, k, v, o));
    o.dropout_p = 0;
  }
  // A broken reference kernel: its weights handed to the checker it runs under check_invariants.
  o.check_invariants = false;
  const Problem p = check_problem(q, k, v, o);
  const MaskPlan plan(p.shape(), o, p.dtype);
  const AttentionWeights right = attention_with_weights(q, k, v, o);
  CHECK_NOTHROW(check_reference_invariants(right, p, plan));
  AttentionOptions unmasked = o;
  unmasked.causal = false;
  unmasked.key_lengths.clear();
  const Tensor all_keys = attention_with_weights(q, k, v, unmasked).weights;  // softmax over every key
  const Tensor vis = visibility_mask(p.shape(), o);
  AttentionWeights bad = right;
  bad.weights = mul(all_keys, vis.to(DType::f32));  // mask after softmax
  CHECK_THROWS_WITH(check_reference_invariants(bad, p, plan),
                    Catch::Contains("invariant violated") && Catch::Contains("sum to"));
  bad.weights = mul(softmax(masked_fill(log(all_keys), logical_not(vis), -1e30), -2), vis.to(DType::f32));
  CHECK_THROWS_WITH(check_reference_invariants(bad, p, plan), Catch::Contains("invariant violated"));  // over queries
}

TEST_CASE("wrong mask rules reach both kernels and change what a query can read", "[attention]") {
  const int64_t B = 2, Hq = 4, Hkv = 2, Nq = 4, N = 6, D = 4;  // Nq < Nk: bottom-right matters
  const Tensor q = randn({B, Hq, Nq, D}, 1), k = randn({B, Hkv, N, D}, 2), v = randn({B, Hkv, N, D}, 3);
  AttentionOptions o;
  o.causal = true;
  o.window = 3;
  o.key_padding = bools({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {B, N});
  AttentionOptions r = o;
  r.kernel = Kernel::reference;
  const Tensor clean = attention(q, k, v, o);
  const AttentionShape s{B, Hq, Hkv, Nq, N};
  struct Wrong {
    const char* name;
    std::shared_ptr<const MaskRules> rules;
  };
  const Wrong wrong[] = {
      {"causal reversed (j >= pos)",
       rules_for(s, o, [](MaskRules& m) { m.has_hi = false, m.has_lo = true, m.lo = 0; })},
      {"top-left causal", rules_for(s, o, [](MaskRules& m) { m.q_offset = 0; })},
      {"window off by one", rules_for(s, o, [](MaskRules& m) { m.lo -= 1; })},
      {"gqa modulo", rules_for(s, o,
                               [&](MaskRules& m) {
                                 for (int64_t h = 0; h < Hq; ++h) m.kv_head[h] = h % Hkv;
                               })},
  };
  for (const Wrong& w : wrong) {
    INFO(w.name);
    AttentionOptions wo = o, wr = r;
    wo.rules = wr.rules = w.rules;
    const Tensor fused = attention(q, k, v, wo), ref = attention(q, k, v, wr);
    CHECK(max_abs_diff(fused, ref) < 1e-5);    // one meaning in both kernels
    CHECK(max_abs_diff(fused, clean) > 1e-3);  // and a visible difference
  }
  // Explicit rules equal to the derived ones change nothing, bit for bit.
  AttentionOptions same = o;
  same.rules = rules_for(s, o, [](MaskRules&) {});
  CHECK(max_abs_diff(attention(q, k, v, same), clean) == 0.0);
  // Rules that do not fit the call are refused, naming what is wrong.
  same.rules = rules_for(s, o, [](MaskRules& m) { m.kv_head.pop_back(); });
  CHECK_THROWS_WITH(attention(q, k, v, same),
                    Catch::Contains("mask rules map 3 query heads") && Catch::Contains("Hq=4"));
  same.rules = rules_for(s, o, [](MaskRules& m) { m.kv_head[1] = 2; });
  CHECK_THROWS_WITH(attention(q, k, v, same), Catch::Contains("query head 1 to kv head 2"));
  // A future-key probe: perturb key 5; row 0 must not move unless causality is broken.
  Tensor k2 = k.clone();
  k2.data<float>()[(0 * N + 5) * D] += 3.0f;
  const double honest = max_abs_diff(attention(q, k, v, o).narrow(2, 0, 1), attention(q, k2, v, o).narrow(2, 0, 1));
  CHECK(honest == 0.0);
  o.rules = wrong[0].rules;
  const double leaked = max_abs_diff(attention(q, k, v, o).narrow(2, 0, 1), attention(q, k2, v, o).narrow(2, 0, 1));
  CHECK(leaked > 1e-4);
}

TEST_CASE("segment ids make packed documents attend block-diagonally", "[attention]") {
  // Two documents packed in one row: [0,0,0,1,1]. Document 1 must equal attention on it alone.
  const Tensor q = randn({1, 2, 5, 4}, 1), k = randn({1, 2, 5, 4}, 2), v = randn({1, 2, 5, 4}, 3);
  AttentionOptions o;
  o.causal = true;
  o.segment_ids = from_vector_i64({0, 0, 0, 1, 1}, {1, 5});
  AttentionOptions alone;
  alone.causal = true;
  for (Kernel kern : {Kernel::fused, Kernel::reference}) {
    o.kernel = alone.kernel = kern;
    const Tensor packed = attention(q, k, v, o);
    const Tensor doc1 = attention(q.narrow(2, 3, 2), k.narrow(2, 3, 2), v.narrow(2, 3, 2), alone);
    CHECK(max_abs_diff(packed.narrow(2, 3, 2), doc1) < 1e-6);
    const Tensor doc0 = attention(q.narrow(2, 0, 3), k.narrow(2, 0, 3), v.narrow(2, 0, 3), alone);
    CHECK(max_abs_diff(packed.narrow(2, 0, 3), doc0) < 1e-6);
  }
}
