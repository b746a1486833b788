// The cost model (analysis/cost.h) against reality: parameter counts of built models, the FLOP
// count `qkv bench --what step` reports, the bytes make_cache allocates, and the allocator's peak
// over a real training step.
#include <catch2/catch.hpp>

#include <filesystem>

#include "analysis/cost.h"
#include "attention/attention.h"
#include "attention/pattern/pattern.h"
#include "tensor/allocator.h"
#include "train/bench.h"
#include "train/model_factory.h"

using namespace qkv;

namespace {

std::string src(const std::string& rel) { return std::string(QKV_SOURCE_DIR) + "/" + rel; }

std::vector<std::string> shipped_configs() {
  std::vector<std::string> out;
  for (const char* dir : {"configs", "configs/bench"})
    for (const auto& e : std::filesystem::directory_iterator(src(dir)))
      if (e.path().extension() == ".toml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A vocabulary for configs that take the tokenizer's (the count is a function of it).
constexpr int64_t kVocab = 97;

}  // namespace

TEST_CASE("cost: params equal the built model's for every shipped config", "[cost]") {
  const auto configs = shipped_configs();
  REQUIRE(configs.size() >= 8);
  for (const auto& path : configs) {
    for (const char* tie : {"", "model.tie_embeddings=false"}) {
      std::vector<std::string> sets;
      if (*tie) sets.push_back(tie);
      // G has 124M parameters: its shape is checked on a 2-layer copy (the count is linear in L).
      if (path.find("G.toml") != std::string::npos || path.find("gpt2_gpu") != std::string::npos)
        sets.push_back("model.n_layer=2");
      const Config cfg = parse_config(path, sets);
      INFO(path << " " << tie);
      analysis::CostOptions o;
      o.vocab = kVocab;
      const analysis::CostReport r = analysis::estimate_cost(cfg, o);
      const auto model = train::build_model(cfg.resolved(), cfg.model.vocab_size > 0 ? cfg.model.vocab_size : kVocab);
      CHECK(r.params == model->parameter_count());
      CHECK(r.non_embedding_params == model->non_embedding_parameter_count());
      CHECK(r.embedding_params + r.non_embedding_params == r.params);
      int64_t layer_sum = 0;
      for (const auto& l : r.layers) layer_sum += l.params;
      CHECK(static_cast<int64_t>(r.layers.size()) == model->config().n_layer);
      CHECK(layer_sum < r.non_embedding_params);
    }
  }
}

TEST_CASE("cost: a hand count of GPT-2 small", "[cost]") {
  // GPT-2 124M: 124,439,808 parameters with the tied head (the published figure).
  const Config cfg = parse_config(src("configs/bench/G.toml"));
  const analysis::CostReport r = analysis::estimate_cost(cfg);
  CHECK(r.params == 124439808);
  CHECK(r.embedding_params == 50257 * 768 + 1024 * 768);
  // Decode at context N = 1024, full attention: per layer 2·(params) + 4·C·N for QK^T and AV.
  const double layer = 2.0 * (12 * 768 * 768 + 13 * 768) + 4.0 * 768 * 1024;  // 12C² + 13C per block
  CHECK(r.decode.total() == Approx(12 * layer + 2.0 * 768 * 50257 + 2.0 * 2 * 768).epsilon(1e-12));
  CHECK(r.kept_pairs_context == 1024 * 1025 / 2);
}

TEST_CASE("cost: kept pairs of the attention patterns", "[cost]") {
  Config cfg = parse_config(src("configs/tiny.toml"), {"model.vocab_size=65"});
  analysis::CostOptions o;
  o.context = 100;
  auto r = analysis::estimate_cost(cfg, o);
  CHECK(r.pattern == "full");
  CHECK(r.kept_pairs_context == 100 * 101 / 2);
  CHECK(r.kept_pairs_train == 32 * 33 / 2);
  cfg = parse_config(src("configs/tiny.toml"), {"model.vocab_size=65", "model.window=8"});
  r = analysis::estimate_cost(cfg, o);
  CHECK(r.pattern == "window");
  // Brute force over the mask rule of analysis::AttentionMaps::visible (j <= i, i - j < w).
  auto brute = [](int64_t n, int64_t w) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) k += (i - j < w);
    return k;
  };
  CHECK(r.kept_pairs_context == brute(100, 8));
  CHECK(r.kept_pairs_train == brute(32, 8));
  const auto& row = analysis::pattern_cost(train::model_config(cfg.resolved(), 65));
  for (int64_t n : {1, 7, 8, 9, 33}) CHECK(row.kept_pairs(train::model_config(cfg.resolved(), 65), n) == brute(n, 8));
  // Decode at N = 100 reads 8 keys, not 100: QK^T per layer per token = 2·C·8.
  CHECK(r.decode.qk == Approx(2.0 * 2 * 32 * 8));
  // A window wider than the context changes nothing.
  cfg = parse_config(src("configs/tiny.toml"), {"model.vocab_size=65", "model.window=1000"});
  CHECK(analysis::estimate_cost(cfg, o).kept_pairs_context == 100 * 101 / 2);
}

TEST_CASE("cost: kept pairs of every sparse pattern equal the attention module's pattern_stats", "[cost]") {
  // Each pattern as the model resolves it (train::model_config), counted by attn::pattern_stats on
  // the same shape under the options a layer passes (causal, model.window, the pattern).
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"full", {}},
      {"window", {"model.window=8"}},
      {"window", {"model.attention_pattern=window", "model.pattern_local=5"}},
      {"strided", {"model.attention_pattern=strided"}},
      {"strided", {"model.attention_pattern=strided", "model.pattern_stride=4"}},
      {"global", {"model.attention_pattern=global", "model.pattern_global=3"}},
      {"bigbird", {"model.attention_pattern=bigbird", "model.pattern_block_size=8"}},
      {"bigbird", {"model.attention_pattern=bigbird"}},
      {"block_sparse", {"model.attention_pattern=block_sparse", "model.pattern_block_size=8"}},
      {"block_sparse", {"model.attention_pattern=block_sparse", "model.pattern_layout=fixed"}},
      {"strided", {"model.attention_pattern=strided", "model.window=6"}},  // ANDed with the window
  };
  for (const auto& [name, sets_in] : cases) {
    std::vector<std::string> sets = sets_in;
    sets.push_back("model.vocab_size=65");
    const Config cfg = parse_config(src("configs/tiny.toml"), sets);
    analysis::CostOptions o;
    o.context = 100;  // beyond block_size 32: the pattern's absolute positions keep going
    const analysis::CostReport r = analysis::estimate_cost(cfg, o);
    const nn::ModelConfig m = train::model_config(cfg.resolved(), 65);
    attn::AttentionOptions ao;
    ao.causal = true;
    ao.window = m.window;
    if (m.pattern.sparse()) ao.pattern = std::make_shared<const attn::SparsePattern>(m.pattern);
    INFO(name << " " << sets_in.size());
    CHECK(r.pattern == name);
    CHECK(r.kept_pairs_train == attn::pattern_stats({1, 1, 1, 32, 32}, ao).kept_pairs);
    CHECK(r.kept_pairs_context == attn::pattern_stats({1, 1, 1, 100, 100}, ao).kept_pairs);
    // Batch and heads multiply the module's count; the cost is per (row, head).
    CHECK(attn::pattern_stats({2, 4, 2, 32, 32}, ao).kept_pairs == 8 * r.kept_pairs_train);
    // Decode at N = 100: the keys the module lets query 99 read (a 1-row call at offset 99).
    const int64_t keys = attn::pattern_stats({1, 1, 1, 1, 100}, ao).kept_pairs;
    CHECK(r.decode.qk == Approx(2.0 * 2 * 32 * static_cast<double>(keys)));
    CHECK(r.kept_pairs_context <= r.full_pairs_context);
    if (name != "full") CHECK(r.kept_pairs_context < r.full_pairs_context);
  }
}

TEST_CASE("cost: linear attention's chunked pairs, FLOPs and decode state (= make_cache's bytes)", "[cost]") {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"model.linear_chunk=8"},
        std::vector<std::string>{"model.linear_feature=favor", "model.linear_features=16"}}) {
    std::vector<std::string> sets = {"model.vocab_size=65", "model.attention_pattern=linear"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    const Config cfg = parse_config(src("configs/tiny.toml"), sets);
    analysis::CostOptions o;
    o.context = 100;
    const analysis::CostReport r = analysis::estimate_cost(cfg, o);
    INFO(extra.size());
    CHECK(r.pattern == "linear");
    // tiny: L=2, C=32, Hq=4, Hkv=2, hd=8; m = 8 (elu1) or 16 (favor).
    const bool favor = extra.size() == 2, chunk8 = extra.size() == 1;
    const double mf = favor ? 16 : 8;
    // Chunk 64 > T = 32: one 32 x 32 causal block; chunk 8: four 8 x 8 blocks (4 · 36).
    CHECK(r.kept_pairs_train == (chunk8 ? 4 * 36 : 32 * 33 / 2));
    // Decode, per layer: qk = 2·Hq·m, av = 2·Hq·m·Dv + 2·Hkv·m·(Dv + 1); the same at any context.
    CHECK(r.layers[0].decode.qk == Approx(2 * 4 * mf));
    CHECK(r.layers[0].decode.av == Approx(2 * 4 * mf * 8 + 2 * 2 * mf * 9));
    analysis::CostOptions far = o;
    far.context = 5000;
    CHECK(analysis::estimate_cost(cfg, far).decode.total() == Approx(r.decode.total()));
    // No KV cache: the state, S [m, 8] + z [m] per kv head in float64, per layer.
    CHECK(r.kv_cache_bytes_per_token_f32 == 0);
    CHECK(r.decode_state_bytes == static_cast<int64_t>(2 * 8 * 2 * (mf * 8 + mf)));
    CHECK(r.kv_cache_bytes_per_sequence_f32 == r.decode_state_bytes);
    const auto model = train::build_model(cfg.resolved(), 65);
    for (int64_t batch : {1, 3}) {
      const nn::ModelCache cache = model->make_cache(batch, o.context);
      CHECK(cache.bytes() == batch * r.decode_state_bytes);
    }
  }
}

TEST_CASE("cost: training FLOPs equal qkv bench's count (plus the diagonal it leaves out)", "[cost][long]") {
  for (const char* name : {"S", "M"}) {
    // Batch 2 keeps the measured steps short; the count scales with B·T either way.
    const Config cfg = parse_config(src(std::string("configs/bench/") + name + ".toml"), {"train.batch_size=2"});
    const auto bench = train::bench_step(cfg, 1, 0);
    const analysis::CostReport r = analysis::estimate_cost(cfg);
    const double BT = static_cast<double>(r.batch * r.train_tokens);
    const double diagonal = 6.0 * static_cast<double>(r.model.n_layer * r.model.n_embd) * BT;
    INFO(name << ": bench " << bench.flops_per_step << ", cost " << r.train_flops_per_step);
    CHECK(bench.params == r.params);
    CHECK(r.train_flops_per_step == Approx(bench.flops_per_step + diagonal).epsilon(1e-12));
    // The split adds up, and training is three forwards.
    CHECK(r.train.total() ==
          Approx(r.train.projections + r.train.qk + r.train.av + r.train.mlp + r.train.head + r.train.norm));
  }
}

TEST_CASE("cost: KV-cache bytes are exactly what make_cache allocates", "[cost]") {
  for (const char* path : {"configs/tiny.toml", "configs/llama_tiny.toml", "configs/bench/S.toml"}) {
    const Config cfg = parse_config(src(path), {"model.vocab_size=1024"});
    analysis::CostOptions o;
    o.context = 256;  // every buffer a whole number of the allocator's granules
    const analysis::CostReport r = analysis::estimate_cost(cfg, o);
    const auto model = train::build_model(cfg.resolved(), 1024);
    for (int64_t batch : {1, 3}) {
      const int64_t before = allocator_stats().bytes_in_use;
      const nn::ModelCache cache = model->make_cache(batch, o.context);
      const int64_t allocated = allocator_stats().bytes_in_use - before;
      INFO(path << " batch " << batch);
      CHECK(allocated == batch * r.kv_cache_bytes_per_sequence_f32);
      CHECK(r.kv_cache_bytes_per_sequence_f32 == r.kv_cache_bytes_per_token_f32 * 256);
      CHECK(r.kv_cache_bytes_per_token_bf16 * 2 == r.kv_cache_bytes_per_token_f32);
      // GQA shrinks the cache by Hq / Hkv.
      CHECK(r.kv_cache_bytes_per_token_mha_f32 * r.model.n_kv_head == r.kv_cache_bytes_per_token_f32 * r.model.n_head);
    }
  }
}

namespace {

void check_peak(const std::string& path, const std::vector<std::string>& sets) {
  const Config cfg = parse_config(src(path), sets);
  const auto bench = train::bench_step(cfg, 1, 1);
  const analysis::CostReport r = analysis::estimate_cost(cfg);
  const double ratio = static_cast<double>(r.peak_step_bytes) / static_cast<double>(bench.allocator_peak_bytes);
  INFO(path << ": model " << r.peak_step_bytes << " bytes, allocator peak " << bench.allocator_peak_bytes << " (ratio "
            << ratio << ")");
  CHECK(ratio > 0.85);
  CHECK(ratio < 1.15);
}

}  // namespace

TEST_CASE(
    "cost: peak tensor bytes of a training step within 15% of the allocator's on S M and llama_tiny, "
    "batched and by rows",
    "[cost][long]") {
  check_peak("configs/bench/S.toml", {});
  check_peak("configs/bench/S.toml", {"train.recompute=true"});
  check_peak("configs/bench/M.toml", {"train.batch_size=2"});
  check_peak("configs/bench/M.toml", {"train.batch_size=2", "train.recompute=true"});
  // The other attention path (RoPE: rotated q, k and a head-major O with its token-major copy) and
  // the llama family (separate projections, RMSNorm, SwiGLU, untied head, GQA 8:2).
  const std::vector<std::string> llama = {"data.random_tokens=true", "model.vocab_size=512"};
  check_peak("configs/llama_tiny.toml", llama);
  auto with = [&](std::vector<std::string> s, const std::string& extra) {
    s.push_back(extra);
    return s;
  };
  check_peak("configs/llama_tiny.toml", with(llama, "train.recompute=true"));
  check_peak("configs/llama_tiny.toml", with(with(llama, "model.family=gpt2"), "model.position=rope"));
  // The batched step of standard numerics (the cases above run the CPU default, invariant: the
  // row tree's one row at a time).
  check_peak("configs/bench/S.toml", {"train.numerics=standard"});
  check_peak("configs/bench/M.toml", {"train.batch_size=2", "train.numerics=standard"});
  check_peak("configs/llama_tiny.toml", with(llama, "train.numerics=standard"));
  check_peak("configs/bench/S.toml", {"train.grad_accum=4"});  // 48 rows per step: a deeper tree
}

TEST_CASE("cost: peak tensor bytes of a training step within 15% of the allocator's (G)", "[cost][slow]") {
  check_peak("configs/bench/G.toml", {"train.batch_size=1"});
}
