// Model-level properties of nn::DecoderModel that need no external reference: it can memorise one
// batch; modes and dropout RNG are deterministic; parameter counts and names are exactly the
// hand-derived ones; and the ways of feeding tokens that must not change the answer (KV cache,
// left padding, packed documents) give the logits of the plain full forward.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/transformer.h"
#include "tensor/allocator.h"
#include "train/config.h"
#include "analysis/leakcheck.h"
#include "train/model_factory.h"
#include "train/optimizer.h"

using namespace qkv;

namespace {

// A tiny model of `family` through the config presets: V 37, C 16, Hq 4, T 8; gpt2 with GQA
// (Hkv 2), llama with MQA (Hkv 1) and ffn 48 (int(2*64/3) rounded up to 16).
nn::ModelConfig tiny(const std::string& family, int64_t n_layer, const std::string& kernel = "fused") {
  Config cfg;
  apply_override(cfg, "model.family=" + family);
  cfg.model.vocab_size = 37;
  cfg.model.n_layer = n_layer;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = family == "gpt2" ? 2 : 1;
  cfg.model.n_embd = 16;
  cfg.model.block_size = 8;
  cfg.model.ffn_multiple_of = 16;
  cfg.model.init_std = 0.2;  // far from uniform attention, so position and mask mistakes show
  apply_override(cfg, "model.attn_kernel=" + kernel);
  return train::model_config(cfg, 37);
}

std::vector<int64_t> lcg_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(n);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(vocab));
  }
  return v;
}

Tensor ids_of(const std::vector<int64_t>& v, int64_t rows) {
  return from_vector_i64(v, {rows, static_cast<int64_t>(v.size()) / rows});
}

Tensor run(const nn::DecoderModel& m, nn::ForwardArgs& a) {
  autograd::NoGradGuard no_grad;
  return m.forward(a);
}

Tensor run(const nn::DecoderModel& m, const Tensor& ids) {
  nn::ForwardArgs a;
  a.ids = ids;
  return run(m, a);
}

// max |a - b| / max |b| over two equally shaped tensors.
double rel_err(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double d = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::isfinite(x[i]));
    d = std::max(d, std::abs(x[i] - y[i]));
    s = std::max(s, std::abs(y[i]));
  }
  return d / s;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.raw_data(), y.raw_data(), x.numel() * x.element_size()) == 0;
}

// Logits of the KV-cached forward fed `chunk` tokens at a time, concatenated along T.
Tensor cached_logits(const nn::DecoderModel& m, const Tensor& ids, int64_t chunk) {
  const int64_t B = ids.size(0), T = ids.size(1);
  nn::ModelCache cache = m.make_cache(B, T);
  std::vector<Tensor> parts;
  for (int64_t t = 0; t < T; t += chunk) {
    const int64_t n = std::min(chunk, T - t);
    nn::ForwardArgs a;
    a.ids = ids.narrow(1, t, n).contiguous();
    a.cache = &cache;
    parts.push_back(run(m, a));
    REQUIRE(cache.length() == t + n);
  }
  return cat(parts, 1);
}

}  // namespace

TEST_CASE("a tiny gpt2 overfits one batch from ln V to under 0.1 with AdamW", "[model]") {
  Config cfg;
  cfg.model.family = nn::Family::gpt2;
  cfg.model.vocab_size = 32;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.n_embd = 32;
  cfg.model.block_size = 16;
  auto model = train::build_model(cfg, 32);
  model->init_weights(1337);
  const Tensor ids = ids_of(lcg_ids(4 * 16, 32, 1), 4), targets = ids_of(lcg_ids(4 * 16, 32, 2), 4);

  std::vector<train::OptimParam> ps;
  for (const auto& p : model->named_parameters()) ps.push_back({p.name, p.tensor, p.decay});
  train::AdamWOptions opts;
  opts.lr = 3e-3;
  train::AdamW opt(ps, opts);
  std::vector<double> losses;
  for (int step = 0; step < 200; ++step) {
    nn::ForwardArgs a;
    a.ids = ids;
    Tensor logits = model->forward(a);
    Tensor loss = ag::cross_entropy(ag::reshape(logits, {-1, 32}), targets.reshape({-1}));
    losses.push_back(loss.item());
    autograd::zero_grad(model->parameters());
    autograd::backward(loss);
    opt.step();
  }
  std::printf("[model] overfit one batch: loss %.4f (ln V = %.4f) -> step 50 %.4f -> step 199 %.4f\n", losses[0],
              std::log(32.0), losses[50], losses.back());
  CHECK(losses[0] == Approx(std::log(32.0)).margin(0.1));  // N(0, 0.02) init predicts ~uniformly
  CHECK(losses.back() < 0.1);
  CHECK(losses[50] < losses[0]);
}

TEST_CASE("eval mode is deterministic and train-mode dropout reproduces from the same RngContext", "[model][exact]") {
  nn::ModelConfig c = tiny("gpt2", 2);
  c.dropout = 0.2;
  c.attn_dropout = 0.2;
  nn::DecoderModel m(c);
  m.init_weights(7);
  const Tensor ids = ids_of(lcg_ids(16, 37, 3), 2);
  auto forward = [&](uint64_t seed, uint64_t step) {
    nn::ForwardArgs a;
    a.ids = ids;
    a.rng.seed = seed;
    a.rng.step = step;
    return run(m, a);
  };

  m.eval();
  const Tensor e1 = forward(1, 0), e2 = forward(2, 5);
  CHECK(bitwise_equal(e1, e2));  // the RNG is not consulted in eval

  m.train();
  const Tensor t1 = forward(1, 3), t2 = forward(1, 3), t3 = forward(1, 4), t4 = forward(2, 3);
  CHECK(bitwise_equal(t1, t2));
  CHECK_FALSE(bitwise_equal(t1, t3));  // another step draws other masks
  CHECK_FALSE(bitwise_equal(t1, t4));  // so does another seed
  CHECK(rel_err(t1, e1) > 1e-3);       // dropout really acts in train mode

  // Without dropout, train and eval compute the same thing.
  nn::DecoderModel plain(tiny("gpt2", 2));
  plain.init_weights(7);
  const Tensor p_train = run(plain, ids);
  plain.eval();
  CHECK(bitwise_equal(p_train, run(plain, ids)));
}

TEST_CASE("parameter counts equal the hand formula for gpt2 (tied) and llama (untied)", "[model]") {
  const int64_t V = 37, C = 16, T = 8, hd = 4;
  for (int64_t L : {1, 3}) {
    const nn::ModelConfig g = tiny("gpt2", L);
    REQUIRE(g.ffn_hidden == 4 * C);
    const int64_t F = g.ffn_hidden, qkv = (4 + 2 * 2) * hd;
    const int64_t gpt2_block = 4 * C + (C * qkv + qkv) + (C * C + C) + (C * F + F) + (F * C + C);
    const int64_t gpt2_total = V * C + T * C + L * gpt2_block + 2 * C;  // no lm_head: tied to wte
    nn::DecoderModel gm(g);
    CHECK(gm.parameter_count() == gpt2_total);
    CHECK(gm.non_embedding_parameter_count() == gpt2_total - V * C - T * C);

    const nn::ModelConfig l = tiny("llama", L);
    REQUIRE(l.ffn_hidden == 48);
    const int64_t Fl = l.ffn_hidden, kv = 1 * hd;
    const int64_t llama_block = 2 * C + C * C + 2 * kv * C + C * C + 3 * C * Fl;
    const int64_t llama_total = V * C + L * llama_block + C + V * C;  // untied lm_head
    nn::DecoderModel lm(l);
    CHECK(lm.parameter_count() == llama_total);
    CHECK(lm.non_embedding_parameter_count() == llama_total - V * C);
  }
}

TEST_CASE("named_parameters of one-layer models list the Hugging Face names and shapes in order", "[model]") {
  struct Want {
    std::string name;
    Shape shape;
  };
  auto check = [](const nn::DecoderModel& m, const std::vector<Want>& want) {
    const auto got = m.named_parameters();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(i << ": " << got[i].name);
      CHECK(got[i].name == want[i].name);
      CHECK(got[i].tensor.shape() == want[i].shape);
      CHECK(got[i].decay == (want[i].shape.size() >= 2));  // decay on 2-d weights only
      CHECK(got[i].tensor.requires_grad());
    }
  };
  const std::string h = "transformer.h.0.";
  check(nn::DecoderModel(tiny("gpt2", 1)), {{"transformer.wte.weight", {37, 16}},
                                            {"transformer.wpe.weight", {8, 16}},
                                            {h + "ln_1.weight", {16}},
                                            {h + "ln_1.bias", {16}},
                                            {h + "attn.c_attn.weight", {32, 16}},
                                            {h + "attn.c_attn.bias", {32}},
                                            {h + "attn.c_proj.weight", {16, 16}},
                                            {h + "attn.c_proj.bias", {16}},
                                            {h + "ln_2.weight", {16}},
                                            {h + "ln_2.bias", {16}},
                                            {h + "mlp.c_fc.weight", {64, 16}},
                                            {h + "mlp.c_fc.bias", {64}},
                                            {h + "mlp.c_proj.weight", {16, 64}},
                                            {h + "mlp.c_proj.bias", {16}},
                                            {"transformer.ln_f.weight", {16}},
                                            {"transformer.ln_f.bias", {16}}});
  const std::string l = "model.layers.0.";
  check(nn::DecoderModel(tiny("llama", 1)), {{"model.embed_tokens.weight", {37, 16}},
                                             {l + "input_layernorm.weight", {16}},
                                             {l + "self_attn.q_proj.weight", {16, 16}},
                                             {l + "self_attn.k_proj.weight", {4, 16}},
                                             {l + "self_attn.v_proj.weight", {4, 16}},
                                             {l + "self_attn.o_proj.weight", {16, 16}},
                                             {l + "post_attention_layernorm.weight", {16}},
                                             {l + "mlp.gate_proj.weight", {48, 16}},
                                             {l + "mlp.up_proj.weight", {48, 16}},
                                             {l + "mlp.down_proj.weight", {16, 48}},
                                             {"model.norm.weight", {16}},
                                             {"lm_head.weight", {37, 16}}});
}

TEST_CASE("KV-cached forward token by token and in chunks of 3 reproduces the full-forward logits", "[model]") {
  for (const char* family : {"gpt2", "llama"})
    for (const char* kernel : {"fused", "reference"}) {
      nn::DecoderModel m(tiny(family, 2, kernel));
      m.init_weights(11);
      m.eval();
      const Tensor ids = ids_of(lcg_ids(16, 37, 4), 2);
      const Tensor full = run(m, ids);
      const double e1 = rel_err(cached_logits(m, ids, 1), full), e3 = rel_err(cached_logits(m, ids, 3), full);
      std::printf("[model] kv cache %-5s %-9s: token by token rel %.2e, chunks of 3 rel %.2e\n", family, kernel, e1,
                  e3);
      CHECK(e1 < 1e-5);
      CHECK(e3 < 1e-5);
    }
  // The check is sensitive: RoPE by position within the chunk instead of absolute position breaks it.
  nn::DecoderModel m(tiny("llama", 2));
  m.init_weights(11);
  const Tensor ids = ids_of(lcg_ids(16, 37, 4), 2);
  const Tensor full = run(m, ids);
  const analysis::PlantedFault planted(m, analysis::Fault::rope_cache_relative);
  CHECK(rel_err(cached_logits(m, ids, 3), full) > 1e-3);
}

TEST_CASE("a left-padded batch gives each sequence's logits at its valid positions", "[model]") {
  // Row 0: 3 pads then a 5-token sequence; row 1: a full 8-token sequence.
  const std::vector<int64_t> a = lcg_ids(5, 37, 5), b = lcg_ids(8, 37, 6);
  std::vector<int64_t> ids{0, 0, 0};
  ids.insert(ids.end(), a.begin(), a.end());
  ids.insert(ids.end(), b.begin(), b.end());
  const Tensor pos = from_vector_i64({0, 0, 0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}, {2, 8});
  Tensor valid = Tensor::empty({2, 8}, DType::boolean);
  for (int64_t i = 0; i < 16; ++i) valid.data<bool>()[i] = !(i < 3);
  for (const char* family : {"gpt2", "llama"})
    for (const char* kernel : {"fused", "reference"}) {
      nn::DecoderModel m(tiny(family, 2, kernel));
      m.init_weights(13);
      m.eval();
      nn::ForwardArgs args;
      args.ids = ids_of(ids, 2);
      args.positions = pos;
      args.key_padding = valid;
      const Tensor batch = run(m, args);  // [2, 8, V]
      REQUIRE(all_finite(batch));         // fully masked pad rows give zeros, never NaN
      const double ea = rel_err(batch.select(0, 0).narrow(0, 3, 5), run(m, ids_of(a, 1)).select(0, 0));
      const double eb = rel_err(batch.select(0, 1), run(m, ids_of(b, 1)).select(0, 0));
      std::printf("[model] left padding %-5s %-9s: padded row rel %.2e, full row rel %.2e\n", family, kernel, ea, eb);
      CHECK(ea < 1e-5);
      CHECK(eb < 1e-5);
      const analysis::PlantedFault planted(m, analysis::Fault::ignore_key_padding);  // the check is sensitive
      CHECK(rel_err(run(m, args).select(0, 0).narrow(0, 3, 5), run(m, ids_of(a, 1)).select(0, 0)) > 1e-3);
    }
}

TEST_CASE("packed documents with segment ids and per-document positions equal each document alone", "[model]") {
  // Row 0 packs a 3-token and a 5-token document; row 1 holds one 8-token document.
  const std::vector<int64_t> d1 = lcg_ids(3, 37, 7), d2 = lcg_ids(5, 37, 8), d3 = lcg_ids(8, 37, 9);
  std::vector<int64_t> ids(d1);
  ids.insert(ids.end(), d2.begin(), d2.end());
  ids.insert(ids.end(), d3.begin(), d3.end());
  const Tensor seg = from_vector_i64({0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 8});
  const Tensor pos = from_vector_i64({0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}, {2, 8});
  for (const char* family : {"gpt2", "llama"})
    for (const char* kernel : {"fused", "reference"}) {
      nn::DecoderModel m(tiny(family, 2, kernel));
      m.init_weights(17);
      m.eval();
      nn::ForwardArgs args;
      args.ids = ids_of(ids, 2);
      args.positions = pos;
      args.segment_ids = seg;
      const Tensor packed = run(m, args);
      const double e1 = rel_err(packed.select(0, 0).narrow(0, 0, 3), run(m, ids_of(d1, 1)).select(0, 0));
      const double e2 = rel_err(packed.select(0, 0).narrow(0, 3, 5), run(m, ids_of(d2, 1)).select(0, 0));
      const double e3 = rel_err(packed.select(0, 1), run(m, ids_of(d3, 1)).select(0, 0));
      std::printf("[model] packed %-5s %-9s: doc rel %.2e %.2e %.2e\n", family, kernel, e1, e2, e3);
      CHECK(e1 < 1e-5);
      CHECK(e2 < 1e-5);
      CHECK(e3 < 1e-5);
      // Without the segment ids the second document sees the first: the check is sensitive.
      nn::ForwardArgs leaky;
      leaky.ids = args.ids;
      leaky.positions = pos;
      CHECK(rel_err(run(m, leaky).select(0, 0).narrow(0, 3, 5), run(m, ids_of(d2, 1)).select(0, 0)) > 1e-3);
    }
}

TEST_CASE(
    "recompute replays each block in backward: same loss and bitwise-equal gradients, less memory (float32 and bf16 "
    "autocast)",
    "[model][exact]") {
  for (const bool bf16 : {false, true})
    for (const std::string family : {"gpt2", "llama"}) {
      INFO(family << (bf16 ? " bf16 autocast" : " float32"));
      nn::ModelConfig c = tiny(family, 3);
      c.dropout = 0.2;       // the replay must redraw the same residual masks
      c.attn_dropout = 0.2;  // and the same attention masks
      auto loss_and_grads = [&](bool recompute, int64_t* peak) {
        nn::ModelConfig cc = c;
        cc.recompute = recompute;
        nn::DecoderModel m(cc);
        m.init_weights(11);
        const Tensor ids = ids_of(lcg_ids(3 * 8, 37, 5), 3), targets = ids_of(lcg_ids(3 * 8, 37, 6), 3);
        reset_peak_bytes();
        const int64_t base = allocator_stats().bytes_in_use;
        nn::ForwardArgs a;
        a.ids = ids;
        a.rng.seed = 9;
        a.rng.step = 4;
        Tensor loss;
        {
          // bf16 autocast for the forward only: the replay in backward must round as the forward did.
          autograd::AutocastGuard precision(bf16);
          loss = ag::cross_entropy(ag::reshape(m.forward(a), {-1, 37}), targets.reshape({-1}));
        }
        autograd::backward(loss);
        *peak = allocator_stats().peak_bytes - base;
        std::vector<Tensor> grads{loss};
        for (const auto& p : m.parameters()) grads.push_back(p.grad());
        return grads;
      };
      int64_t peak_plain = 0, peak_recompute = 0;
      const auto plain = loss_and_grads(false, &peak_plain);
      const auto replayed = loss_and_grads(true, &peak_recompute);
      REQUIRE(plain.size() == replayed.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        INFO("tensor " << i);
        REQUIRE(replayed[i].defined());
        INFO("rel err " << rel_err(replayed[i], plain[i]));
        CHECK(bitwise_equal(plain[i], replayed[i]));
      }
      std::printf("[model] %s recompute: peak extra bytes %lld -> %lld\n", family.c_str(),
                  static_cast<long long>(peak_plain), static_cast<long long>(peak_recompute));
      CHECK(peak_recompute < peak_plain);
    }
}

TEST_CASE("set_data repoints every handle of a parameter and keeps its autograd slot", "[model]") {
  nn::DecoderModel m(tiny("gpt2", 1));
  m.init_weights(3);
  auto params = m.named_parameters();
  Tensor handle = params[0].tensor;  // transformer.wte.weight, also read by the tied head
  const Tensor replacement = full(handle.shape(), 0.25);
  handle.set_data(replacement);
  CHECK(m.named_parameters()[0].tensor.to_vector() == std::vector<double>(handle.numel(), 0.25));
  CHECK(handle.requires_grad());
  // The moved parameter still receives gradients through the model's own handles.
  nn::ForwardArgs a;
  a.ids = ids_of(lcg_ids(8, 37, 1), 1);
  autograd::backward(ag::sum(m.forward(a)));
  CHECK(params[0].tensor.grad().defined());
  m.to(Device::cpu);  // already there: nothing moves
  CHECK(m.named_parameters()[0].tensor.same(handle));
  CHECK(m.device() == Device::cpu);
}
