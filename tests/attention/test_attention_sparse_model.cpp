// Sparse attention patterns at the model level: model.attention_pattern and its keys in the
// config (with one-line errors naming the key), a model passing its pattern to every attention
// call including KV-cache decode, a tiny model per pattern training, and leakcheck catching the
// planted sparse faults. The kernels and layouts are tested in test_attention_sparse.cpp.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "analysis/leakcheck.h"
#include "attention/attention.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/trainer.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;

namespace {

Config sparse_config(const std::string& pattern, const std::vector<std::string>& sets = {}) {
  std::string text =
      "[model]\nfamily = \"llama\"\nn_layer = 1\nn_head = 4\nn_kv_head = 2\nn_embd = 32\nblock_size = 32\n"
      "vocab_size = 40\n[data]\nrandom_tokens = true\n";
  std::vector<std::string> all = {"model.attention_pattern=" + pattern};
  for (const auto& x : sets) all.push_back(x);
  return parse_config_text(text, "sparse.toml", all);
}

}  // namespace

TEST_CASE("sparse: model.attention_pattern and its keys resolve, and bad ones name the key",
          "[attention][sparse][config]") {
  const auto cfg = [](const std::string& pattern, const std::vector<std::string>& sets = {}) {
    return train::model_config(sparse_config(pattern, sets).resolved(), 40);
  };
  CHECK(cfg("full").pattern.kind == Pattern::full);
  const nn::ModelConfig st = cfg("strided");
  CHECK(st.pattern.kind == Pattern::strided);
  CHECK(st.pattern.stride == 6);                  // ceil(sqrt(32)), fixed at the model so decode keeps it
  CHECK(cfg("bigbird").pattern.block_size == 8);  // clamp(32 / 4, 1, 64)
  const nn::ModelConfig gl = cfg("global", {"model.pattern_global_tokens=0, 9,17", "model.pattern_local=4"});
  CHECK(gl.pattern.global_tokens == std::vector<int64_t>{0, 9, 17});
  CHECK(gl.pattern.local == 4);
  CHECK(cfg("block_sparse", {"model.pattern_layout=fixed"}).pattern.layout == "fixed");
  using Catch::Contains;
  CHECK(cfg("linear").pattern.kind == Pattern::full);  // linear attention: no sparse pattern, and no pattern key
  CHECK_THROWS_WITH(sparse_config("linear", {"model.pattern_stride=4"}), Contains("model.pattern_stride"));
  CHECK_THROWS_WITH(sparse_config("dilated"), Contains("model.attention_pattern"));
  CHECK_THROWS_WITH(sparse_config("window", {"model.pattern_stride=4"}), Contains("model.pattern_stride"));
  CHECK_THROWS_WITH(sparse_config("strided", {"model.pattern_global_tokens=3"}),
                    Contains("model.pattern_global_tokens"));
  CHECK_THROWS_WITH(sparse_config("global", {"model.pattern_global_tokens=3,40"}),
                    Contains("model.pattern_global_tokens"));
  CHECK_THROWS_WITH(sparse_config("global", {"model.pattern_global_tokens=3,x"}),
                    Contains("model.pattern_global_tokens"));
  CHECK_THROWS_WITH(sparse_config("bigbird", {"model.pattern_block_size=-1"}), Contains("model.pattern_block_size"));
  CHECK_THROWS_WITH(sparse_config("block_sparse", {"model.pattern_layout=/nonexistent/layout.txt"}),
                    Contains("model.pattern_layout"));
  // A checkpoint's model without the keys (an old one) is full attention; the keys round-trip.
  const Config back = parse_config_text(to_toml(sparse_config("bigbird", {"model.pattern_seed=7"}).resolved()), "rt");
  CHECK(name_of(back.model.attention_pattern) == "bigbird");
  CHECK(back.model.pattern_seed == 7);
  const auto d = train::model_difference(cfg("full"), cfg("window"));
  REQUIRE(d);
  CHECK(d->key == "model.attention_pattern");
  CHECK(d->a == "\"full\"");
  // each parameter is named by its own key (checkpoint saving and --resume ask model_difference)
  const std::pair<const char*, std::vector<std::string>> keyed[] = {
      {"model.pattern_stride", {"model.pattern_stride=4"}},
      {"model.pattern_local", {"model.pattern_local=3"}},
      {"model.pattern_global", {"model.pattern_global=2"}},
      {"model.pattern_global_tokens", {"model.pattern_global_tokens=1,2"}},
      {"model.pattern_random_blocks", {"model.pattern_random_blocks=1"}},
      {"model.pattern_block_size", {"model.pattern_block_size=4"}},
      {"model.pattern_seed", {"model.pattern_seed=9"}}};
  for (const auto& [key, sets] : keyed) {
    INFO(key);
    const char* pattern = std::string(key) == "model.pattern_stride"  ? "strided"
                          : std::string(key) == "model.pattern_local" ? "window"
                                                                      : "bigbird";
    const auto diff = train::model_difference(cfg(pattern, sets), cfg(pattern));
    REQUIRE(diff);
    CHECK(diff->key == key);
  }
}

TEST_CASE("sparse: a model passes its pattern to every attention call, KV-cache decode included",
          "[attention][sparse][long]") {
  for (const char* pattern : {"window", "strided", "global", "bigbird", "block_sparse"}) {
    INFO(pattern);
    const nn::ModelConfig mc = train::model_config(sparse_config(pattern).resolved(), 40);
    nn::DecoderModel model(mc);
    model.init_weights(3);
    model.eval();
    nn::ModelConfig full_cfg = mc;
    full_cfg.pattern = SparsePattern{};
    nn::DecoderModel full(full_cfg);
    full.init_weights(3);
    full.eval();
    std::vector<int64_t> ids(32);
    for (int64_t t = 0; t < 32; ++t) ids[t] = (t * 7 + 3) % 40;
    const Tensor x = from_vector_i64(ids, {1, 32});
    autograd::NoGradGuard ng;
    nn::ForwardArgs a;
    a.ids = x;
    const Tensor y = model.forward(a), yf = full.forward(a);
    CHECK(max_abs_diff(y, yf) > 1e-4);  // the pattern changed the computation
    // and every check that applies passes; the others are named as not applicable
    const auto checks = analysis::run_model_checks(model, {});
    for (const auto& c : checks) {
      INFO(c.name << " " << c.value << " / " << c.threshold << " " << c.detail);
      CHECK(c.pass);
    }
    const auto na = analysis::not_applicable_checks(mc);
    const bool anchored = std::string(pattern) != "window" && std::string(pattern) != "strided";
    size_t shift_checks = 0;  // padding/packing invariance (the permutation checks are skipped too: positions)
    for (const auto& [name, why] : na) shift_checks += name.rfind("padding", 0) == 0 || name.rfind("packing", 0) == 0;
    CHECK(shift_checks == (anchored ? 3u : 0u));
    for (const auto& [name, why] : na)
      for (const auto& c : checks) CHECK(c.name != name);
    bool has_decode = false, has_future = false;
    for (const auto& c : checks) {
      has_decode = has_decode || c.name == "kv_decode";
      has_future = has_future || c.name == "future_token_perturbation";
      if (c.name == "future_token_perturbation") CHECK(c.value == 0.0);  // exactly zero under causal
    }
    CHECK(has_decode);
    CHECK(has_future);
  }
}

TEST_CASE("sparse: a tiny model per pattern trains (the loss falls)", "[attention][sparse][slow]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("qkv_test_sparse_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 300; ++i) text += (i % 3 ? "abcabcabd " : "the cat sat ");
  std::ofstream(dir / "corpus.txt") << text;
  for (const char* pattern : {"window", "strided", "global", "bigbird", "block_sparse"}) {
    INFO(pattern);
    Config c;
    c.model.family = nn::Family::gpt2;
    c.model.n_layer = 1;
    c.model.n_head = 2;
    c.model.n_embd = 16;
    c.model.block_size = 32;
    c.model.attention_pattern = choose(kAttentionPatterns, pattern, "model.attention_pattern");
    c.data.path = (dir / "corpus.txt").string();
    c.data.tokenizer = TokenizerKind::character;
    c.data.separator = DocSeparator::none;
    c.train.batch_size = 4;
    c.train.max_steps = 40;
    c.train.lr = 1e-2;
    c.train.eval_interval = 40;
    c.train.eval_batches = 1;
    c.train.log_interval = 1;
    c.train.out_dir = (dir / pattern).string();
    const auto s = train::run_training(c.resolved(), {.progress = false});
    std::ifstream in(c.train.out_dir + "/metrics.jsonl");
    std::string first;
    std::getline(in, first);
    const double l0 = nlohmann::json::parse(first)["loss"].get<double>();
    CHECK(s.loss < l0 - 0.5);
  }
  fs::remove_all(dir);
}

TEST_CASE("sparse: leakcheck catches the planted sparse faults on the sparse probes",
          "[attention][sparse][leakcheck][long]") {
  nn::ModelConfig u;
  u.n_layer = 1;
  u.n_embd = 16;
  u.n_head = 2;
  u.n_kv_head = 2;
  u.block_size = 12;
  u.vocab_size = 29;
  u.ffn_hidden = 32;
  nn::DecoderModel user(u);
  user.init_weights(1);
  auto models = analysis::self_test_models(user);
  REQUIRE(models.size() == 5);  // user, llama probe, linear probe, the two sparse probes
  REQUIRE(models[3].name == "probe-strided");
  REQUIRE(models[4].name == "probe-global");
  auto find = [](const std::vector<analysis::LeakCheck>& v, const std::string& n) {
    for (const auto& c : v)
      if (c.name == n) return c;
    FAIL("no check " << n);
    return analysis::LeakCheck{};
  };
  const analysis::LeakCheckOptions o;
  for (int m : {2, 3}) {  // clean
    for (const auto& c : analysis::run_model_checks(*models[m].model, o)) {
      INFO(models[m].name << " " << c.name << " " << c.value << " " << c.detail);
      CHECK(c.pass);
    }
  }
  {
    const analysis::PlantedFault f(*models[3].model, analysis::Fault::strided_offset_off_by_one);
    const auto checks = analysis::run_model_checks(*models[3].model, o);
    const auto c = find(checks, "reference_attention");
    INFO(c.detail);
    CHECK_FALSE(c.pass);
    CHECK(c.value > 10 * c.threshold);
    CHECK_FALSE(find(checks, "mask.kernels_vs_naive").pass);
  }
  {
    const analysis::PlantedFault f(*models[4].model, analysis::Fault::global_reads_future);
    const auto checks = analysis::run_model_checks(*models[4].model, o);
    const auto c = find(checks, "future_token_perturbation");
    INFO(c.detail);
    CHECK_FALSE(c.pass);
    CHECK(c.value > 1e-4);
  }
  // A sparse fault planted on a model without the pattern changes nothing the model computes; only
  // kernel_probes, which runs every pattern whatever the model's, sees it.
  {
    const analysis::PlantedFault f(*models[1].model, analysis::Fault::global_reads_future);
    for (const auto& c : analysis::run_model_checks(*models[1].model, o)) CHECK(c.pass == (c.name != "kernel_probes"));
  }
}
