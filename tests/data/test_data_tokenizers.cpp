// Tokenizers: round trips, hand-computed BPE merges, an independent from-scratch BPE trainer as
// the oracle for the incremental one, and serialization.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "data/tokenizer.h"
#include "tensor/error.h"

using namespace qkv;

namespace {

std::string all_bytes() {
  std::string s;
  for (int c = 0; c < 256; ++c) s.push_back(static_cast<char>(c));
  return s;
}

const std::string kMixed = "Hello, wörld! ½ 日本語 🙂 it's\n\n  tabs\tand\r\nCRLF 12345 $$$ ' 'll";

// Reference BPE: recounts every pair of every word from scratch before each merge.
std::vector<BpeTokenizer::Pair> naive_bpe(std::string_view corpus, int n_merges) {
  std::map<std::string, int64_t> freq;
  for (std::string_view c : bpe_pre_split(corpus)) ++freq[std::string(c)];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, f] : freq) {
    std::vector<int32_t> ids;
    for (unsigned char c : w) ids.push_back(c);
    words.emplace_back(ids, f);
  }
  std::vector<BpeTokenizer::Pair> merges;
  for (int m = 0; m < n_merges; ++m) {
    std::map<BpeTokenizer::Pair, int64_t> count;
    for (const auto& [ids, f] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) count[{ids[i], ids[i + 1]}] += f;
    BpeTokenizer::Pair best{-1, -1};
    int64_t best_count = 1;
    for (const auto& [p, c] : count)  // map order = ascending pair: the first maximum wins ties
      if (c > best_count) best = p, best_count = c;
    if (best.first < 0) break;
    merges.push_back(best);
    const int32_t id = 256 + m;
    for (auto& [ids, f] : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          out.push_back(id);
          i += 2;
        } else {
          out.push_back(ids[i++]);
        }
      }
      ids = out;
    }
  }
  return merges;
}

std::string random_words(size_t n_words, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> stems = {"the",  "cat",  "sat", "on", "mat",  "and",  "then", "ran",
                                          "far",  "away", "th",  "at", "ca",   "éte",  "über", "42",
                                          "1999", ",",    ".",   "!",  "it's", "we'll"};
  std::string s;
  for (size_t i = 0; i < n_words; ++i) {
    s += stems[rng() % stems.size()];
    if (rng() % 3 == 0) s += stems[rng() % stems.size()];
    const uint32_t r = rng() % 20;
    s += r == 0 ? "\n" : r == 1 ? "\n\n" : r == 2 ? "  " : " ";
  }
  return s;
}

// ~n_bytes of text over a Zipf-distributed vocabulary of 30000 random words: as many distinct
// words as real English text of that size, so BPE training does realistic work.
std::string zipf_text(size_t n_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> vocab(30000);
  for (auto& w : vocab) {
    const size_t len = 1 + rng() % 10;
    for (size_t i = 0; i < len; ++i) w.push_back(static_cast<char>('a' + rng() % 26));
  }
  std::vector<double> cdf(vocab.size());
  double sum = 0;
  for (size_t r = 0; r < vocab.size(); ++r) cdf[r] = sum += 1.0 / static_cast<double>(r + 1);
  std::uniform_real_distribution<double> u(0.0, sum);
  std::string s;
  while (s.size() < n_bytes) {
    const size_t r = static_cast<size_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
    s += vocab[std::min(r, vocab.size() - 1)];
    s += rng() % 12 == 0 ? ".\n" : " ";
  }
  return s;
}

}  // namespace

TEST_CASE("byte tokenizer maps each byte to its value and round-trips any bytes", "[data][tokenizer]") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 256);
  const std::string s = all_bytes() + kMixed;
  const std::vector<int32_t> ids = tok.encode(s);
  REQUIRE(ids.size() == s.size());
  CHECK(ids[0] == 0);
  CHECK(ids[255] == 255);
  CHECK(ids[256] == 'H');
  CHECK(tok.decode(ids) == s);
  CHECK_THROWS_WITH(tok.decode(std::vector<int32_t>{65, 256}),
                    Catch::Contains("token id 256") && Catch::Contains("[0, 256)"));
  auto back = tokenizer_from_json(tok.serialize());
  CHECK(std::string(back->kind()) == "byte");
}

TEST_CASE("char tokenizer vocabulary is the sorted distinct code points of the corpus", "[data][tokenizer]") {
  auto tok = CharTokenizer::train("baé\ncab é");
  // Distinct characters in byte (= code point) order: '\n' ' ' 'a' 'b' 'c' 'é'
  REQUIRE(tok->vocab() == std::vector<std::string>{"\n", " ", "a", "b", "c", "é"});
  CHECK(tok->encode("é\nab") == std::vector<int32_t>{5, 0, 2, 3});
  CHECK(tok->decode(std::vector<int32_t>{4, 2, 3}) == "cab");
}

TEST_CASE("char tokenizer round-trips UTF-8 text and stray bytes exactly", "[data][tokenizer]") {
  const std::string corpus =
      kMixed + std::string("\xff\xc3 broken \xe6\x97", 12);  // invalid sequences stay single bytes
  auto tok = CharTokenizer::train(corpus);
  CHECK(tok->decode(tok->encode(corpus)) == corpus);
  CHECK(tok->encode("🙂").size() == 1);
  CHECK(tok->encode("日本語").size() == 3);
  auto back = tokenizer_from_json(tok->serialize());
  CHECK(back->vocab_size() == tok->vocab_size());
  CHECK(back->encode(corpus) == tok->encode(corpus));
}

TEST_CASE("char tokenizer names an unknown character and where it is", "[data][tokenizer]") {
  auto tok = CharTokenizer::train("abc");
  CHECK_THROWS_WITH(tok->encode("abé"), Catch::Contains("'é' (U+00E9)") && Catch::Contains("byte offset 2") &&
                                            Catch::Contains("3 characters"));
  CHECK_THROWS_WITH(tok->encode("a\tb"), Catch::Contains("U+0009"));
  CHECK_THROWS_AS(tok->decode(std::vector<int32_t>{3}), Error);
}

TEST_CASE("bpe pre-split keeps leading spaces with words and splits classes apart", "[data][tokenizer][bpe]") {
  const std::string text = "Hello world, it's  2024!\n\nBye";
  std::vector<std::string> chunks;
  for (auto c : bpe_pre_split(text)) chunks.emplace_back(c);
  CHECK(chunks == std::vector<std::string>{"Hello", " world", ",", " it", "'s", " ", " 2024", "!", "\n\n", "Bye"});
  // Chunks always tile the text, also for long runs that get cut.
  const std::string long_run = std::string(200, '=') + " " + std::string(150, 'x');
  std::string joined;
  for (auto c : bpe_pre_split(long_run)) {
    CHECK(c.size() <= 64);
    joined += c;
  }
  CHECK(joined == long_run);
}

TEST_CASE("bpe learns the hand-computed merges with smallest-pair tie breaking", "[data][tokenizer][bpe]") {
  // Words: "xy" x1, " xy" x1, " yx" x2.
  // Counts: (x,y)=2, (' ',x)=1, (' ',y)=2, (y,x)=2 -> tie at 2, smallest pair (' ',y) = (32,121) -> 256
  // Then (x,y)=2, (' ',x)=1, (256,x)=2 -> tie, smallest (120,121) -> 257
  // Then (' ',257)=1, (256,x)=2 -> (256,120) -> 258; then only count-1 pairs remain: stop.
  auto tok = BpeTokenizer::train("xy xy yx yx", 1000);
  REQUIRE(tok->merges() == std::vector<BpeTokenizer::Pair>{{32, 121}, {120, 121}, {256, 120}});
  CHECK(tok->vocab_size() == 259);
  CHECK(tok->token_bytes(258) == " yx");
  CHECK(tok->encode(" yx xy") == std::vector<int32_t>{258, 32, 257});
  // The vocabulary limit is respected.
  CHECK(BpeTokenizer::train("xy xy yx yx", 257)->merges().size() == 1);
  CHECK_THROWS_WITH(BpeTokenizer::train("abc", 100), Catch::Contains("below the 256"));
}

TEST_CASE("incremental bpe training equals a from-scratch recount at every merge", "[data][tokenizer][bpe][long]") {
  const std::string corpus = random_words(4000, 7);
  auto tok = BpeTokenizer::train(corpus, 256 + 300);
  const auto ref = naive_bpe(corpus, 300);
  REQUIRE(tok->merges().size() == ref.size());
  CHECK(tok->merges() == ref);
  const std::string zipf = zipf_text(30000, 5);
  CHECK(BpeTokenizer::train(zipf, 256 + 200)->merges() == naive_bpe(zipf, 200));
}

TEST_CASE("bpe round-trips text with bytes never seen in training", "[data][tokenizer][bpe]") {
  const std::string corpus = random_words(3000, 3);
  auto tok = BpeTokenizer::train(corpus, 400);
  CHECK(tok->vocab_size() == 400);
  for (const std::string& s : {corpus, kMixed, all_bytes(), std::string(), std::string("zzzz \x01\x02 QQQ")}) {
    const auto ids = tok->encode(s);
    CHECK(tok->decode(ids) == s);
  }
  // Merges compress the training text.
  CHECK(tok->encode(corpus).size() * 2 < corpus.size());
  // Serialization rebuilds the same tokenizer.
  auto back = tokenizer_from_json(tok->serialize());
  CHECK(back->vocab_size() == 400);
  CHECK(back->encode(corpus) == tok->encode(corpus));
  CHECK(back->serialize() == tok->serialize());
}

TEST_CASE("bpe training on a megabyte corpus takes seconds and is deterministic", "[data][tokenizer][bpe]") {
  const std::string corpus = zipf_text(1 << 20, 11);
  const auto t0 = std::chrono::steady_clock::now();
  auto a = BpeTokenizer::train(corpus, 2048);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(a->vocab_size() == 2048);
  CHECK(secs < 5.0);
  CHECK(a->decode(a->encode(corpus)) == corpus);
  auto b = BpeTokenizer::train(corpus, 2048);
  CHECK(a->merges() == b->merges());
}

TEST_CASE("stored tokenizers are validated when rebuilt", "[data][tokenizer]") {
  CHECK_THROWS_WITH(tokenizer_from_json("{nope"), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(tokenizer_from_json(R"({"kind":"wordpiece","version":1})"), Catch::Contains("wordpiece"));
  CHECK_THROWS_WITH(tokenizer_from_json(R"({"kind":"bpe","version":1,"pre_split":"qkv-words-64","merges":[[97,300]]})"),
                    Catch::Contains("does not exist yet"));
  CHECK_THROWS_WITH(tokenizer_from_json(R"({"kind":"char","version":1,"vocab":["b","a"]})"),
                    Catch::Contains("not strictly sorted"));
  // An id past 32 bits is refused, not taken modulo 2^32 (4294967393 = 2^32 + 'a').
  CHECK_THROWS_MATCHES(
      tokenizer_from_json(R"({"kind":"bpe","version":1,"pre_split":"qkv-words-64","merges":[[4294967393,98]]})"), Error,
      Catch::Message("[tokenizer] stored bpe merge 0 is not a pair of token ids"));
  CHECK_THROWS_MATCHES(
      tokenizer_from_json(R"({"kind":"char","version":1,"vocab":[4294967361]})"), Error,
      Catch::Message("[tokenizer] stored char vocabulary entry 0 is neither a string nor a byte value"));
  // A version that is not an integer is refused like a wrong one (one qkv::Error, no library text).
  for (const char* version : {R"("1")", "1.0", "null", "[1]"}) {
    const std::string text = std::string(R"({"kind":"byte","version":)") + version + "}";
    CHECK_THROWS_MATCHES(tokenizer_from_json(text), Error,
                         Catch::Message(std::string("[tokenizer] stored byte tokenizer has version ") + version +
                                        ", this build reads version 1"));
  }
}

TEST_CASE("streaming output holds back only an unfinished UTF-8 character", "[data][tokenizer]") {
  CHECK(utf8_complete_prefix("ab") == 2);
  CHECK(utf8_complete_prefix("ab\xE6\x97") == 2);      // first two bytes of 日
  CHECK(utf8_complete_prefix("ab\xE6\x97\xA5") == 5);  // all of 日
  CHECK(utf8_complete_prefix("a\xF0\x9F") == 1);       // half of an emoji
  CHECK(utf8_complete_prefix("a\xC3") == 1);
  CHECK(utf8_complete_prefix("a\xFF") == 2);      // never valid: nothing to wait for
  CHECK(utf8_complete_prefix("a\xE0\x80") == 3);  // overlong start: never valid
  CHECK(utf8_complete_prefix("") == 0);
  // Feeding BPE tokens one at a time through the helper reproduces the text.
  auto tok = BpeTokenizer::train("日本語 🙂 日本 🙂🙂 語", 300);
  const std::string text = "🙂日本語 x 🙂";
  std::string pending, shown;
  for (int32_t id : tok->encode(text)) {
    tok->append_token(id, pending);
    const size_t k = utf8_complete_prefix(pending);
    shown += pending.substr(0, k);
    pending.erase(0, k);
  }
  CHECK(pending.empty());
  CHECK(shown == text);
}
