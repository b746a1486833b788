// Tokenizers: text <-> token ids. Three kinds, one interface:
//   byte  256 ids, id = byte value. Encodes any byte string.
//   char  one id per distinct *character* of the training corpus, ids in sorted order. A
//         character is a Unicode code point (its 1-4 byte UTF-8 sequence, so "é" is one token,
//         as Python's str sees it); a byte that does not start a valid UTF-8 sequence is a
//         character of its own, so any corpus round-trips exactly. Encoding text with a
//         character the corpus lacked is an error naming it.
//   bpe   byte-level BPE: the 256 byte tokens plus merges learned on the corpus (see bpe.cpp),
//         so it encodes any byte string, seen in training or not.
//   gpt2_bpe  GPT-2's byte-level BPE read from Hugging Face files (vocab.json + merges.txt or
//         tokenizer.json), giving HF's ids exactly (data/byte_level_bpe.h). Not built from a
//         corpus: it arrives with `qkv import` and travels in checkpoints and prepared datasets.
// For all kinds decode(encode(s)) == s exactly. A tokenizer serializes to one JSON string (kept
// inside prepared datasets and checkpoints under a "/tokenizer" group) that rebuilds it exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensor/choice.h"

namespace qkv {

// The tokenizer kinds, spelt as Tokenizer::kind() returns them and as the config key
// data.tokenizer takes them (`char` is a keyword: its enumerator is `character`).
enum class TokenizerKind { character, byte, bpe, gpt2_bpe };
inline constexpr std::array kTokenizerKinds = {
    Choice<TokenizerKind>{"char", TokenizerKind::character}, Choice<TokenizerKind>{"byte", TokenizerKind::byte},
    Choice<TokenizerKind>{"bpe", TokenizerKind::bpe}, Choice<TokenizerKind>{"gpt2_bpe", TokenizerKind::gpt2_bpe}};
// The spelling of `kind` in kTokenizerKinds (what kind() returns and files store).
constexpr const char* tokenizer_kind_name(TokenizerKind kind) { return choice_name(kTokenizerKinds, kind).data(); }
// The kind spelt `name`; any other name is an error listing the spellings.
TokenizerKind parse_tokenizer_kind(std::string_view name);

namespace h5 {
class File;
}

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const char* kind() const = 0;  // its spelling in kTokenizerKinds
  virtual int32_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // encode() of each text (BPE shares its per-word work across them).
  virtual std::vector<std::vector<int32_t>> encode_each(std::span<const std::string> texts) const;
  // Appends the bytes of one token; an id outside [0, vocab_size) is an error. A byte or BPE
  // token may hold part of a UTF-8 character, so streaming output should buffer incomplete ones.
  virtual void append_token(int32_t id, std::string& out) const = 0;
  std::string decode(std::span<const int32_t> ids) const;
  std::string decode(std::span<const int64_t> ids) const;
  // Everything needed to rebuild the tokenizer, as a JSON object with "kind" and "version".
  virtual std::string serialize() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  const char* kind() const override { return tokenizer_kind_name(TokenizerKind::byte); }
  int32_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  void append_token(int32_t id, std::string& out) const override;
  std::string serialize() const override;
};

class CharTokenizer final : public Tokenizer {
 public:
  // Vocabulary = the sorted distinct characters of `corpus` (byte order = code point order).
  static std::unique_ptr<CharTokenizer> train(std::string_view corpus);
  // Rebuilds from an explicit vocabulary (strictly increasing, each entry one character).
  explicit CharTokenizer(std::vector<std::string> vocab);

  const char* kind() const override { return tokenizer_kind_name(TokenizerKind::character); }
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  void append_token(int32_t id, std::string& out) const override;
  std::string serialize() const override;
  const std::vector<std::string>& vocab() const { return vocab_; }

 private:
  std::vector<std::string> vocab_;
  int32_t ascii_[128];                           // fast path: id of each ASCII byte or -1
  std::unordered_map<uint64_t, int32_t> index_;  // every character, packed as unit_key()
};

class BpeTokenizer final : public Tokenizer {
 public:
  using Pair = std::pair<int32_t, int32_t>;
  static constexpr const char* kPreSplit = "qkv-words-64";  // names bpe_pre_split's rule in saved files
  // Learns up to vocab_size - 256 merges (vocab_size >= 256); stops early when no adjacent pair
  // occurs twice, so vocab_size() may end below the request. Deterministic: the most frequent
  // pair wins, ties go to the smallest (left id, right id).
  static std::unique_ptr<BpeTokenizer> train(std::string_view corpus, int32_t vocab_size);
  // Merge i creates token 256 + i from the pair merges[i]; each part must already exist.
  explicit BpeTokenizer(std::vector<Pair> merges);

  const char* kind() const override { return tokenizer_kind_name(TokenizerKind::bpe); }
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<std::vector<int32_t>> encode_each(std::span<const std::string> texts) const override;
  void append_token(int32_t id, std::string& out) const override;
  std::string serialize() const override;
  const std::vector<Pair>& merges() const { return merges_; }
  const std::string& token_bytes(int32_t id) const { return token_bytes_.at(static_cast<size_t>(id)); }

 private:
  using ChunkCache = std::unordered_map<std::string_view, std::vector<int32_t>>;
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;
  void encode_cached(std::string_view text, ChunkCache& cache, std::vector<int32_t>& out) const;

  std::vector<Pair> merges_;
  std::unordered_map<uint64_t, int32_t> rank_;  // pair key -> merge index
  std::vector<std::string> token_bytes_;
};

// The pre-tokenizer BPE uses for training and encoding: cuts text into word-like chunks that
// merges never cross. A chunk is one of: an English contraction suffix ('s 't 'm 'd 're 've 'll);
// an optional single leading space plus a run of letters (ASCII letters or any non-ASCII byte,
// so UTF-8 words stay whole), of digits, or of other symbols; or a run of whitespace, leaving a
// final space to the word it precedes. Chunks longer than 64 bytes are cut (at UTF-8 character
// starts when possible) so encoding stays linear on pathological input.
std::vector<std::string_view> bpe_pre_split(std::string_view text);
// Length of an English contraction suffix starting at t[i] == '\'' ('s 't 'm 'd 're 've 'll), or 0:
// the contractions both pre-splitters (bpe_pre_split, GPT-2's in byte_level_bpe.cpp) keep whole.
size_t contraction_at(std::string_view t, size_t i);

struct TokenizerOptions {
  int32_t bpe_vocab_size = 512;
};

// Builds a tokenizer of `kind` (byte, char or bpe) for `corpus`; gpt2_bpe is refused (it comes
// from Hugging Face files, not from a corpus).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, std::string_view corpus,
                                          const TokenizerOptions& opts = {});
// Rebuilds a tokenizer from serialize()'s JSON; names the first problem found.
std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& json);

// Stores a tokenizer as group `group` of an HDF5 file: attribute "kind", attribute "vocab_size",
// string dataset "json". load_tokenizer checks that they agree.
void save_tokenizer(h5::File& f, const std::string& group, const Tokenizer& tok);
std::unique_ptr<Tokenizer> load_tokenizer(const h5::File& f, const std::string& group);

// Splits UTF-8 text into characters as CharTokenizer defines them (invalid bytes stand alone).
std::vector<std::string_view> utf8_characters(std::string_view text);
// For streaming decoded tokens: the length of the longest prefix of `bytes` that does not end
// inside a UTF-8 character still being completed (at most 3 trailing bytes are held back; bytes
// that can never become valid UTF-8 are not held).
size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace qkv
