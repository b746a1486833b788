#include "app/registry.h"

#include <cmath>
#include <memory>
#include <string>

#include "attention/attention.h"
#include "nn/cross_attention.h"
#include "tensor/ops.h"

namespace qkv::app {

namespace {

// Attention cases sized past the kernels' guards (op "attention_probe"): the grid of
// attention/gradchecks.cpp has at most 9 keys and O(1) logits, so it never runs the online
// softmax's rescale (the CPU kernel's key tile is 32) nor a logit past exp's overflow. Here
// Nq = Nk = 69 keys (two full tiles and a partial one), causal, GQA 2:1, D = 3, and logits
// 1000 + 1.5·⌊j / 16⌋ + O(1): q_i0 = 1, k_j0 = (1000 + ramp) / s, the rest N(0, 1), so every logit
// is past float64's exp overflow (709.8) and each row's max grows every 16 keys; without a pattern
// and with each pattern at the edges of its parameters (1 and Nk; global also g = 0, where each row
// sees only itself and dQ = dK = 0 exactly).
void register_probe_gradchecks(autograd::GradcheckRegistry& r) {
  constexpr int64_t Hq = 2, Hkv = 1, N = 69, D = 3;
  const double s = 1.0 / std::sqrt(static_cast<double>(D));
  auto inputs = [s](uint64_t seed) {
    std::vector<double> q = randn({1, Hq, N, D}, seed, 0, 0.0, 1.0, DType::f64).to_vector(),
                        k = randn({1, Hkv, N, D}, seed + 1, 0, 0.0, 1.0, DType::f64).to_vector();
    for (size_t e = 0; e < q.size(); e += D) q[e] = 1;
    for (size_t e = 0; e < k.size(); e += D)
      k[e] = (1000 + 1.5 * static_cast<double>((static_cast<int64_t>(e / D) % N) / 16)) / s;
    return std::vector<Tensor>{from_vector(q, {1, Hq, N, D}, DType::f64), from_vector(k, {1, Hkv, N, D}, DType::f64),
                               randn({1, Hkv, N, D}, seed + 2, 0, 0.0, 1.0, DType::f64)};
  };
  struct Case {
    std::string name;
    attn::Pattern kind;
    int64_t param;
  };
  using P = attn::Pattern;
  const Case cases[] = {{"no pattern", P::full, 0},
                        {"window l=1", P::window, 1},
                        {"window l=69", P::window, N},
                        {"strided s=1 l=1", P::strided, 1},
                        {"strided s=69 l=1", P::strided, N},
                        {"global g=0", P::global, 0},
                        {"global g=1", P::global, 1},
                        {"global g=69", P::global, N},
                        {"bigbird bs=1", P::bigbird, 1},
                        {"bigbird bs=69", P::bigbird, N},
                        {"block_sparse bs=1", P::block_sparse, 1},
                        {"block_sparse bs=69", P::block_sparse, N}};
  uint64_t seed = 9100;
  for (const Case& c : cases) {
    attn::AttentionOptions o;
    o.causal = true;
    if (c.kind != P::full) {
      attn::SparsePattern p;
      p.kind = c.kind;
      if (c.kind == P::window) p.local = c.param;
      if (c.kind == P::strided) p.stride = c.param, p.local = 1;
      if (c.kind == P::global) p.global = c.param;
      if (c.kind == P::bigbird) p.block_size = c.param, p.random_blocks = 1, p.seed = 5;
      if (c.kind == P::block_sparse) p.block_size = c.param;
      o.pattern = std::make_shared<const attn::SparsePattern>(p);
    }
    const uint64_t at = seed;
    seed += 3;
    r.add({"attention_probe", cat(c.name, " causal GQA 69 keys, logits ~1000 [1,2,69,3] k [1,1,69,3]"),
           [=] { return inputs(at); },
           [=](const std::vector<Tensor>& x) { return attn::attention(x[0], x[1], x[2], o); }});
  }
}

}  // namespace

const autograd::GradcheckRegistry& full_gradcheck_registry() {
  static const autograd::GradcheckRegistry registry = [] {
    autograd::GradcheckRegistry r;
    autograd::register_core_gradchecks(r);
    attn::register_attention_gradchecks(r);
    register_probe_gradchecks(r);
    nn::register_cross_attention_gradchecks(r);
    return r;
  }();
  return registry;
}

}  // namespace qkv::app
