// Exact or refused: numbers that would wrap, vanish or mean something else are refused by name, at
// the one place each kind is read — the command-line parser (app/options.h), the config's key
// table (train/config.cpp) and model rules (nn::ModelConfig::validate), and the pattern's owner
// (attn::SparsePattern::validate_for).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/options.h"
#include "attention/pattern/pattern.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "build_dir.h"

using namespace qkv;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

Config parse(const std::vector<std::string>& overrides) { return parse_config_text("", "x.toml", overrides); }

struct Run {
  int rc = -1;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `qkv ARGS` with stdout dropped; ARGS is shell text (quote empty strings as '').
Run qkv_cli(const std::string& args) {
  const std::string err = fs::temp_directory_path() / ("qkv_refusals_" + std::to_string(::getpid()) + ".err");
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv " + args + " >/dev/null 2>" + err + " </dev/null";
  const int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(err)};
}

}  // namespace

TEST_CASE("parse_int and parse_real read the whole text or refuse it by name", "[refusals][cli]") {
  const IntRange r{-5, 100};
  CHECK(app::parse_int("--n", "0", r) == 0);
  CHECK(app::parse_int("--n", "+7", r) == 7);
  CHECK(app::parse_int("--n", "-5", r) == -5);
  CHECK(app::parse_int("--n", "100", r) == 100);
  for (const char* bad : {"", " 1", "1 ", "12abc", "1e2", "0x10", "101", "-6", "18446744073709551621",
                          "-9223372036854775809", "9223372036854775808", "nan", "+", "-", "+-5", "++5", "-+5"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(app::parse_int("--n", bad, r),
                      std::string("--n must be an integer in [-5, 100]; got \"") + bad + "\"");
  }
  CHECK(app::parse_int("--seed", "9223372036854775807", {0, kIntMax}) == kIntMax);
  // An embedded NUL ends C's number readers early; the whole text must still be the number.
  CHECK_THROWS(app::parse_int("--n", std::string_view("12\0x", 4), r));
  CHECK_THROWS(app::parse_real("--p", std::string_view("0.5\0x", 5), {0, 1}));

  const RealRange unit{0, 1, true, false};
  CHECK(app::parse_real("--p", "1", unit) == 1.0);
  CHECK(app::parse_real("--p", "0.25", unit) == 0.25);
  CHECK(app::parse_real("--p", "1e-300", unit) == 1e-300);
  for (const char* bad :
       {"", "0", "1.0000001", "-0.5", "nan", "NaN", "inf", "-inf", "1e999", " 0.5", "0.5 ", "0.5x", "infinity"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(app::parse_real("--p", bad, unit),
                      std::string("--p must be a finite number in (0, 1]; got \"") + bad + "\"");
  }
}

TEST_CASE("every numeric config key states its range: values past it are refused naming the key",
          "[refusals][config]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"train.warmup_steps=9223372036854775807", "train.warmup_steps must be an integer in [0, 1000000000000]"},
      {"train.keep_last=9223372036854775807", "train.keep_last must be an integer in [1, 1048576]"},
      {"train.grad_accum=9223372036854775807", "train.grad_accum must be an integer in [1, 1048576]"},
      {"train.eval_batches=9223372036854775807", "train.eval_batches must be an integer in [1, 1048576]"},
      {"train.threads=9223372036854775807", "train.threads must be an integer in [0, 4096]"},
      {"train.lr=1e30", "train.lr must be a finite number in [0, 10], got 1e+30"},
      {"train.lr=nan", "train.lr must be a finite number in [0, 10], got nan"},
      {"train.beta2=1.0", "train.beta2 must be a finite number in [0, 1), got 1.0"},
      {"train.zero=2", "train.zero must be an integer in [0, 1], got 2"},
      {"data.bpe_vocab_size=100", "data.bpe_vocab_size must be an integer in [256, 1048576], got 100"},
      {"sample.top_p=0", "sample.top_p must be a finite number in (0, 1], got 0.0"},
      {"sample.max_new_tokens=9223372036854775807", "sample.max_new_tokens must be an integer in [0, 10000000]"},
      {"model.n_layer=1000000", "model.n_layer must be an integer in [1, 1024], got 1000000"},
      {"model.block_size=9223372036854775807", "model.block_size must be an integer in [1, 1048576]"},
      {"model.norm_eps=1e30", "model.norm_eps must be a finite number in (0, 1], got 1e+30"},
      {"model.rope_theta=1e30", "model.rope_theta must be a finite number in (0, 1000000000000], got 1e+30"},
      {"model.init_std=1e30", "model.init_std must be a finite number in [0, 1], got 1e+30"},
      {"model.pattern_random_blocks=9223372036854775807", "model.pattern_random_blocks must be an integer in"},
  };
  for (const auto& [assignment, message] : bad) {
    CAPTURE(assignment);
    CHECK_THROWS_WITH(parse({assignment}), Contains("x.toml: " + message));
  }
  // Each range's ends are accepted.
  CHECK_NOTHROW(parse({"train.keep_last=1048576", "train.lr=10", "train.zero=1", "sample.top_p=1", "model.init_std=1",
                       "model.n_layer=1"}));
  // The CLI options that set a config key's value take the key's range.
  CHECK(int_key_range("sample.max_new_tokens").hi == 10'000'000);
  CHECK(real_key_range("sample.top_p").lo_open);
}

TEST_CASE("pattern parameters must mean something in the model's context (SparsePattern::validate_for)",
          "[refusals][attention][config]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"model.attention_pattern=strided", "model.pattern_stride=9223372036854775807"},
       "model.pattern_stride must be an integer in [0, 1048576]"},
      {{"model.attention_pattern=strided", "model.pattern_stride=65"},
       "model.pattern_stride = 65 exceeds model.block_size = 64 (strided would be full attention)"},
      {{"model.attention_pattern=window", "model.pattern_local=65"}, "model.pattern_local = 65 exceeds"},
      {{"model.attention_pattern=global", "model.pattern_global=65"}, "model.pattern_global = 65 exceeds"},
      {{"model.attention_pattern=bigbird", "model.pattern_block_size=24"},
       "model.pattern_block_size = 24 does not divide model.block_size = 64"},
      {{"model.attention_pattern=bigbird", "model.pattern_block_size=16", "model.pattern_random_blocks=5"},
       "model.pattern_random_blocks = 5 exceeds the 4 blocks"},
      {{"model.attention_pattern=full", "model.linear_feature=relu"},
       "model.linear_feature = \"relu\" is only used by model.attention_pattern = linear, not full"},
      {{"model.attention_pattern=full", "model.linear_chunk=16"}, "model.linear_chunk = 16 is only used"},
      {{"model.attention_pattern=strided", "model.pattern_seed=3"},
       "model.pattern_seed = 3 is only used by model.attention_pattern = bigbird, not strided"},
      {{"model.attention_pattern=window", "model.pattern_global=2"}, "model.pattern_global = 2 is only used"},
      {{"model.attention_pattern=global", "model.pattern_random_blocks=1"},
       "model.pattern_random_blocks = 1 is only used"},
  };
  for (const auto& [assignments, message] : bad) {
    CAPTURE(assignments);
    CHECK_THROWS_WITH(parse(assignments), Contains(message));
  }
  // The edges: each parameter at 1 and equal to block_size is a model.
  for (const std::vector<std::string>& ok : std::vector<std::vector<std::string>>{
           {"model.attention_pattern=strided", "model.pattern_stride=64", "model.pattern_local=64"},
           {"model.attention_pattern=strided", "model.pattern_stride=1", "model.pattern_local=1"},
           {"model.attention_pattern=window", "model.pattern_local=1"},
           {"model.attention_pattern=global", "model.pattern_global=64"},
           {"model.attention_pattern=global", "model.pattern_global=0"},
           {"model.attention_pattern=bigbird", "model.pattern_block_size=64", "model.pattern_random_blocks=1"},
           {"model.attention_pattern=block_sparse", "model.pattern_block_size=1"},
           {"model.attention_pattern=linear", "model.linear_feature=relu", "model.linear_chunk=16"}}) {
    CAPTURE(ok);
    CHECK_NOTHROW(parse(ok));
  }
  // A layout in which a query block sees no key block at or before its own.
  const std::string layout = fs::temp_directory_path() / ("qkv_refusals_layout_" + std::to_string(::getpid()));
  std::ofstream(layout) << "10\n01\n";
  CHECK_NOTHROW(
      parse({"model.attention_pattern=block_sparse", "model.pattern_block_size=32", "model.pattern_layout=" + layout}));
  std::ofstream(layout) << "10\n00\n";
  CHECK_THROWS_WITH(
      parse({"model.attention_pattern=block_sparse", "model.pattern_block_size=32", "model.pattern_layout=" + layout}),
      Contains("query block 1 sees no key block at or before its own"));
  std::ofstream(layout) << "01\n01\n";  // block 0 sees only the future: nothing under the causal mask
  CHECK_THROWS_WITH(
      parse({"model.attention_pattern=block_sparse", "model.pattern_block_size=32", "model.pattern_layout=" + layout}),
      Contains("query block 0 sees no key block"));
  fs::remove(layout);
  // The bench spells the parameters as its options.
  attn::SparsePattern p;
  p.kind = attn::Pattern::strided;
  p.stride = 300;
  CHECK_THROWS_WITH(p.validate_for(256, "--pattern-", "--n"), Contains("--pattern-stride = 300 exceeds --n = 256"));
  p.kind = attn::Pattern::bigbird;
  p.stride = 0;
  p.block_size = 48;
  CHECK_THROWS_WITH(p.validate_for(256, "--pattern-", "--n"), Contains("--pattern-block-size = 48 does not divide"));
}

TEST_CASE("the CLI refuses empty, non-finite, wrapping and out-of-range numbers by name, exit 2, one line",
          "[refusals][cli]") {
  if (!fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  // Options are parsed before any file is opened, so no checkpoint or config needs to exist.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"sample --checkpoint x.h5 --temperature ''", "--temperature"},
      {"sample --checkpoint x.h5 --seed ''", "--seed"},
      {"sample --checkpoint x.h5 --top-k ''", "--top-k"},
      {"sample --checkpoint x.h5 --seed 18446744073709551621", "--seed"},
      {"sample --checkpoint x.h5 --max-new-tokens 18446744073709551621", "--max-new-tokens"},
      {"sample --checkpoint x.h5 --top-p nan", "--top-p"},
      {"train --config x.toml --resume ''", "--resume"},
      {"cost --config x.toml --context 18446744073709551621", "--context"},
      {"gradcheck --atol inf", "--atol"},
      {"gradcheck --atol -1", "--atol"},
      {"gradcheck --config x.toml --directions 1e9", "--directions"},
      {"leakcheck --config x.toml --max-ngram-share -1", "--max-ngram-share"},
      {"bench --what attention --pattern strided --pattern-stride 18446744073709551621", "--pattern-stride"},
      {"bench --what attention --pattern strided --pattern-stride 300 --n 256", "--pattern-stride"},
      {"bench --steps 1000000000", "--steps"},
      {"bench --what attention --n 256 ''", "--n"},
      {"heads --checkpoint x.h5 --data y.txt --windows 1e9", "--windows"},
      {"prepare --input x.txt --out y.h5 --tokenizer bpe --bpe-vocab-size 200000000", "--bpe-vocab-size"},
      {"study --config x.toml --variants full --lengths ''", "--lengths"},
      {"study --config x.toml --variants full --lengths 256,,1024", "--lengths"},
      {"study --config x.toml --variants full, --budget-tokens 1", "--variants"},
      {"study --config x.toml --variants window:0", "--variants"},
      {"export --checkpoint x.h5 --out ''", "--out"},
  };
  for (const auto& [args, option] : cases) {
    const Run r = qkv_cli(args);
    INFO(args << ": rc " << r.rc << ", stderr: " << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find(option) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}
