// The enumerated config settings: each is read into its enum once, at load, through one table of
// spellings; a wrong spelling is one line naming the key and every accepted spelling; to_toml
// writes the same spellings back; and a checkpoint written before the settings became enums
// (tests/fixtures/config_enums_v1.h5) still loads with the same values and the same config text.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/byte_level_bpe.h"
#include "data/dataset.h"
#include "data/h5.h"
#include "tensor/error.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/config_schema.h"
#include "train/model_factory.h"
#include "train/schedule.h"

using namespace qkv;
using Catch::Contains;

namespace {

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_text(text, "configs/x.toml", overrides);
}

// Every enumerated key with its accepted spellings, written out here by hand (the reference the
// tables are checked against), and whether "" (the family default) is accepted too.
struct EnumKey {
  const char* section;
  const char* key;
  std::vector<std::string> names;
  bool empty_ok = false;
};
const std::vector<EnumKey>& enum_keys() {
  static const std::vector<EnumKey> keys = {
      {"model", "family", {"gpt2", "llama"}},
      {"model", "position", {"learned", "rope", "sinusoidal", "alibi", "none"}, true},
      {"model", "norm", {"layernorm", "rmsnorm"}, true},
      {"model", "activation", {"gelu_tanh", "gelu", "swiglu", "relu"}, true},
      {"model", "attn_kernel", {"fused", "reference"}},
      {"model", "attention_pattern", {"full", "window", "strided", "global", "bigbird", "block_sparse", "linear"}},
      {"model", "linear_feature", {"elu1", "relu", "favor"}},
      {"data", "tokenizer", {"char", "byte", "bpe", "gpt2_bpe"}},
      {"data", "separator", {"blank_line", "percent_line", "none"}},
      {"data", "batching", {"random_windows", "padded_docs", "packed_docs"}},
      {"data", "padding_side", {"right", "left"}},
      {"train", "device", {"cpu", "cuda"}},
      {"train", "dtype", {"float32", "bf16"}},
      {"train", "lr_schedule", {"cosine", "constant"}},
  };
  return keys;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) { return e.what(); }
  return "(no error)";
}

// The line `key = ...` of a to_toml text.
std::string line_of(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + " = ");
  if (at == std::string::npos) return "";
  return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}

}  // namespace

TEST_CASE("every enumerated key refuses a wrong spelling in one line naming the key and every spelling",
          "[config][enums]") {
  for (const EnumKey& k : enum_keys()) {
    const std::string name = std::string(k.section) + "." + k.key;
    INFO(name);
    const std::string expected = name + " must be one of " + quoted_list(k.names) +
                                 (k.empty_ok ? " (or \"\" for the family default)" : "") + "; got \"bogus\"";
    // From a file: the file named first.
    const std::string from_file =
        error_of([&] { parse("[" + std::string(k.section) + "]\n" + k.key + " = \"bogus\"\n"); });
    CHECK(from_file == "configs/x.toml: " + expected);
    // From --set: the assignment named first.
    const std::string from_set = error_of([&] { parse("", {name + "=bogus"}); });
    CHECK(from_set == "--set " + name + "=bogus: " + expected);
    CHECK(from_file.find('\n') == std::string::npos);
    CHECK(from_set.find('\n') == std::string::npos);
    // A value of another type is refused as before.
    CHECK(error_of([&] { parse("[" + std::string(k.section) + "]\n" + k.key + " = 3\n"); }) ==
          "configs/x.toml: " + name + " must be a string, got integer");
    // A near spelling is not accepted either.
    CHECK_THROWS_WITH(parse("", {name + "=" + k.names[0] + "X"}), Contains(name + " must be one of"));
  }
}

TEST_CASE("to_toml writes every value of every enumerated key as its spelling, and it parses back", "[config][enums]") {
  for (const EnumKey& k : enum_keys()) {
    const std::string name = std::string(k.section) + "." + k.key;
    for (const std::string& spelling : k.names) {
      INFO(name << " = " << spelling);
      // A key that belongs to one pattern is set under that pattern.
      const std::vector<std::string> pattern = name == "model.linear_feature"
                                                   ? std::vector<std::string>{"model.attention_pattern=linear"}
                                                   : std::vector<std::string>{};
      auto with_pattern = [&](const std::string& assignment) {
        std::vector<std::string> all = pattern;
        all.push_back(assignment);
        return all;
      };
      const Config c = parse("", with_pattern(name + "=" + spelling));
      const std::string text = to_toml(c);
      CHECK(line_of(text, k.key) == std::string(k.key) + " = \"" + spelling + "\"");
      const Config back = parse_config_text(text, "round trip");
      CHECK(back == c.resolved());
      CHECK(to_toml(back) == text);
      // Read as a quoted TOML string too (what a config file holds).
      CHECK(parse("", with_pattern(name + "=\"" + spelling + "\"")) == c);
    }
  }
  // "" keeps the family default for the preset switches, and writes the resolved value.
  const Config d = parse("[model]\nfamily = \"llama\"\nposition = \"\"\nnorm = \"\"\nactivation = \"\"\n");
  CHECK_FALSE(d.model.position.has_value());
  CHECK(d.model.resolved_position() == nn::Position::rope);
  const std::string text = to_toml(d);
  CHECK(line_of(text, "position") == "position = \"rope\"");
  CHECK(line_of(text, "norm") == "norm = \"rmsnorm\"");
  CHECK(line_of(text, "activation") == "activation = \"swiglu\"");
  CHECK(parse("", {"model.norm=rmsnorm", "model.norm="}).model.norm == std::nullopt);
}

TEST_CASE("each enumerated key reads into the enum value its spelling names", "[config][enums]") {
  // Independent of the tables: the values written out by hand.
  const Config c = parse(
      "[model]\nfamily = \"llama\"\nposition = \"sinusoidal\"\nnorm = \"layernorm\"\nactivation = \"relu\"\n"
      "attn_kernel = \"reference\"\nattention_pattern = \"strided\"\n"
      "[data]\ntokenizer = \"gpt2_bpe\"\nseparator = \"percent_line\"\n"
      "[train]\ndevice = \"cuda\"\ndtype = \"bf16\"\nlr_schedule = \"constant\"\n");
  CHECK(c.model.family == nn::Family::llama);
  CHECK(c.model.position == nn::Position::sinusoidal);
  CHECK(c.model.norm == nn::NormKind::layernorm);
  CHECK(c.model.activation == nn::Activation::relu);
  CHECK(c.model.attn_kernel == attn::Kernel::reference);
  CHECK(c.model.attention_pattern.attention == nn::AttentionPattern::full);
  CHECK(c.model.attention_pattern.sparse == attn::Pattern::strided);
  // linear_feature belongs to linear attention (refused under any other pattern).
  CHECK(parse("[model]\nattention_pattern = \"linear\"\nlinear_feature = \"favor\"\n").model.linear_feature ==
        attn::LinearFeature::favor);
  CHECK(c.data.tokenizer == TokenizerKind::gpt2_bpe);
  CHECK(c.data.separator == DocSeparator::percent_line);
  CHECK(c.train.device == Device::cuda);
  CHECK(c.train.dtype == DType::bf16);
  CHECK(c.train.lr_schedule == train::LrScheduleKind::constant);
  CHECK(train::LrSchedule::from(c.train).kind == train::LrScheduleKind::constant);
  const Config lin = parse("", {"model.attention_pattern=linear"});
  CHECK(lin.model.attention_pattern.linear());
  CHECK(train::model_config(lin, 65).attention_pattern == nn::AttentionPattern::linear);
  CHECK(train::model_config(lin, 65).pattern.kind == attn::Pattern::full);
  const nn::ModelConfig m = train::model_config(c, 65);
  CHECK(m.pattern.kind == attn::Pattern::strided);
  CHECK(m.position == nn::Position::sinusoidal);
}

TEST_CASE("data.separator is spelt once: prepare, the config and datasets share kDocSeparators",
          "[config][enums][data]") {
  const std::vector<std::pair<const char*, DocSeparator>> expected = {{"blank_line", DocSeparator::blank_line},
                                                                      {"percent_line", DocSeparator::percent_line},
                                                                      {"none", DocSeparator::none}};
  REQUIRE(kDocSeparators.size() == expected.size());
  for (const auto& [spelling, value] : expected) {
    CHECK(parse_separator(spelling) == value);
    CHECK(std::string(separator_name(value)) == spelling);
    CHECK(parse("", {std::string("data.separator=") + spelling}).data.separator == value);
  }
  // `qkv prepare --separator` keeps its message.
  CHECK_THROWS_WITH(parse_separator("dash"),
                    "[data] unknown document separator 'dash' (expected blank_line, percent_line or none)");
}

TEST_CASE(
    "data.tokenizer is spelt once: prepare, make_tokenizer, stored tokenizers and cache names share "
    "kTokenizerKinds",
    "[config][enums][data][tokenizer]") {
  const std::vector<std::pair<const char*, TokenizerKind>> expected = {{"char", TokenizerKind::character},
                                                                       {"byte", TokenizerKind::byte},
                                                                       {"bpe", TokenizerKind::bpe},
                                                                       {"gpt2_bpe", TokenizerKind::gpt2_bpe}};
  REQUIRE(kTokenizerKinds.size() == expected.size());
  for (const auto& [spelling, value] : expected) {
    CAPTURE(spelling);
    CHECK(parse_tokenizer_kind(spelling) == value);
    CHECK(std::string(tokenizer_kind_name(value)) == spelling);
    CHECK(parse("", {std::string("data.tokenizer=") + spelling}).data.tokenizer == value);
    // The cache file of `qkv train` on a text file is named with the spelling, as before.
    CHECK(dataset_cache_path("/texts/story.txt", value, "/cache") ==
          std::string("/cache/story.txt.") + spelling + ".h5");
    if (value == TokenizerKind::gpt2_bpe) {
      CHECK(std::string(Gpt2BpeTokenizer::kKind) == spelling);
      CHECK_THROWS_WITH(make_tokenizer(value, "abc"), Contains("read from Hugging Face files"));
      continue;
    }
    // What kind() says, what serialize() stores and what rebuilds it are the spelling.
    const std::unique_ptr<Tokenizer> tok = make_tokenizer(value, "abc", TokenizerOptions{260});
    CHECK(std::string(tok->kind()) == spelling);
    CHECK(nlohmann::json::parse(tok->serialize())["kind"] == spelling);
    CHECK(std::string(tokenizer_from_json(tok->serialize())->kind()) == spelling);
  }
  // `qkv prepare --tokenizer` reads through the same table; a wrong spelling lists them all.
  CHECK_THROWS_WITH(parse_tokenizer_kind("words"),
                    "[tokenizer] unknown tokenizer 'words' (expected char, byte, bpe or gpt2_bpe)");
  CHECK_THROWS_WITH(tokenizer_from_json(R"({"kind":"words","version":1})"),
                    "[tokenizer] unknown stored tokenizer kind 'words'");
}

TEST_CASE("a checkpoint written before the settings were enums loads with the same values and config text",
          "[config][enums][checkpoint]") {
  // Written by the qkv of commit eba89b0 (`qkv train`, 2 steps): a llama with every switch set
  // away from its default (tests/fixtures/README.md).
  const std::string path = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/config_enums_v1.h5";
  // It sets model.linear_feature = "favor" under the strided pattern, which never reads it: such a
  // checkpoint is refused at load, naming the key, like the same config given to `qkv train`.
  CHECK_THROWS_WITH(train::read_checkpoint_meta(path),
                    Contains("model.linear_feature = \"favor\" is only used by model.attention_pattern = linear, "
                             "not strided"));
  // The stored text still reads into the same enum values, the inert key put back to its default.
  const h5::File f = h5::File::open(path);
  const std::string stored = f.attr_string("/", "config");
  const Config c = parse_config_text(stored, "stored", {"model.linear_feature=elu1"});
  CHECK(c.model.family == nn::Family::llama);
  CHECK(c.model.position == nn::Position::sinusoidal);
  CHECK(c.model.norm == nn::NormKind::layernorm);
  CHECK(c.model.activation == nn::Activation::relu);
  CHECK(c.model.attn_kernel == attn::Kernel::reference);
  CHECK(c.model.attention_pattern == AttentionChoice{nn::AttentionPattern::full, attn::Pattern::strided});
  CHECK(c.data.tokenizer == TokenizerKind::character);
  CHECK(c.data.separator == DocSeparator::percent_line);
  CHECK(c.data.batching == BatchMode::padded_docs);
  CHECK(c.data.padding_side == Padding::left);
  CHECK(c.train.device == Device::cpu);
  CHECK(c.train.dtype == DType::f32);
  CHECK(c.train.lr_schedule == train::LrScheduleKind::constant);
  // The config text written now is the one stored then, byte for byte but for that key.
  std::string expected = stored;
  const size_t at = expected.find("linear_feature = \"favor\"");
  REQUIRE(at != std::string::npos);
  expected.replace(at, std::string("linear_feature = \"favor\"").size(), "linear_feature = \"elu1\"");
  // Keys added since (their defaults, which the stored run used) follow train.zero.
  const size_t zero = expected.find("\nzero = 0\n");
  REQUIRE(zero != std::string::npos);
  expected.insert(zero + std::string("\nzero = 0\n").size(),
                  "dp_bucket_kb = 4096\ndp_overlap = true\ncuda_mma = true\nnumerics = \"invariant\"\n");
  CHECK(to_toml(c) == expected);
  // And the model it describes loads the stored weights.
  auto model = train::build_model(c, 11);  // the fixture corpus's 11 characters (embed_tokens is [11, 8])
  REQUIRE_NOTHROW(train::load_model_weights(path, *model));
  CHECK(model->config().pattern.kind == attn::Pattern::strided);
}
