// GPT-2's byte-level BPE, as Hugging Face's vocab.json + merges.txt (or tokenizer.json) define it,
// reproducing the ids HF's `tokenizers` gives (tokenizer kind "gpt2_bpe"):
//   1. Added tokens (GPT-2's <|endoftext|>) are cut out of the text first, leftmost, the longest
//      at a position winning; each becomes its id.
//   2. The rest is cut into pieces by GPT-2's pattern, leftmost-first at each position:
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (\p{L} letters: Lu Ll Lt Lm Lo; \p{N} numbers: Nd Nl No; \s White_Space; tables generated
//      by data/byte_level_bpe_tables.py). A byte that does not belong to a valid UTF-8 sequence
//      (HF cannot take such text at all) counts as one character of the "other" class, so any
//      byte string encodes and decode(encode(s)) == s.
//   3. Each piece's bytes become the byte tokens (byte b is the token whose text is the one
//      character byte_to_codepoint(b): printable Latin-1 bytes stand for themselves, the others
//      move to U+0100 and up, so every token is printable text), then the adjacent pair of lowest
//      merge rank is merged, the leftmost on a tie, until no pair has a merge.
// Decoding maps each token's characters back to bytes (an added token gives its text's bytes).
// The vocabulary must hold all 256 byte tokens and be dense (ids 0..V-1); every merge's parts and
// result must be in it. Settings HF allows but this cannot reproduce (a normalizer, a prefix space,
// dropout, added tokens with lstrip/rstrip/single_word, other pre-tokenizers) are refused by name.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace qkv {

namespace bytelevel {
// GPT-2's byte -> code point table and its inverse (-1 for a code point no byte maps to).
uint32_t byte_to_codepoint(uint8_t b);
int codepoint_to_byte(uint32_t cp);
// Token text (byte-level alphabet, UTF-8) <-> the bytes it stands for. to_bytes returns false when
// a character is outside the alphabet.
std::string to_alphabet(std::string_view bytes);
bool to_bytes(std::string_view token, std::string& out);
// Unicode classes of the pattern.
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_space(uint32_t cp);
// Step 2 above: the pieces of `text`, in order, covering it exactly.
std::vector<std::string_view> pre_split(std::string_view text);
}  // namespace bytelevel

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  static constexpr const char* kKind = tokenizer_kind_name(TokenizerKind::gpt2_bpe);
  // vocab[id] = the token's text (byte-level alphabet; an added token's text as is);
  // merges[rank] = the two parts' texts; added = the ids of added tokens.
  Gpt2BpeTokenizer(std::vector<std::string> vocab, std::vector<std::pair<std::string, std::string>> merges,
                   std::vector<int32_t> added);
  // From HF files. vocab.json + merges.txt: added tokens are the vocabulary entries that are not a
  // byte token and no merge makes (GPT-2's <|endoftext|>). tokenizer.json: its "added_tokens".
  static std::unique_ptr<Gpt2BpeTokenizer> from_vocab_merges(const std::string& vocab_json,
                                                             const std::string& merges_txt);
  static std::unique_ptr<Gpt2BpeTokenizer> from_tokenizer_json(const std::string& tokenizer_json);
  // Rebuilds from serialize()'s JSON object.
  static std::unique_ptr<Gpt2BpeTokenizer> from_serialized(const std::string& json);

  const char* kind() const override { return kKind; }
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
  std::vector<int32_t> encode(std::string_view text) const override;
  void append_token(int32_t id, std::string& out) const override;
  std::string serialize() const override;

  // HF's files: vocab.json ({text: id}), merges.txt ("#version: 0.2" then "a b" per rank).
  std::string vocab_json() const;
  std::string merges_txt() const;
  const std::vector<std::string>& vocab() const { return vocab_; }
  const std::vector<int32_t>& added() const { return added_; }
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }
  // The id of `text` in the vocabulary, or -1.
  int32_t token_id(std::string_view text) const;

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;

  std::vector<std::string> vocab_;
  std::vector<std::pair<std::string, std::string>> merges_;
  std::vector<int32_t> added_;
  std::vector<std::string> bytes_;                  // per id: the bytes it decodes to
  std::unordered_map<std::string, int32_t> index_;  // text -> id
  std::array<int32_t, 256> byte_id_{};              // byte -> its token id
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merge_;  // (left id, right id) -> rank, result id
};

}  // namespace qkv
