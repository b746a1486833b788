// GPT-2 byte-level BPE (data/byte_level_bpe.h) against Hugging Face's `tokenizers`: the committed
// fixture tests/reference/gpt2_bpe/ (make_bpe_fixture.py) holds a BPE trained by `tokenizers` and
// the ids it gives on a stress corpus; the pattern and the byte table also against hand-written
// examples.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_test_util.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

using namespace qkv;
using qkv::ckpt_test::error_of;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.is_open());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fixture(const std::string& name) {
  return slurp(std::string(QKV_SOURCE_DIR) + "/tests/reference/gpt2_bpe/" + name);
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

void check_fixture_cases(const Tokenizer& tok) {
  const auto expected = nlohmann::json::parse(fixture("expected.json"));
  REQUIRE(tok.vocab_size() == expected["vocab_size"].get<int>());
  REQUIRE(expected["cases"].size() >= 25);
  for (const auto& c : expected["cases"]) {
    INFO(c["name"].get<std::string>());
    const std::string text = unhex(c["hex"]);
    const auto ids = tok.encode(text);
    CHECK(ids == c["ids"].get<std::vector<int32_t>>());
    CHECK(tok.decode(ids) == text);
  }
}

}  // namespace

TEST_CASE("gpt2_bpe byte table is GPT-2's", "[tokenizer][gpt2_bpe]") {
  using namespace bytelevel;
  CHECK(byte_to_codepoint('!') == '!');
  CHECK(byte_to_codepoint('~') == '~');
  CHECK(byte_to_codepoint(0x00) == 0x100);
  CHECK(byte_to_codepoint('\n') == 0x10A);  // "Ċ"
  CHECK(byte_to_codepoint(' ') == 0x120);   // "Ġ"
  CHECK(byte_to_codepoint(0x7F) == 0x121);
  CHECK(byte_to_codepoint(0xA0) == 0x142);
  CHECK(byte_to_codepoint(0xAD) == 0x143);  // the soft hyphen is not printable
  CHECK(byte_to_codepoint(0xAE) == 0xAE);
  for (int b = 0; b < 256; ++b) CHECK(codepoint_to_byte(byte_to_codepoint(static_cast<uint8_t>(b))) == b);
  CHECK(to_alphabet(" a\n") ==
        "\xC4\xA0"
        "a"
        "\xC4\x8A");
}

TEST_CASE("gpt2_bpe pre-split follows GPT-2's pattern on hand-worked examples", "[tokenizer][gpt2_bpe]") {
  using V = std::vector<std::string_view>;
  CHECK(bytelevel::pre_split("Hello world's  end\n") == V{"Hello", " world", "'s", " ", " end", "\n"});
  CHECK(bytelevel::pre_split("I'M x'll") == V{"I", "'", "M", " x", "'ll"});  // contractions are lowercase
  CHECK(bytelevel::pre_split("a1b 22!!? \t\nq") == V{"a", "1", "b", " 22", "!!?", " \t", "\n", "q"});
  CHECK(bytelevel::pre_split("x   ") == V{"x", "   "});  // trailing run stays whole
  CHECK(bytelevel::pre_split("caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC") == V{"caf\xC3\xA9", " \xE6\x9D\xB1\xE4\xBA\xAC"});
  CHECK(bytelevel::pre_split("\xC2\xA0"
                             "a") == V{"\xC2\xA0", "a"});          // U+00A0 is \s
  CHECK(bytelevel::pre_split("e\xCC\x81") == V{"e", "\xCC\x81"});  // a combining mark is "other"
  CHECK(bytelevel::pre_split("a \xFF\xFE"
                             "b") == V{"a", " \xFF\xFE", "b"});  // invalid bytes: "other"
  CHECK(bytelevel::pre_split("") == V{});
}

TEST_CASE("gpt2_bpe from vocab.json + merges.txt gives tokenizers' ids on the stress corpus", "[tokenizer][gpt2_bpe]") {
  const auto tok = Gpt2BpeTokenizer::from_vocab_merges(fixture("vocab.json"), fixture("merges.txt"));
  CHECK(tok->added() == std::vector<int32_t>{tok->token_id("<|endoftext|>")});
  check_fixture_cases(*tok);
  // What it writes back is what it read.
  CHECK(nlohmann::json::parse(tok->vocab_json()) == nlohmann::json::parse(fixture("vocab.json")));
  CHECK(tok->merges_txt() == fixture("merges.txt"));
}

TEST_CASE("gpt2_bpe from tokenizer.json, and through a checkpoint's JSON, gives the same ids",
          "[tokenizer][gpt2_bpe]") {
  const auto tok = Gpt2BpeTokenizer::from_tokenizer_json(fixture("tokenizer.json"));
  check_fixture_cases(*tok);
  const auto back = tokenizer_from_json(tok->serialize());
  CHECK(std::string(back->kind()) == "gpt2_bpe");
  CHECK(back->serialize() == tok->serialize());
  check_fixture_cases(*back);
}

TEST_CASE("gpt2_bpe refuses what it cannot reproduce, by name", "[tokenizer][gpt2_bpe]") {
  auto j = nlohmann::json::parse(fixture("tokenizer.json"));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto k = j;
    edit(k);
    return error_of([&] { Gpt2BpeTokenizer::from_tokenizer_json(k.dump()); });
  };
  CHECK_THAT(with([](auto& k) { k["pre_tokenizer"]["add_prefix_space"] = true; }), Catch::Contains("add_prefix_space"));
  CHECK_THAT(with([](auto& k) { k["model"]["dropout"] = 0.1; }), Catch::Contains("model.dropout"));
  CHECK_THAT(with([](auto& k) { k["normalizer"] = {{"type", "NFC"}}; }), Catch::Contains("normalizer"));
  CHECK_THAT(with([](auto& k) { k["pre_tokenizer"] = {{"type", "Whitespace"}}; }), Catch::Contains("not ByteLevel"));
  CHECK_THAT(with([](auto& k) { k["added_tokens"][0]["lstrip"] = true; }), Catch::Contains("lstrip"));
  CHECK_THAT(with([](auto& k) { k["model"]["merges"].push_back("Ġt zz"); }), Catch::Contains("not in the vocabulary"));
  // A value of the wrong JSON type is refused naming its key, not with the JSON library's text.
  CHECK(with([](auto& k) { k["model"]["type"] = 7; }) ==
        "tokenizer.json: model.type is a JSON number, expected a string");
  CHECK(with([](auto& k) { k["pre_tokenizer"]["use_regex"] = "yes"; }) ==
        "tokenizer.json: pre_tokenizer.use_regex is a JSON string, expected a boolean");
  CHECK(with([](auto& k) { k["decoder"] = 3; }) == "tokenizer.json: decoder is not ByteLevel (3)");
  CHECK(with([](auto& k) { k["added_tokens"][0]["content"] = 42; }) ==
        "tokenizer.json: added_tokens[].content is a JSON number, expected a string");
  // A vocabulary without the byte token of 'a' (renamed to a text no byte maps to) is refused.
  CHECK_THAT(error_of([] { Gpt2BpeTokenizer::from_vocab_merges(R"({"b":0,"\u4e00":1})", ""); }),
             Catch::Contains("outside GPT-2's byte alphabet") || Catch::Contains("lacks the byte token"));
  CHECK_THAT(error_of([] { Gpt2BpeTokenizer::from_vocab_merges(R"({"a":0,"b":5})", ""); }),
             Catch::Contains("vocab id 5"));
}
