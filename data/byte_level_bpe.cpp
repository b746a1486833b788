// GPT-2 byte-level BPE (rules: data/byte_level_bpe.h).
#include "data/byte_level_bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>
#include <sstream>

#include "data/input_file.h"
#include "tensor/error.h"

namespace qkv {

namespace bytelevel {

struct CodeRange {
  uint32_t lo, hi;
};
#include "data/byte_level_bpe_tables.inc"

namespace {

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], uint32_t cp) {
  const CodeRange* end = r + N;
  const CodeRange* it = std::upper_bound(r, end, cp, [](uint32_t c, const CodeRange& x) { return c < x.lo; });
  return it != r && cp <= (it - 1)->hi;
}

// GPT-2's table: the bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the other 68 take U+0100, U+0101, ... in byte order.
struct Table {
  std::array<uint32_t, 256> to_cp{};
  std::unordered_map<uint32_t, int> to_byte;
  Table() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = b;
    }
  }
};
const Table& table() {
  static const Table t;
  return t;
}

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

// The code point starting at t[i] and its length; (kInvalid, 1) for a byte that does not start a
// valid (shortest-form, non-surrogate, <= U+10FFFF) UTF-8 sequence.
std::pair<uint32_t, size_t> decode_utf8(std::string_view t, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(t[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return {c, 1};
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
  else return {kInvalid, 1};
  if (i + len > t.size()) return {kInvalid, 1};
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, 1};
  return {cp, len};
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

enum class Cls : uint8_t { letter, number, space, other };

Cls classify(uint32_t cp) {
  if (cp == kInvalid) return Cls::other;
  if (cp < 0x80) {  // the common case without a table search
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return Cls::letter;
    if (cp >= '0' && cp <= '9') return Cls::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return Cls::space;
    return Cls::other;
  }
  if (is_space(cp)) return Cls::space;
  if (is_letter(cp)) return Cls::letter;
  if (is_number(cp)) return Cls::number;
  return Cls::other;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return table().to_cp[b]; }
int codepoint_to_byte(uint32_t cp) {
  const auto it = table().to_byte.find(cp);
  return it == table().to_byte.end() ? -1 : it->second;
}

std::string to_alphabet(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(byte_to_codepoint(static_cast<uint8_t>(c)), out);
  return out;
}

bool to_bytes(std::string_view token, std::string& out) {
  for (size_t i = 0; i < token.size();) {
    const auto [cp, len] = decode_utf8(token, i);
    const int b = cp == kInvalid ? -1 : codepoint_to_byte(cp);
    if (b < 0) return false;
    out += static_cast<char>(b);
    i += len;
  }
  return true;
}

bool is_letter(uint32_t cp) { return in_ranges(kLetterRanges, cp); }
bool is_number(uint32_t cp) { return in_ranges(kNumberRanges, cp); }
bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::vector<std::string_view> pre_split(std::string_view t) {
  // The characters: byte offset and class of each (offsets has one extra entry: the end).
  std::vector<uint32_t> offsets;
  std::vector<Cls> cls;
  offsets.reserve(t.size() + 1);
  cls.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    const auto [cp, len] = decode_utf8(t, i);
    offsets.push_back(static_cast<uint32_t>(i));
    cls.push_back(classify(cp));
    i += len;
  }
  offsets.push_back(static_cast<uint32_t>(t.size()));
  const size_t n = cls.size();
  std::vector<std::string_view> out;
  const auto emit = [&](size_t a, size_t b) { out.push_back(t.substr(offsets[a], offsets[b] - offsets[a])); };
  size_t i = 0;
  while (i < n) {
    const size_t at = offsets[i];
    // 's 't 're 've 'm 'll 'd (ASCII, so character count = byte count)
    if (t[at] == '\'') {
      if (const size_t c = contraction_at(t, at)) {
        emit(i, i + c);
        i += c;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional ASCII space, then a run of one class.
    size_t j = i;
    if (t[at] == ' ' && i + 1 < n && cls[i + 1] != Cls::space) ++j;
    if (cls[j] != Cls::space) {
      size_t end = j + 1;
      while (end < n && cls[end] == cls[j]) ++end;
      emit(i, end);
      i = end;
      continue;
    }
    // '\s+(?!\S)': the whitespace run, less its last character when a non-space follows (that
    // one goes with the next word); '\s+': a single whitespace character before a non-space.
    size_t end = i + 1;
    while (end < n && cls[end] == Cls::space) ++end;
    if (end < n && end - 1 > i) --end;
    emit(i, end);
    i = end;
  }
  return out;
}

}  // namespace bytelevel

namespace {

using nlohmann::json;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string q(std::string_view s) { return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace); }

// Runs `f`, which reads JSON parsed from `text`; a nlohmann exception (a value of the wrong type
// that get<>() or value() meets) becomes one line naming `what`, never the library's text.
template <class F>
auto json_guard(const std::string& what, const std::string& text, const F& f) {
  try {
    return f();
  } catch (const json::exception& e) { fail(what, ": ", json_error(e, text)); }
}

// obj[key] checked to be a JSON string or boolean (T), or `fallback` when obj is not an object or
// the key is absent or null. A value of another type is refused naming the file and the key
// (`where` is the key's path prefix, e.g. "model.").
template <class T>
T field_or(const json& obj, const char* key, T fallback, const std::string& file, const std::string& where) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  constexpr bool is_bool = std::is_same_v<T, bool>;
  QKV_CHECK(is_bool ? it->is_boolean() : it->is_string(), file, ": ", where, key, " is a JSON ", it->type_name(),
            ", expected a ", is_bool ? "boolean" : "string");
  return it->get<T>();
}

// The special tokens the tokenizer.json post_processor `p` (at key path `where`) adds to every
// single-sequence or pair encoding, appended to `added`. ByteLevel only trims offsets and adds
// none. A TemplateProcessing adds the SpecialToken items of its "single" and "pair" templates:
// transformers 5 writes one for GPT-2 whose templates are just $A and $A $B, which adds none. A
// Sequence adds what each of its processors adds. Any other kind (BertProcessing,
// RobertaProcessing, ...) always adds tokens and is refused by name.
void tokens_added_by_post_processor(const json& p, const std::string& file, const std::string& where,
                                    std::vector<std::string>& added) {
  QKV_CHECK(p.is_object(), file, ": ", where, " is a JSON ", p.type_name(), ", expected an object");
  const std::string type = field_or(p, "type", std::string(), file, where + ".");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json procs = p.value("processors", json());
    QKV_CHECK(procs.is_array(), file, ": ", where, ".processors is not a list");
    for (size_t i = 0; i < procs.size(); ++i)
      tokens_added_by_post_processor(procs[i], file, cat(where, ".processors[", i, "]"), added);
    return;
  }
  QKV_CHECK(type == "TemplateProcessing", file, ": ", where, ".type is ", q(type),
            ", which adds tokens qkv's encode would not add (qkv reads ByteLevel, a TemplateProcessing that adds "
            "no token, or a Sequence of those)");
  for (const char* key : {"single", "pair"}) {
    const json items = p.value(key, json::array());
    QKV_CHECK(items.is_array(), file, ": ", where, ".", key, " is not a list of template items");
    size_t sequences = 0;
    for (const json& item : items) {
      // Each item is {"Sequence": {"id": "A"|"B", "type_id": n}} or {"SpecialToken": {"id": token, ...}}.
      QKV_CHECK(item.is_object() && item.size() == 1, file, ": ", where, ".", key, " item ", item.dump(),
                " is not a Sequence or SpecialToken item");
      const std::string kind = item.begin().key();
      const json& body = item.begin().value();
      if (kind == "SpecialToken") {
        added.push_back(field_or(body, "id", std::string(), file, where + "." + key + "[].SpecialToken."));
      } else {
        QKV_CHECK(kind == "Sequence", file, ": ", where, ".", key, " item ", item.dump(),
                  " is not a Sequence or SpecialToken item");
        ++sequences;
      }
    }
    // qkv encodes one text at a time: a single template that repeats or drops it would change the
    // ids as surely as a token would. (The pair template serves only pairs, which qkv never encodes.)
    QKV_CHECK(std::string(key) != "single" || sequences == 1, file, ": ", where, ".single holds ", sequences,
              " sequence items (", items.dump(), "), not the one text encoded");
  }
}

constexpr int kSerializedVersion = 1;  // tokenizer.cpp's kFormatVersion for every kind

}  // namespace

Gpt2BpeTokenizer::Gpt2BpeTokenizer(std::vector<std::string> vocab,
                                   std::vector<std::pair<std::string, std::string>> merges, std::vector<int32_t> added)
    : vocab_(std::move(vocab)), merges_(std::move(merges)), added_(std::move(added)) {
  const char* who = "[gpt2_bpe tokenizer]";
  std::sort(added_.begin(), added_.end());
  added_.erase(std::unique(added_.begin(), added_.end()), added_.end());
  std::vector<char> is_added(vocab_.size(), 0);
  for (int32_t id : added_) {
    QKV_CHECK(id >= 0 && static_cast<size_t>(id) < vocab_.size(), who, " added token id ", id,
              " is outside the vocabulary [0, ", vocab_.size(), ")");
    QKV_CHECK(!vocab_[static_cast<size_t>(id)].empty(), who, " added token ", id, " is empty");
    is_added[static_cast<size_t>(id)] = 1;
  }
  bytes_.resize(vocab_.size());
  byte_id_.fill(-1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& v = vocab_[i];
    QKV_CHECK(index_.emplace(v, static_cast<int32_t>(i)).second, who, " token ", q(v), " appears twice (ids ",
              index_[v], " and ", i, ")");
    if (is_added[i]) {
      bytes_[i] = v;
      continue;
    }
    QKV_CHECK(!v.empty() && bytelevel::to_bytes(v, bytes_[i]), who, " token ", i, " ", q(v),
              " has a character outside GPT-2's byte alphabet (not a byte-level BPE vocabulary)");
    if (bytes_[i].size() == 1) byte_id_[static_cast<unsigned char>(bytes_[i][0])] = static_cast<int32_t>(i);
  }
  for (int b = 0; b < 256; ++b)
    QKV_CHECK(byte_id_[b] >= 0, who, " the vocabulary lacks the byte token for byte ", b, " (",
              q(bytelevel::to_alphabet(std::string(1, static_cast<char>(b)))), ")");
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto& [a, b] = merges_[r];
    const int32_t ia = token_id(a), ib = token_id(b), ic = token_id(a + b);
    QKV_CHECK(ia >= 0 && ib >= 0, who, " merge ", r, " (", q(a), " ", q(b),
              ") has a part that is not in the vocabulary");
    QKV_CHECK(ic >= 0, who, " merge ", r, " (", q(a), " ", q(b), ") makes ", q(a + b),
              ", which is not in the vocabulary");
    // A repeated pair keeps its first (lowest) rank, as HF's loader does.
    merge_.emplace(pair_key(ia, ib), Merge{static_cast<int32_t>(r), ic});
  }
}

int32_t Gpt2BpeTokenizer::token_id(std::string_view text) const {
  const auto it = index_.find(std::string(text));
  return it == index_.end() ? -1 : it->second;
}

void Gpt2BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  std::vector<int32_t> id(n);
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Candidate merges, lowest rank first, then leftmost; an entry whose symbols have changed since
  // it was pushed is stale and skipped (symbols only grow, so a changed one never matches again).
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto push = [&](int p) {
    if (p < 0 || next[p] < 0) return;
    const auto it = merge_.find(pair_key(id[p], id[next[p]]));
    if (it != merge_.end()) heap.push({it->second.rank, p, id[p], id[next[p]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (id[c.pos] != c.left || next[c.pos] < 0 || id[next[c.pos]] != c.right) continue;
    const int r = next[c.pos];
    id[c.pos] = merge_.at(pair_key(c.left, c.right)).id;
    id[r] = -1;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void Gpt2BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  for (std::string_view piece : bytelevel::pre_split(text)) {
    auto [it, fresh] = cache.try_emplace(piece);
    if (fresh) encode_piece(piece, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t start = 0;  // text[start, i) is not yet encoded
  if (!added_.empty()) {
    for (size_t i = 0; i < text.size();) {
      int32_t best = -1;
      size_t best_len = 0;
      for (int32_t a : added_) {
        const std::string& s = vocab_[static_cast<size_t>(a)];
        if (s.size() > best_len && text.compare(i, s.size(), s) == 0) best = a, best_len = s.size();
      }
      if (best < 0) {
        ++i;
        continue;
      }
      encode_plain(text.substr(start, i - start), out);
      out.push_back(best);
      i += best_len;
      start = i;
    }
  }
  encode_plain(text.substr(start), out);
  return out;
}

void Gpt2BpeTokenizer::append_token(int32_t id, std::string& out) const {
  QKV_CHECK(id >= 0 && id < vocab_size(), "[gpt2_bpe tokenizer] token id ", id, " is outside the vocabulary [0, ",
            vocab_size(), ")");
  out += bytes_[static_cast<size_t>(id)];
}

std::string Gpt2BpeTokenizer::serialize() const {
  json merges = json::array();
  for (const auto& [a, b] : merges_) merges.push_back(a + " " + b);
  return json{
      {"kind", kKind}, {"version", kSerializedVersion}, {"vocab", vocab_}, {"merges", merges}, {"added", added_}}
      .dump(-1, ' ', false, json::error_handler_t::strict);
}

std::string Gpt2BpeTokenizer::vocab_json() const {
  json v = json::object();
  for (size_t i = 0; i < vocab_.size(); ++i) v[vocab_[i]] = i;
  return v.dump();
}

std::string Gpt2BpeTokenizer::merges_txt() const {
  std::string out = "#version: 0.2\n";
  for (const auto& [a, b] : merges_) out += a + " " + b + "\n";
  return out;
}

namespace {

std::pair<std::string, std::string> split_merge(const json& m, size_t rank, const std::string& what) {
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) return {m[0], m[1]};
  QKV_CHECK(m.is_string(), what, ": merge ", rank, " is neither \"a b\" nor [a, b]");
  const std::string s = m;
  const size_t sp = s.find(' ');
  QKV_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos, what,
            ": merge ", rank, " ", q(s), " is not two tokens separated by one space");
  return {s.substr(0, sp), s.substr(sp + 1)};
}

// vocab {text: id} -> texts by id, dense.
std::vector<std::string> dense_vocab(const json& v, const std::string& what) {
  QKV_CHECK(v.is_object() && !v.empty(), what, ": vocab is not a non-empty {token: id} object");
  std::vector<std::string> out(v.size());
  std::vector<char> seen(v.size(), 0);
  for (auto it = v.begin(); it != v.end(); ++it) {
    QKV_CHECK(it.value().is_number_unsigned(), what, ": vocab id of ", q(it.key()), " is not a non-negative integer");
    const uint64_t id = it.value();
    QKV_CHECK(id < v.size(), what, ": vocab id ", id, " of ", q(it.key()), " is not below the vocabulary size ",
              v.size(), " (ids must be 0..V-1)");
    QKV_CHECK(!seen[id], what, ": vocab id ", id, " is given to two tokens");
    seen[id] = 1;
    out[id] = it.key();
  }
  return out;
}

}  // namespace

std::unique_ptr<Gpt2BpeTokenizer> Gpt2BpeTokenizer::from_vocab_merges(const std::string& vocab_json,
                                                                      const std::string& merges_txt) {
  return json_guard(std::string("vocab.json"), vocab_json, [&] {
    std::vector<std::string> vocab = dense_vocab(parse_json(vocab_json, "vocab.json"), "vocab.json");
    std::vector<std::pair<std::string, std::string>> merges;
    std::istringstream in(merges_txt);
    std::string line;
    for (size_t lineno = 1; std::getline(in, line); ++lineno) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
      merges.push_back(split_merge(json(line), merges.size(), cat("merges.txt line ", lineno)));
    }
    // Added tokens: neither a byte token nor made by a merge.
    std::unordered_map<std::string, int> made;
    for (const auto& [a, b] : merges) made[a + b] = 1;
    std::vector<int32_t> added;
    for (size_t i = 0; i < vocab.size(); ++i) {
      std::string bytes;
      const bool is_byte = bytelevel::to_bytes(vocab[i], bytes) && bytes.size() == 1;
      if (!is_byte && !made.count(vocab[i])) added.push_back(static_cast<int32_t>(i));
    }
    return std::make_unique<Gpt2BpeTokenizer>(std::move(vocab), std::move(merges), std::move(added));
  });
}

std::unique_ptr<Gpt2BpeTokenizer> Gpt2BpeTokenizer::from_tokenizer_json(const std::string& text) {
  return json_guard(std::string("tokenizer.json"), text, [&] {
    const std::string what = "tokenizer.json";
    const json j = parse_json(text, what);
    QKV_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), what, ": has no \"model\" object");
    const json& m = j["model"];
    const std::string type = field_or(m, "type", std::string("BPE"), what, "model.");
    QKV_CHECK(type == "BPE", what, ": model.type is ", q(type), " (only GPT-2's byte-level BPE is supported)");
    const auto refuse_set = [&](const json& obj, const char* key, const std::string& where) {
      if (obj.contains(key) && !obj[key].is_null() && !(obj[key].is_string() && obj[key].get<std::string>().empty()) &&
          !(obj[key].is_boolean() && !obj[key].get<bool>()))
        fail(what, ": ", where, key, " = ", obj[key].dump(), " is not supported (GPT-2's byte-level BPE has none)");
    };
    // ignore_merges = true takes a pre-token found whole in the vocabulary as one token, skipping
    // the merges that GPT-2's BPE (and qkv's encode) apply, so the ids can differ.
    for (const char* k : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                          "byte_fallback", "ignore_merges"})
      refuse_set(m, k, "model.");
    refuse_set(j, "normalizer", "");
    const json pre = j.value("pre_tokenizer", json());
    QKV_CHECK(pre.is_object() && field_or(pre, "type", std::string(), what, "pre_tokenizer.") == "ByteLevel", what,
              ": pre_tokenizer is not ByteLevel (", pre.dump(), ")");
    QKV_CHECK(!field_or(pre, "add_prefix_space", false, what, "pre_tokenizer."), what,
              ": pre_tokenizer.add_prefix_space = true is not supported");
    QKV_CHECK(field_or(pre, "use_regex", true, what, "pre_tokenizer."), what,
              ": pre_tokenizer.use_regex = false is not supported");
    if (j.contains("decoder") && !j["decoder"].is_null())
      QKV_CHECK(field_or(j["decoder"], "type", std::string(), what, "decoder.") == "ByteLevel", what,
                ": decoder is not ByteLevel (", j["decoder"].dump(), ")");
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      std::vector<std::string> added_by_template;
      tokens_added_by_post_processor(j["post_processor"], what, "post_processor", added_by_template);
      if (!added_by_template.empty()) {
        std::string names;
        std::vector<std::string> distinct;  // a template names its token in each place it puts it
        for (const std::string& t : added_by_template)
          if (std::find(distinct.begin(), distinct.end(), t) == distinct.end()) distinct.push_back(t);
        for (const std::string& t : distinct) names += (names.empty() ? "" : ", ") + q(t);
        fail(what, ": post_processor adds the special token", distinct.size() > 1 ? "s " : " ", names,
             ", which qkv's encode would not add");
      }
    }
    std::vector<std::string> vocab = dense_vocab(m.value("vocab", json()), what + " model");
    std::vector<std::pair<std::string, std::string>> merges;
    QKV_CHECK(m.contains("merges") && m["merges"].is_array(), what, ": model.merges is not a list");
    for (const json& e : m["merges"]) merges.push_back(split_merge(e, merges.size(), what));
    std::vector<int32_t> added;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        QKV_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_unsigned() && a.contains("content"), what,
                  ": an added_tokens entry lacks id or content");
        const uint64_t id = a["id"];
        const std::string content = field_or(a, "content", std::string(), what, "added_tokens[].");
        for (const char* k : {"single_word", "lstrip", "rstrip"})
          QKV_CHECK(!field_or(a, k, false, what, "added_tokens[]."), what, ": added token ", q(content), " has ", k,
                    " = true (not supported)");
        if (id < vocab.size()) {
          QKV_CHECK(vocab[id] == content, what, ": added token ", q(content), " has id ", id,
                    ", which the vocab gives to ", q(vocab[id]));
        } else {
          QKV_CHECK(id == vocab.size(), what, ": added token ", q(content), " has id ", id, ", leaving a gap after ",
                    vocab.size() - 1);
          vocab.push_back(content);
        }
        added.push_back(static_cast<int32_t>(id));
      }
    }
    return std::make_unique<Gpt2BpeTokenizer>(std::move(vocab), std::move(merges), std::move(added));
  });
}

std::unique_ptr<Gpt2BpeTokenizer> Gpt2BpeTokenizer::from_serialized(const std::string& text) {
  return json_guard(std::string("[tokenizer] stored gpt2_bpe tokenizer"), text, [&] {
    const json j = parse_json(text, "[tokenizer] stored gpt2_bpe tokenizer");
    QKV_CHECK(j.contains("vocab") && j["vocab"].is_array() && j.contains("merges") && j["merges"].is_array() &&
                  j.contains("added") && j["added"].is_array(),
              "[tokenizer] stored gpt2_bpe tokenizer lacks vocab, merges or added");
    std::vector<std::pair<std::string, std::string>> merges;
    for (const json& e : j["merges"]) merges.push_back(split_merge(e, merges.size(), "[tokenizer] stored gpt2_bpe"));
    return std::make_unique<Gpt2BpeTokenizer>(j["vocab"].get<std::vector<std::string>>(), std::move(merges),
                                              j["added"].get<std::vector<int32_t>>());
  });
}

}  // namespace qkv
