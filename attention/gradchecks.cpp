// Gradcheck cases for `qkv gradcheck`: the fused attention primitive over the grid
//   {no mask, causal, key padding, window, bool mask, bias, causal+padding, fully masked rows}
//   × {MHA, GQA, MQA} × {Nq = Nk, Nq < Nk} × {dropout off, dropout on (fixed seed)},
// plus the packed form, ALiBi, RoPE and the reference path (whose bias is differentiable). Sizes are tiny (B = 2,
// H <= 4, N <= 5, D = 3) so the 96-case grid runs in about a second.
#include <string>

#include "attention/attention.h"
#include "attention/linear/linear_attention.h"
#include "attention/rope.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace qkv::attn {

namespace {

struct Dims {
  int64_t B, Hq, Hkv, Nq, Nk, D;
};

Tensor bool_tensor(const Shape& s, const std::function<bool(int64_t)>& f) {
  Tensor t = Tensor::empty(s, DType::boolean);
  for (int64_t e = 0; e < t.numel(); ++e) t.data<bool>()[e] = f(e);
  return t;
}

// Sets up one mask kind of the grid on `o` for sizes `d`.
void set_mask(const std::string& kind, const Dims& d, AttentionOptions& o) {
  if (kind == "causal" || kind == "causal+padding" || kind == "fully masked rows") o.causal = true;
  if (kind == "key padding") {  // batch 0: last key padded; batch 1: first key padded
    o.key_padding = bool_tensor({d.B, d.Nk}, [&](int64_t e) {
      const int64_t b = e / d.Nk, j = e % d.Nk;
      return b == 0 ? j != d.Nk - 1 : j != 0;
    });
  } else if (kind == "window") {
    o.window = 2;
  } else if (kind == "bool mask") {  // a fixed pattern, shared by the heads, every row non-empty
    o.allow_mask = bool_tensor({d.B, 1, d.Nq, d.Nk}, [&](int64_t e) {
      const int64_t j = e % d.Nk, i = (e / d.Nk) % d.Nq, b = e / (d.Nk * d.Nq);
      return (i + 2 * j + b) % 3 != 0 || j == (i + b) % d.Nk;
    });
  } else if (kind == "bias") {
    o.bias = randn({1, d.Hq, d.Nq, d.Nk}, 99, 0, 0.0, 1.0, DType::f64);
  } else if (kind == "causal+padding") {
    o.key_lengths = {d.Nk, d.Nk - 1};
  } else if (kind == "fully masked rows") {  // left padding in batch 1 empties its first two rows
    const int64_t pad = d.Nk - d.Nq + 2;
    o.key_padding = bool_tensor({d.B, d.Nk}, [&](int64_t e) { return e / d.Nk == 0 || e % d.Nk >= pad; });
  }
}

std::vector<Tensor> qkv_inputs(const Dims& d, uint64_t seed) {
  return {randn({d.B, d.Hq, d.Nq, d.D}, seed, 0, 0.0, 1.0, DType::f64),
          randn({d.B, d.Hkv, d.Nk, d.D}, seed + 1, 0, 0.0, 1.0, DType::f64),
          randn({d.B, d.Hkv, d.Nk, d.D}, seed + 2, 0, 0.0, 1.0, DType::f64)};
}

}  // namespace

void register_attention_gradchecks(autograd::GradcheckRegistry& r) {
  const char* masks[] = {"no mask", "bool mask", "causal",         "key padding",
                         "window",  "bias",      "causal+padding", "fully masked rows"};
  struct Heads {
    const char* name;
    int64_t Hq, Hkv;
  };
  const Heads heads[] = {{"MHA", 2, 2}, {"GQA", 4, 2}, {"MQA", 3, 1}};
  const std::pair<int64_t, int64_t> lengths[] = {{4, 4}, {3, 5}};
  uint64_t seed = 1000;
  for (const char* mask : masks)
    for (const Heads& h : heads)
      for (const auto& [nq, nk] : lengths)
        for (int drop = 0; drop < 2; ++drop) {
          const Dims d{2, h.Hq, h.Hkv, nq, nk, 3};
          AttentionOptions o;
          set_mask(mask, d, o);
          if (drop) {
            o.dropout_p = 0.3;
            o.dropout_seed = 7;
            o.dropout_offset = 3;
          }
          const std::string name =
              cat("fused ", mask, " ", h.name, nq == nk ? " Nq=Nk" : " Nq<Nk", drop ? " dropout 0.3" : "", " [2,", h.Hq,
                  ",", nq, ",3] k [2,", h.Hkv, ",", nk, ",3]");
          const uint64_t s = seed;
          seed += 3;
          r.add({"attention", name, [=] { return qkv_inputs(d, s); },
                 [=](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); }});
        }

  // Sparse patterns (op "attention_sparse", the pattern's name first in the case name, so
  // `qkv gradcheck --only strided` selects them) × {non-causal, causal} × {MHA, GQA} × {dropout}.
  // N = 9 with blocks of 2 and strides of 3, so every pattern leaves rows partly masked.
  {
    struct Named {
      const char* name;
      SparsePattern p;
    };
    std::vector<Named> patterns;
    auto add = [&](const char* name, Pattern kind, auto&& set) {
      SparsePattern p;
      p.kind = kind;
      set(p);
      patterns.push_back({name, p});
    };
    add("window", Pattern::window, [](SparsePattern& p) { p.local = 3; });
    add("strided", Pattern::strided, [](SparsePattern& p) {
      p.stride = 3;
      p.local = 2;
    });
    add("global", Pattern::global, [](SparsePattern& p) { p.global_tokens = {0, 4}; });
    add("bigbird", Pattern::bigbird, [](SparsePattern& p) {
      p.block_size = 2;
      p.local = 2;
      p.random_blocks = 1;
      p.seed = 3;
    });
    add("block_sparse", Pattern::block_sparse, [](SparsePattern& p) {
      p.block_size = 2;
      p.layout = "fixed";
    });
    const Heads sparse_heads[] = {{"MHA", 2, 2}, {"GQA", 4, 2}};
    uint64_t sseed = 8000;
    for (const Named& n : patterns)
      for (int causal = 0; causal < 2; ++causal)
        for (const Heads& h : sparse_heads)
          for (int drop = 0; drop < 2; ++drop) {
            const Dims d{1, h.Hq, h.Hkv, 9, 9, 3};
            AttentionOptions o;
            o.causal = causal;
            o.pattern = std::make_shared<const SparsePattern>(n.p);
            if (drop) {
              o.dropout_p = 0.3;
              o.dropout_seed = 9;
              o.dropout_offset = 1;
            }
            const uint64_t s = sseed;
            sseed += 3;
            r.add({"attention_sparse",
                   cat(n.name, " (", n.p.describe(), ")", causal ? " causal " : " ", h.name, drop ? " dropout 0.3" : "",
                       " [1,", h.Hq, ",9,3] k [1,", h.Hkv, ",9,3]"),
                   [=] { return qkv_inputs(d, s); },
                   [=](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); }});
          }
  }
  // ALiBi on the fly, under GQA.
  {
    const Dims d{1, 4, 2, 3, 5, 3};
    AttentionOptions o;
    o.causal = true;
    o.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    r.add({"attention", "fused alibi causal GQA Nq<Nk", [=] { return qkv_inputs(d, 7000); },
           [=](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); }});
  }
  // Reference (composed) path, including a learned bias.
  {
    const Dims d{2, 4, 2, 3, 4, 3};
    AttentionOptions o;
    o.kernel = Kernel::reference;
    o.causal = true;
    o.dropout_p = 0.25;
    o.dropout_seed = 5;
    r.add({"attention_reference", "causal GQA Nq<Nk dropout 0.25", [=] { return qkv_inputs(d, 7100); },
           [=](const std::vector<Tensor>& x) { return attention(x[0], x[1], x[2], o); }});
    AttentionOptions ob;
    ob.kernel = Kernel::reference;
    ob.key_lengths = {4, 2};
    r.add({"attention_reference", "learned bias [1,4,3,4] with key lengths",
           [=] {
             auto in = qkv_inputs(d, 7200);
             in.push_back(randn({1, d.Hq, d.Nq, d.Nk}, 7203, 0, 0.0, 1.0, DType::f64));
             return in;
           },
           [=](const std::vector<Tensor>& x) {
             AttentionOptions oo = ob;
             oo.bias = x[3];
             return attention(x[0], x[1], x[2], oo);
           }});
  }
  // The packed form (GPT-2's fused projection): qkv [B, N, Hq + 2·Hkv, D], causal, MHA and GQA,
  // with and without dropout; the packed tensor itself is the one input.
  {
    const std::pair<int64_t, int64_t> packed[] = {{2, 2}, {4, 2}};
    for (const auto& [hq, hkv] : packed)
      for (int drop = 0; drop < 2; ++drop) {
        AttentionOptions o;
        o.causal = true;
        if (drop) {
          o.dropout_p = 0.3;
          o.dropout_seed = 11;
          o.dropout_offset = 5;
        }
        const int64_t heads = hq + 2 * hkv;
        r.add({"attention_packed",
               cat("causal Hq=", hq, " Hkv=", hkv, drop ? " dropout 0.3" : "", " qkv [2,4,", heads, ",3]"),
               [=] {
                 return std::vector<Tensor>{randn({2, 4, heads, 3}, 7400 + 10 * hq + drop, 0, 0.0, 1.0, DType::f64)};
               },
               [=](const std::vector<Tensor>& x) { return attention_packed(x[0], hq, hkv, o); }});
      }
  }
  // RoPE: by start position and by per-row positions (left padding).
  r.add({"rope", "[2,3,4,6] start 5 theta 100",
         [] {
           return std::vector<Tensor>{randn({2, 3, 4, 6}, 7300, 0, 0.0, 1.0, DType::f64)};
         },
         [](const std::vector<Tensor>& x) { return apply_rope(x[0], 5, 100.0); }});
  r.add({"rope", "[2,2,3,4] positions [2,3] through a transposed view",
         [] {
           return std::vector<Tensor>{randn({2, 3, 2, 4}, 7301, 0, 0.0, 1.0, DType::f64)};
         },
         [](const std::vector<Tensor>& x) {
           const Tensor pos = from_vector_i64({0, 1, 2, 0, 0, 1}, {2, 3});
           return apply_rope(ag::transpose(x[0], 1, 2), pos, 10000.0);
         }});
  register_linear_attention_gradchecks(r);  // attention/linear/linear_attention.cpp
}

}  // namespace qkv::attn
