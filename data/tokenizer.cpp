// Byte and char tokenizers, the JSON (de)serialization of all kinds, and their HDF5 storage.
// The BPE tokenizer's training and encoding live in bpe.cpp.
#include "data/tokenizer.h"
#include "data/utf8.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "data/byte_level_bpe.h"
#include "data/h5.h"
#include "data/input_file.h"
#include "tensor/error.h"

namespace qkv {

using json = nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

// Length of the valid UTF-8 sequence starting at s[i] (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF), or 0 when s[i] does not start one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return len;
}

// A character (1-4 bytes) packed into an integer key: bytes big-endian plus the length.
uint64_t unit_key(std::string_view u) {
  uint64_t k = 0;
  for (unsigned char c : u) k = (k << 8) | c;
  return (k << 8) | u.size();
}

// "'é' (U+00E9)" for a character, "byte 0xFF" for a stray byte; used in error messages.
std::string describe_character(std::string_view u) {
  char buf[32];
  if (u.size() == 1 && static_cast<unsigned char>(u[0]) >= 0x80) {
    std::snprintf(buf, sizeof buf, "byte 0x%02X", static_cast<unsigned char>(u[0]));
    return buf;
  }
  uint32_t cp = 0;
  const auto c0 = static_cast<unsigned char>(u[0]);
  if (u.size() == 1) cp = c0;
  else if (u.size() == 2) cp = c0 & 0x1F;
  else if (u.size() == 3) cp = c0 & 0x0F;
  else cp = c0 & 0x07;
  for (size_t k = 1; k < u.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(u[k]) & 0x3F);
  std::snprintf(buf, sizeof buf, " (U+%04X)", cp);
  std::string out;
  if (cp >= 0x20 && !(cp >= 0x7F && cp <= 0x9F)) {
    out.push_back('\'');
    out.append(u);
    out.push_back('\'');
  } else {
    out = "character";
  }
  out.append(buf);
  return out;
}

}  // namespace

size_t first_non_text_byte(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) return i;
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_length(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<std::string_view> utf8_characters(std::string_view text) {
  std::vector<std::string_view> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::max<size_t>(1, utf8_length(text, i));
    out.push_back(text.substr(i, len));
    i += len;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  // Look for a lead byte among the last 3 bytes whose sequence runs past the end.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for its lead
    const size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    if (need <= back) return n;
    // Hold the tail back only if it is a valid start of that sequence.
    std::string padded(bytes.substr(n - back));
    const char filler[4] = {'\x80', '\x80', '\x80', '\x80'};
    padded.append(filler, need - back);
    if (c == 0xE0 && back == 1) padded[1] = '\xA0';  // smallest valid second bytes
    if (c == 0xF0 && back == 1) padded[1] = '\x90';
    return utf8_length(padded, 0) == need ? n - back : n;
  }
  return n;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 2);
  for (int32_t id : ids) append_token(id, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 2);
  for (int64_t id : ids) {
    QKV_CHECK(id >= 0 && id < vocab_size(), "[", kind(), " tokenizer] token id ", id, " is outside the vocabulary [0, ",
              vocab_size(), ")");
    append_token(static_cast<int32_t>(id), out);
  }
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_each(std::span<const std::string> texts) const {
  std::vector<std::vector<int32_t>> out;
  out.reserve(texts.size());
  for (const std::string& t : texts) out.push_back(encode(t));
  return out;
}

// ---- byte ----

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

void ByteTokenizer::append_token(int32_t id, std::string& out) const {
  QKV_CHECK(id >= 0 && id < 256, "[byte tokenizer] token id ", id, " is outside the vocabulary [0, 256)");
  out.push_back(static_cast<char>(id));
}

std::string ByteTokenizer::serialize() const { return json{{"kind", kind()}, {"version", kFormatVersion}}.dump(); }

// ---- char ----

std::unique_ptr<CharTokenizer> CharTokenizer::train(std::string_view corpus) {
  // Distinct characters first (a table for ASCII, a hash set for the rest), then sort the few.
  bool ascii[128] = {};
  std::unordered_map<uint64_t, std::string_view> other;
  for (size_t i = 0; i < corpus.size();) {
    const auto c = static_cast<unsigned char>(corpus[i]);
    if (c < 128) {
      ascii[c] = true;
      ++i;
      continue;
    }
    const size_t len = std::max<size_t>(1, utf8_length(corpus, i));
    const std::string_view u = corpus.substr(i, len);
    other.emplace(unit_key(u), u);
    i += len;
  }
  std::vector<std::string> vocab;
  for (int c = 0; c < 128; ++c)
    if (ascii[c]) vocab.emplace_back(1, static_cast<char>(c));
  for (const auto& [k, u] : other) vocab.emplace_back(u);
  std::sort(vocab.begin(), vocab.end());
  return std::make_unique<CharTokenizer>(std::move(vocab));
}

CharTokenizer::CharTokenizer(std::vector<std::string> vocab) : vocab_(std::move(vocab)) {
  std::fill(ascii_, ascii_ + 128, -1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& u = vocab_[i];
    QKV_CHECK(!u.empty() && utf8_characters(u).size() == 1, "[char tokenizer] vocabulary entry ", i,
              " is not a single character");
    QKV_CHECK(i == 0 || vocab_[i - 1] < u, "[char tokenizer] vocabulary is not strictly sorted at entry ", i);
    const auto id = static_cast<int32_t>(i);
    if (u.size() == 1 && static_cast<unsigned char>(u[0]) < 128) ascii_[static_cast<unsigned char>(u[0])] = id;
    index_.emplace(unit_key(u), id);
  }
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    int32_t id = -1;
    size_t len = 1;
    if (c < 128) {
      id = ascii_[c];
    } else {
      len = std::max<size_t>(1, utf8_length(text, i));
      auto it = index_.find(unit_key(text.substr(i, len)));
      if (it != index_.end()) id = it->second;
    }
    if (id < 0)
      fail("[char tokenizer] ", describe_character(text.substr(i, len)), " at byte offset ", i,
           " is not in the vocabulary of ", vocab_.size(), " characters");
    out.push_back(id);
    i += len;
  }
  return out;
}

void CharTokenizer::append_token(int32_t id, std::string& out) const {
  QKV_CHECK(id >= 0 && id < vocab_size(), "[char tokenizer] token id ", id, " is outside the vocabulary [0, ",
            vocab_size(), ")");
  out += vocab_[static_cast<size_t>(id)];
}

std::string CharTokenizer::serialize() const {
  // Valid characters are JSON strings; a stray non-UTF-8 byte is stored as its integer value.
  json vocab = json::array();
  for (const std::string& u : vocab_) {
    if (u.size() == 1 && static_cast<unsigned char>(u[0]) >= 0x80) vocab.push_back(static_cast<unsigned char>(u[0]));
    else vocab.push_back(u);
  }
  return json{{"kind", kind()}, {"version", kFormatVersion}, {"vocab", vocab}}.dump();
}

// ---- factories and storage ----

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  if (const TokenizerKind* k = find_choice(kTokenizerKinds, name)) return *k;
  fail("[tokenizer] unknown tokenizer '", name, "' (expected ", names_or(kTokenizerKinds), ")");
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, std::string_view corpus, const TokenizerOptions& opts) {
  switch (kind) {
    case TokenizerKind::byte:
      return std::make_unique<ByteTokenizer>();
    case TokenizerKind::character:
      return CharTokenizer::train(corpus);
    case TokenizerKind::bpe:
      return BpeTokenizer::train(corpus, opts.bpe_vocab_size);
    case TokenizerKind::gpt2_bpe:
      fail(
          "[tokenizer] a gpt2_bpe tokenizer is read from Hugging Face files (qkv import), not learned from a corpus: "
          "tokenize the text with `qkv prepare --tokenizer-from CKPT` and set data.path to the prepared .h5");
  }
  fail("[tokenizer] tokenizer kind ", static_cast<int>(kind), " is not in kTokenizerKinds");
}

std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& text) {
  const json j = parse_json(text, "[tokenizer] stored tokenizer");
  QKV_CHECK(j.is_object() && j.contains("kind") && j["kind"].is_string(),
            "[tokenizer] stored tokenizer has no \"kind\"");
  const std::string kind = j["kind"];
  const json version = j.contains("version") ? j["version"] : json(0);
  QKV_CHECK(version.is_number_integer() && version.get<int64_t>() == kFormatVersion, "[tokenizer] stored ", kind,
            " tokenizer has version ", version.dump(), ", this build reads version ", kFormatVersion);
  const TokenizerKind* known = find_choice(kTokenizerKinds, kind);
  if (!known) fail("[tokenizer] unknown stored tokenizer kind '", kind, "'");
  try {
    switch (*known) {
      case TokenizerKind::byte:
        return std::make_unique<ByteTokenizer>();
      case TokenizerKind::character: {
        QKV_CHECK(j.contains("vocab") && j["vocab"].is_array(),
                  "[tokenizer] stored char tokenizer has no \"vocab\" array");
        std::vector<std::string> vocab;
        for (const json& e : j["vocab"]) {
          if (e.is_number_unsigned() && e.get<uint64_t>() < 256)
            vocab.emplace_back(1, static_cast<char>(e.get<uint64_t>()));
          else if (e.is_string()) vocab.push_back(e.get<std::string>());
          else fail("[tokenizer] stored char vocabulary entry ", vocab.size(), " is neither a string nor a byte value");
        }
        return std::make_unique<CharTokenizer>(std::move(vocab));
      }
      case TokenizerKind::gpt2_bpe:
        return Gpt2BpeTokenizer::from_serialized(text);
      case TokenizerKind::bpe: {
        QKV_CHECK(j.contains("merges") && j["merges"].is_array(),
                  "[tokenizer] stored bpe tokenizer has no \"merges\" array");
        const std::string pre = j.value("pre_split", std::string());
        QKV_CHECK(pre == BpeTokenizer::kPreSplit, "[tokenizer] stored bpe tokenizer uses pre-split rule '", pre,
                  "', this build has '", BpeTokenizer::kPreSplit, "'");
        std::vector<BpeTokenizer::Pair> merges;
        const auto is_id = [](const json& v) {
          return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
        };
        for (const json& m : j["merges"]) {
          QKV_CHECK(m.is_array() && m.size() == 2 && is_id(m[0]) && is_id(m[1]), "[tokenizer] stored bpe merge ",
                    merges.size(), " is not a pair of token ids");
          merges.emplace_back(m[0].get<int32_t>(), m[1].get<int32_t>());
        }
        return std::make_unique<BpeTokenizer>(std::move(merges));
      }
    }
  } catch (const json::exception& e) {
    fail("[tokenizer] stored ", kind, " tokenizer is malformed: ", json_error(e, text));
  }
  fail("[tokenizer] unknown stored tokenizer kind '", kind, "'");
}

void save_tokenizer(h5::File& f, const std::string& group, const Tokenizer& tok) {
  f.create_group(group);
  f.set_attr(group, "kind", std::string(tok.kind()));
  f.set_attr(group, "vocab_size", static_cast<int64_t>(tok.vocab_size()));
  f.write_string(group + "/json", tok.serialize());
}

std::unique_ptr<Tokenizer> load_tokenizer(const h5::File& f, const std::string& group) {
  const std::string kind = f.attr_string(group, "kind");
  const int64_t vocab = f.attr_int(group, "vocab_size");
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = tokenizer_from_json(f.read_string(group + "/json"));
  } catch (const Error& e) { f.fail(group, "/json: ", e.what()); }
  if (kind != tok->kind()) f.fail(group, " says kind '", kind, "' but holds a ", tok->kind(), " tokenizer");
  if (vocab != tok->vocab_size())
    f.fail(group, " says vocab_size ", vocab, " but its tokenizer has ", tok->vocab_size(), " tokens");
  return tok;
}

}  // namespace qkv
