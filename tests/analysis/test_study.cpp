// `qkv study` (analysis/study.h): variant parsing, a tiny study of full vs window:8 with its
// report, JSON fields and resume.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "analysis/study.h"
#include "train/config_schema.h"

using namespace qkv;

namespace {
std::string src(const std::string& rel) { return std::string(QKV_SOURCE_DIR) + "/" + rel; }
}  // namespace

TEST_CASE("study: variant specs map through the table", "[study]") {
  const auto v = analysis::parse_variants("full, window:64,window:8");
  REQUIRE(v.size() == 3);
  CHECK(v[0].name == "full");
  CHECK(v[0].overrides == std::vector<std::string>{"model.window=0", "model.attention_pattern=full"});
  CHECK(v[1].overrides == std::vector<std::string>{"model.attention_pattern=full", "model.window=64"});
  const auto s = analysis::parse_variants("strided:16,linear");
  CHECK(s[0].overrides ==
        std::vector<std::string>{"model.window=0", "model.attention_pattern=strided", "model.pattern_stride=16"});
  CHECK(s[1].overrides == std::vector<std::string>{"model.window=0", "model.attention_pattern=linear"});
  CHECK_THROWS_WITH(analysis::parse_variants("full,sparse"), Catch::Contains("unknown variant 'sparse'"));
  CHECK_THROWS_WITH(analysis::parse_variants("window"), Catch::Contains("window needs a parameter"));
  CHECK_THROWS_WITH(analysis::parse_variants("full:3"), Catch::Contains("full takes no parameter"));
  CHECK_THROWS_WITH(analysis::parse_variants("window:x"), Catch::Contains("an integer in [1, 1048576]"));
  CHECK_THROWS_WITH(analysis::parse_variants("full,full"), Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(analysis::parse_variants(""), Catch::Contains("no variant"));
}

TEST_CASE("study: a tiny study of full vs window:8, its report, and resume", "[study][slow]") {
  const std::string dir = (std::filesystem::temp_directory_path() / "qkv_test_study").string();
  std::filesystem::remove_all(dir);
  analysis::StudyOptions o;
  o.dir = dir;
  o.lengths = {8, 24, 64};        // 64 > block_size 32: learned positions cannot go there
  o.budget_tokens = 8 * 32 * 12;  // 12 steps of batch 8 x 32 tokens
  o.decode_tokens = 4;
  o.eval_tokens = 256;
  std::vector<std::string> lines;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  const std::vector<std::string> sets = {"data.path=" + src("data/corpus/tinyshakespeare.txt"), "train.log_interval=4"};
  const auto variants = analysis::parse_variants("full,window:8");
  const analysis::StudyResult r = analysis::run_study(src("configs/tiny.toml"), sets, variants, o);
  REQUIRE(r.variants.size() == 2);
  for (const auto& v : r.variants) {
    INFO(v.name);
    CHECK_FALSE(v.resumed);
    CHECK(v.steps == 12);
    CHECK(v.train_tokens == 12 * 8 * 32);
    CHECK(std::isfinite(v.val_loss));
    CHECK(v.val_loss < 4.5);  // below ln(65) = 4.17 plus slack: it trained
    CHECK(v.tokens_per_s > 0);
    CHECK(v.peak_rss_bytes > 0);
    CHECK_FALSE(v.curve.empty());
    REQUIRE(v.lengths.size() == 3);
    CHECK(v.lengths[0].measured);
    CHECK(v.lengths[1].measured);
    CHECK(std::isfinite(v.lengths[0].prefill_ms));
    CHECK(v.lengths[0].kv_cache_bytes > 0);
    CHECK(std::isfinite(v.lengths[1].val_loss));
    CHECK_FALSE(v.lengths[2].measured);
    CHECK(v.lengths[2].skipped.find("block_size") != std::string::npos);
    CHECK_FALSE(std::isfinite(v.lengths[2].val_loss));
    CHECK_FALSE(v.checks.empty());
    for (const auto& c : v.checks) {
      INFO(c.name << " " << c.value);
      CHECK(c.pass);
    }
    REQUIRE(v.edges.size() == 3);
    for (const auto& e : v.edges) {
      INFO(e.name << ": " << e.got);
      CHECK(e.pass);
    }
    CHECK(std::filesystem::exists(dir + "/variants/" + (v.name == "full" ? "full" : "window_8") + "/result.json"));
  }
  CHECK(r.variants[0].val_loss_gap == 0.0);
  CHECK(std::isfinite(r.variants[1].val_loss_gap));
  // Same KV cache bytes at the same length: the window does not shrink make_cache's buffers.
  CHECK(r.variants[0].lengths[0].kv_cache_bytes == r.variants[1].lengths[0].kv_cache_bytes);
  analysis::write_study_report(r);
  std::ifstream html(dir + "/index.html");
  const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("window:8") != std::string::npos);
  const auto j = analysis::study_json(r);
  REQUIRE(j["variants"].size() == 2);
  for (const char* k :
       {"name", "val_loss", "tokens_per_s", "peak_rss_bytes", "wall_s", "val_loss_gap", "lengths", "checks", "edges"})
    CHECK(j["variants"][0].contains(k));
  CHECK(j["variants"][1]["name"] == "window:8");

  // Resume: both variants come from their result files, with the same numbers.
  lines.clear();
  const analysis::StudyResult again = analysis::run_study(src("configs/tiny.toml"), sets, variants, o);
  REQUIRE(again.variants.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(again.variants[i].resumed);
    CHECK(again.variants[i].val_loss == r.variants[i].val_loss);
    CHECK(again.variants[i].lengths[1].val_loss == r.variants[i].lengths[1].val_loss);
  }
  CHECK(lines.size() == 2);
  // A variant without its result file (an interrupted run) trains again; the other is kept.
  std::filesystem::remove(dir + "/variants/window_8/result.json");
  lines.clear();
  const analysis::StudyResult third = analysis::run_study(src("configs/tiny.toml"), sets, variants, o);
  CHECK(third.variants[0].resumed);
  CHECK_FALSE(third.variants[1].resumed);
  std::filesystem::remove_all(dir);
}

TEST_CASE("study: every pattern variant, bare or with its parameter, gives a config that validates", "[study]") {
  // The variant table's keys are train/config.h's: parse + validate (which resolves the pattern as
  // model_factory does) accepts each, and the key each parameter sets really lands in the config.
  const auto variants = analysis::parse_variants(
      "full,window:16,strided,strided:8,global,global:3,bigbird,bigbird:8,block_sparse,block_sparse:8,linear");
  REQUIRE(variants.size() == 11);
  std::vector<Config> cfgs;
  for (const auto& v : variants) {
    INFO(v.name);
    Config c;
    REQUIRE_NOTHROW(c = parse_config(src("configs/tiny.toml"), v.overrides));
    REQUIRE_NOTHROW(validate(c, "variant " + v.name));
    cfgs.push_back(c);
  }
  CHECK(name_of(cfgs[0].model.attention_pattern) == "full");
  CHECK(cfgs[1].model.window == 16);
  CHECK(name_of(cfgs[2].model.attention_pattern) == "strided");
  CHECK(cfgs[2].model.pattern_stride == 0);  // auto
  CHECK(cfgs[3].model.pattern_stride == 8);
  CHECK(name_of(cfgs[5].model.attention_pattern) == "global");
  CHECK(cfgs[5].model.pattern_global == 3);
  CHECK(name_of(cfgs[7].model.attention_pattern) == "bigbird");
  CHECK(cfgs[7].model.pattern_block_size == 8);
  CHECK(name_of(cfgs[9].model.attention_pattern) == "block_sparse");
  CHECK(cfgs[9].model.pattern_block_size == 8);
  CHECK(name_of(cfgs[10].model.attention_pattern) == "linear");
  CHECK(cfgs[10].model.window == 0);
  // An unknown variant still fails, in one line, before any training.
  try {
    analysis::parse_variants("full,performer");
    FAIL("no error");
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    CHECK(msg.find("unknown variant 'performer'") != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("study: a linear variant measures every length from an emptied state", "[study]") {
  // Each length prefills twice and decodes; a linear state not cleared between the prefills ran
  // on past block_size ("position 64 is outside model.block_size") at the second length.
  const std::string dir = (std::filesystem::temp_directory_path() / "qkv_test_study_linear").string();
  std::filesystem::remove_all(dir);
  analysis::StudyOptions o;
  o.dir = dir;
  o.lengths = {8, 16, 24};  // 2 × 24 + 4 > block_size 32: a state carried over would overflow
  o.budget_tokens = 8 * 32 * 2;
  o.decode_tokens = 4;
  o.eval_tokens = 64;
  o.run_checks = false;
  const std::vector<std::string> sets = {"data.path=" + src("data/corpus/tinyshakespeare.txt")};
  const analysis::StudyResult r =
      analysis::run_study(src("configs/tiny.toml"), sets, analysis::parse_variants("linear"), o);
  REQUIRE(r.variants.size() == 1);
  const auto& v = r.variants[0];
  REQUIRE(v.lengths.size() == 3);
  for (const auto& l : v.lengths) {
    INFO(l.length);
    CHECK(l.measured);
    CHECK(std::isfinite(l.decode_ms_per_token));
    // The state: S [8, 8] + z [8] per kv head (2), float64, per layer (2); the same at every length.
    CHECK(l.kv_cache_bytes == 2 * 2 * 8 * (8 * 8 + 8));
  }
  std::filesystem::remove_all(dir);
}
