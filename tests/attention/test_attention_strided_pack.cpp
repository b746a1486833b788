// The strided walk's packed key rows (attention/cpu/fused.h, strided_pack_limit): a residue group's K
// and V rows are copied into contiguous scratch, and its dK and dV rows accumulated there, instead
// of read and written s rows apart. The copies move where the tile products read and write, not
// what they compute, so every output and gradient must be the same bits with the copies (the
// default) and without them (limit 0). That the values are right is the float64 brute force's
// check (test_attention_sparse.cpp, "the regrouped strided walk matches the float64 brute force",
// whose groups of ~130 and ~44 keys take the copies).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>

#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "attention/pattern/pattern.h"
#include "autograd/engine.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

struct Run {
  Tensor out, dq, dk, dv;
};

Run forward_backward(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g, const AttentionOptions& o) {
  Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
         v = v0.clone().set_requires_grad(true);
  Run r;
  r.out = attention(q, k, v, o);
  autograd::backward(r.out, g);
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data<float>(), y.data<float>(), x.numel() * sizeof(float)) == 0;
}

// Restores the default limit however the test leaves.
struct PackLimit {
  explicit PackLimit(int64_t keys) { set_strided_pack_limit(keys); }
  ~PackLimit() { set_strided_pack_limit(kMaxPackedKeys); }
};

}  // namespace

TEST_CASE("sparse: the strided walk's packed key rows give the same bits as reading them in place",
          "[attention][sparse][exact]") {
  struct Case {
    std::string name;
    int64_t s, l, Nq, Nk, Hq, Hkv, D;
    bool padding, dropout;
    int64_t window = 0;
  };
  // s = 64 at D = 64 is where the copies pay (rows 16 KiB apart); s = 10 with l = 25 gives groups
  // of ~130 keys (one packed product of several row blocks each); Nq = 333 of 1303 puts the rows
  // at q_offset 970, not a multiple of s; GQA sums per-query-head dK/dV partials. s = 4 gives
  // groups of ~326 keys, two kWalkK-key tiles per row block (the second reads the copies from
  // key 256 on); with 333 rows at q_offset 970 and a sliding window of 300 a group's first
  // visible key is ~670 (the copies start there, not at key 0).
  const std::vector<Case> cases = {
      {"s=4 l=9 N=1303 GQA", 4, 9, 1303, 1303, 2, 1, 8, false, false},
      {"s=8 l=8 Nq=333 of 1303 window 300 padding", 8, 8, 333, 1303, 2, 2, 8, true, false, 300},
      {"s=64 l=64 N=1024 D=64", 64, 64, 1024, 1024, 2, 2, 64, false, false},
      {"s=10 l=25 N=1303 GQA padding", 10, 25, 1303, 1303, 2, 1, 16, true, false},
      {"s=10 l=25 Nq=333 of 1303 dropout", 10, 25, 333, 1303, 2, 2, 16, false, true},
      {"s=30 l=7 N=1303 GQA dropout padding", 30, 7, 1303, 1303, 4, 2, 8, true, true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto sp = std::make_shared<SparsePattern>();
    sp->kind = Pattern::strided;
    sp->stride = c.s;
    sp->local = c.l;
    AttentionOptions o;
    o.causal = true;
    o.pattern = sp;
    o.window = c.window;
    if (c.padding) {  // batch row 1 loses its last 100 keys
      Tensor kp = Tensor::empty({2, c.Nk}, DType::boolean);
      for (int64_t e = 0; e < 2 * c.Nk; ++e) kp.data<bool>()[e] = e >= c.Nk && e % c.Nk >= c.Nk - 100;
      o.key_padding = kp;
    }
    if (c.dropout) {
      o.dropout_p = 0.2;
      o.dropout_seed = 5;
    }
    const Problem p = check_problem(randn({2, c.Hq, c.Nq, c.D}, 1), randn({2, c.Hkv, c.Nk, c.D}, 2),
                                    randn({2, c.Hkv, c.Nk, c.D}, 3), o);
    const MaskPlan plan(p.shape(), o, p.dtype);
    REQUIRE(use_strided_walk(plan));
    const StridedWalk& w = plan.layout().walk;
    REQUIRE(w.keys(0) <= kMaxPackedKeys);  // every group fits the copies by default
    REQUIRE(packed_key_rows(w) == w.keys(0));
    const Tensor q = randn({2, c.Hq, c.Nq, c.D}, 11, 0, 0.0, 3.0), k = randn({2, c.Hkv, c.Nk, c.D}, 12),
                 v = randn({2, c.Hkv, c.Nk, c.D}, 13), g = randn({2, c.Hq, c.Nq, c.D}, 14);
    const Run packed = forward_backward(q, k, v, g, o);
    Run in_place;
    {
      PackLimit none(0);
      REQUIRE(packed_key_rows(w) == 0);
      in_place = forward_backward(q, k, v, g, o);
    }
    CHECK(same_bits(packed.out, in_place.out));
    CHECK(same_bits(packed.dq, in_place.dq));
    CHECK(same_bits(packed.dk, in_place.dk));
    CHECK(same_bits(packed.dv, in_place.dv));
    // And the results are attention at all: not every gradient zero.
    const std::vector<double> dk = packed.dk.to_vector();
    CHECK(std::any_of(dk.begin(), dk.end(), [](double x) { return x != 0; }));
  }
}
