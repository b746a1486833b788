#include "nn/cross_attention.h"

#include <cmath>

#include "attention/rope.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace qkv::nn {

void CrossAttentionConfig::validate() const {
  auto positive = [](const char* key, int64_t v) { QKV_CHECK(v > 0, key, " must be > 0, got ", v); };
  positive("cross_attention.d_model", d_model);
  positive("cross_attention.d_memory", d_memory);
  positive("cross_attention.n_head", n_head);
  positive("cross_attention.n_kv_head", n_kv_head);
  QKV_CHECK(head_dim >= 0, "cross_attention.head_dim must be >= 0 (0 = d_model / n_head), got ", head_dim);
  QKV_CHECK(head_dim > 0 || d_model % n_head == 0, "cross_attention.d_model (", d_model,
            ") must be divisible by cross_attention.n_head (", n_head, ") when head_dim is 0");
  QKV_CHECK(n_head % n_kv_head == 0, "cross_attention.n_head (", n_head, ") must be divisible by n_kv_head (",
            n_kv_head, ")");
  QKV_CHECK(!rope || resolved_head_dim() % 2 == 0, "cross_attention.rope needs an even head_dim, got ",
            resolved_head_dim());
  QKV_CHECK(rope_theta > 0 && std::isfinite(rope_theta), "cross_attention.rope_theta must be > 0, got ", rope_theta);
  QKV_CHECK(attn_dropout >= 0 && attn_dropout < 1, "cross_attention.attn_dropout must be in [0, 1), got ",
            attn_dropout);
}

Tensor cross_attention(const Tensor& x, const Tensor& memory, const CrossAttentionWeights& w,
                       const CrossAttentionConfig& cfg, const CrossAttentionArgs& args, bool training) {
  QKV_CHECK(x.defined() && x.dim() == 3 && x.size(2) == cfg.d_model, "[cross_attention] x must be [B, Nq, ",
            cfg.d_model, "], got ", x.defined() ? shape_str(x.shape()) : "undefined");
  QKV_CHECK(memory.defined() && memory.dim() == 3 && memory.size(0) == x.size(0) && memory.size(2) == cfg.d_memory,
            "[cross_attention] memory must be [", x.size(0), ", Nk, ", cfg.d_memory, "], got ",
            memory.defined() ? shape_str(memory.shape()) : "undefined");
  const int64_t B = x.size(0), Nq = x.size(1), Nk = memory.size(1);
  const int64_t Hq = cfg.n_head, Hkv = cfg.n_kv_head, hd = cfg.resolved_head_dim();
  QKV_CHECK((!args.memory_padding.defined() || args.memory_padding.shape() == Shape{B, Nk}),
            "[cross_attention] memory_padding must be [", B, ", ", Nk, "], got ",
            shape_str(args.memory_padding.shape()));
  QKV_CHECK(args.memory_lengths.empty() || static_cast<int64_t>(args.memory_lengths.size()) == B,
            "[cross_attention] memory_lengths has ", args.memory_lengths.size(), " entries for a batch of ", B);

  // [B, N, H·hd] -> [B, H, N, hd]: views; the attention op reads any strides.
  auto heads = [](const Tensor& t, int64_t b, int64_t n, int64_t h, int64_t d) {
    return ag::transpose(ag::reshape(t, {b, n, h, d}), 1, 2);
  };
  Tensor q = heads(ag::linear(x, w.q_w, w.q_b), B, Nq, Hq, hd);
  Tensor k = heads(ag::linear(memory, w.k_w, w.k_b), B, Nk, Hkv, hd);
  Tensor v = heads(ag::linear(memory, w.v_w, w.v_b), B, Nk, Hkv, hd);
  if (cfg.rope) {
    q = args.q_positions.defined() ? attn::apply_rope(q, args.q_positions, cfg.rope_theta)
                                   : attn::apply_rope(q, 0, cfg.rope_theta);
    k = args.k_positions.defined() ? attn::apply_rope(k, args.k_positions, cfg.rope_theta)
                                   : attn::apply_rope(k, 0, cfg.rope_theta);
  }
  attn::AttentionOptions o;  // causal stays off: see the header
  o.key_padding = args.memory_padding;
  o.key_lengths = args.memory_lengths;
  o.kernel = cfg.kernel;
  if (training && cfg.attn_dropout > 0) {
    QKV_CHECK(args.rng != nullptr, "[cross_attention] attention dropout in training needs CrossAttentionArgs::rng");
    o.dropout_p = cfg.attn_dropout;
    o.dropout_seed = args.rng->seed;
    o.dropout_offset = args.rng->next_offset();
  }
  Tensor y = attn::attention(q, k, v, o);                                     // [B, Hq, Nq, hd]
  y = ag::reshape(ag::contiguous(ag::transpose(y, 1, 2)), {B, Nq, Hq * hd});  // [B, Nq, Hq·hd]
  return ag::linear(y, w.o_w, w.o_b);
}

CrossAttention::CrossAttention(const CrossAttentionConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  const int64_t hd = cfg_.resolved_head_dim(), qd = cfg_.n_head * hd, kvd = cfg_.n_kv_head * hd;
  q_proj = register_module("q_proj", std::make_shared<Linear>(cfg_.d_model, qd, cfg_.bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(cfg_.d_memory, kvd, cfg_.bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(cfg_.d_memory, kvd, cfg_.bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(qd, cfg_.d_model, cfg_.bias));
}

CrossAttentionWeights CrossAttention::weights() const {
  return {q_proj->weight, q_proj->bias, k_proj->weight, k_proj->bias,
          v_proj->weight, v_proj->bias, o_proj->weight, o_proj->bias};
}

Tensor CrossAttention::forward(const Tensor& x, const Tensor& memory, const CrossAttentionArgs& args) const {
  return cross_attention(x, memory, weights(), cfg_, args, is_training());
}

void register_cross_attention_gradchecks(autograd::GradcheckRegistry& r) {
  struct Case {
    const char* name;
    int64_t Hq, Hkv, Nq, Nk;
    bool bias, rope, padding, lengths, empty_row, dropout;
  };
  // Each case differentiates x, memory and the weights (inputs 0, 1, then q/k/v/o weight[, bias]).
  const Case cases[] = {
      {"MHA Nq<Nk", 2, 2, 3, 5, true, false, false, false, false, false},
      {"MHA Nq>Nk padded memory", 2, 2, 5, 3, true, false, true, false, false, false},
      {"GQA 4:2 Nq<Nk memory lengths", 4, 2, 2, 6, false, false, false, true, false, false},
      {"MQA 3:1 Nq>Nk padded memory", 3, 1, 4, 3, true, false, true, false, false, false},
      {"GQA 4:2 rope Nq<Nk", 4, 2, 3, 4, false, true, false, false, false, false},
      {"MHA all-padding memory row", 2, 2, 3, 4, true, false, true, false, true, false},
      {"GQA 4:2 dropout 0.3 padded memory", 4, 2, 3, 5, true, false, true, false, false, true},
  };
  uint64_t seed = 9100;
  for (const Case& c : cases) {
    CrossAttentionConfig cfg;
    cfg.d_model = 6;
    cfg.d_memory = 5;
    cfg.n_head = c.Hq;
    cfg.n_kv_head = c.Hkv;
    cfg.head_dim = 2;
    cfg.bias = c.bias;
    cfg.rope = c.rope;
    cfg.rope_theta = 100.0;
    cfg.attn_dropout = c.dropout ? 0.3 : 0.0;
    const int64_t B = 2, hd = 2, qd = c.Hq * hd, kvd = c.Hkv * hd;
    CrossAttentionArgs args;
    if (c.padding) {  // batch 0: last memory row padded; batch 1: first (or, empty_row, every) row padded
      args.memory_padding = Tensor::empty({B, c.Nk}, DType::boolean);
      for (int64_t e = 0; e < B * c.Nk; ++e) {
        const int64_t b = e / c.Nk, j = e % c.Nk;
        args.memory_padding.data<bool>()[e] = b == 0 ? j != c.Nk - 1 : (!c.empty_row && j != 0);
      }
    }
    if (c.lengths) args.memory_lengths = {c.Nk, c.Nk - 3};
    const uint64_t s = seed;
    seed += 16;
    auto make = [=] {
      std::vector<Tensor> in{randn({B, c.Nq, 6}, s, 0, 0.0, 1.0, DType::f64),
                             randn({B, c.Nk, 5}, s + 1, 0, 0.0, 1.0, DType::f64)};
      const Shape shapes[] = {{qd, 6}, {qd}, {kvd, 5}, {kvd}, {kvd, 5}, {kvd}, {6, qd}, {6}};
      for (int p = 0; p < 8; ++p)
        if (p % 2 == 0 || c.bias) in.push_back(randn(shapes[p], s + 2 + p, 0, 0.0, 0.7, DType::f64));
      return in;
    };
    auto fn = [=](const std::vector<Tensor>& in) {
      CrossAttentionWeights w;
      size_t i = 2;
      Tensor* slots[] = {&w.q_w, &w.q_b, &w.k_w, &w.k_b, &w.v_w, &w.v_b, &w.o_w, &w.o_b};
      for (int p = 0; p < 8; ++p)
        if (p % 2 == 0 || c.bias) *slots[p] = in[i++];
      RngContext rng{77, 3, 0};  // the same mask on every evaluation
      CrossAttentionArgs a = args;
      a.rng = &rng;
      return cross_attention(in[0], in[1], w, cfg, a, /*training=*/c.dropout);
    };
    r.add({"cross_attention",
           cat(c.name, " x [2,", c.Nq, ",6] memory [2,", c.Nk, ",5] Hq=", c.Hq, " Hkv=", c.Hkv, c.bias ? " bias" : ""),
           make, fn});
  }
}

}  // namespace qkv::nn
