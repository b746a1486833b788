// Byte-level BPE (Sennrich et al. 2016; byte-level as in GPT-2): start from the 256 byte tokens
// and repeatedly merge the most frequent adjacent pair into a new token.
//
// Training counts pairs inside the distinct pre-split chunks ("words", each weighted by how often
// it occurs), so a corpus of W distinct words costs O(total word bytes) to start. Each merge then
// touches only the words that contain the pair (an inverted index pair -> words): their old pairs
// are subtracted, the word is rewritten, its new pairs are added. The best pair comes from a lazy
// max-heap whose stale entries (count changed since push) are skipped when popped. Ties go to the
// smallest (left, right) id pair, so the result does not depend on hash-table order.
//
// Encoding a chunk repeatedly merges its lowest-rank adjacent pair; since a merge can only create
// pairs of higher rank, this reproduces exactly what training did to the same chunk.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <queue>

#include "data/tokenizer.h"
#include "tensor/error.h"

namespace qkv {

namespace {

constexpr size_t kMaxChunk = 64;

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

enum class ByteClass { letter, digit, space, other };

ByteClass classify(unsigned char c) {
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return ByteClass::letter;
  if (c >= '0' && c <= '9') return ByteClass::digit;
  if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f') return ByteClass::space;
  return ByteClass::other;
}

}  // namespace

size_t contraction_at(std::string_view t, size_t i) {
  if (i + 1 < t.size()) {
    const char c = t[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  }
  if (i + 2 < t.size()) {
    const std::string_view two = t.substr(i + 1, 2);
    if (two == "re" || two == "ve" || two == "ll") return 3;
  }
  return 0;
}

std::vector<std::string_view> bpe_pre_split(std::string_view t) {
  std::vector<std::string_view> out;
  out.reserve(t.size() / 4 + 1);
  const auto cls = [&](size_t k) { return classify(static_cast<unsigned char>(t[k])); };
  size_t i = 0;
  while (i < t.size()) {
    size_t end;
    size_t contraction = t[i] == '\'' ? contraction_at(t, i) : 0;
    if (contraction) {
      end = i + contraction;
    } else {
      size_t j = i;
      if (t[j] == ' ' && j + 1 < t.size() && cls(j + 1) != ByteClass::space) ++j;  // a word's leading space
      const ByteClass k = cls(j);
      if (k != ByteClass::space) {
        end = j + 1;
        while (end < t.size() && cls(end) == k) ++end;
      } else {
        end = i;
        while (end < t.size() && cls(end) == ByteClass::space) ++end;
        if (end < t.size() && end - i > 1 && t[end - 1] == ' ') --end;  // leave the space to the next word
      }
    }
    // Cut very long chunks, preferably at a UTF-8 character start.
    while (end - i > kMaxChunk) {
      size_t cut = i + kMaxChunk;
      while (cut > i && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
      if (cut == i) cut = i + kMaxChunk;
      out.push_back(t.substr(i, cut - i));
      i = cut;
    }
    out.push_back(t.substr(i, end - i));
    i = end;
  }
  return out;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::train(std::string_view corpus, int32_t vocab_size) {
  QKV_CHECK(vocab_size >= 256, "[bpe] vocab_size ", vocab_size, " is below the 256 byte tokens");
  struct Word {
    std::vector<int32_t> ids;
    int64_t freq;
  };
  std::vector<Word> words;
  {
    std::unordered_map<std::string_view, int64_t> freq;
    for (std::string_view c : bpe_pre_split(corpus)) ++freq[c];
    std::vector<std::pair<std::string_view, int64_t>> sorted(freq.begin(), freq.end());
    std::sort(sorted.begin(), sorted.end());  // fixed word order: runs are reproducible end to end
    words.reserve(sorted.size());
    for (const auto& [w, f] : sorted) {
      Word word{std::vector<int32_t>(w.size()), f};
      for (size_t i = 0; i < w.size(); ++i) word.ids[i] = static_cast<unsigned char>(w[i]);
      words.push_back(std::move(word));
    }
  }

  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // may hold stale words; re-checked on use
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& ids = words[w].ids;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const uint64_t k = pair_key(ids[i], ids[i + 1]);
      count[k] += words[w].freq;
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w)) list.push_back(static_cast<int32_t>(w));
    }
  }

  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [k, c] : count) heap.push({c, k});

  std::vector<Pair> merges;
  std::vector<int32_t> stamp(words.size(), -1);
  std::vector<uint64_t> touched;
  std::vector<int32_t> merged;
  const int32_t n_merges = vocab_size - 256;
  while (static_cast<int32_t>(merges.size()) < n_merges) {
    while (!heap.empty()) {
      auto it = count.find(heap.top().key);
      if (it != count.end() && it->second == heap.top().count) break;
      heap.pop();
    }
    if (heap.empty() || heap.top().count < 2) break;
    const uint64_t key = heap.top().key;
    heap.pop();
    const auto a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffffu);
    const auto new_id = static_cast<int32_t>(256 + merges.size());
    const auto merge_idx = static_cast<int32_t>(merges.size());
    merges.emplace_back(a, b);

    std::vector<int32_t> affected = std::move(where[key]);
    where.erase(key);
    touched.clear();
    for (int32_t w : affected) {
      if (stamp[w] == merge_idx) continue;
      stamp[w] = merge_idx;
      std::vector<int32_t>& ids = words[w].ids;
      const int64_t f = words[w].freq;
      bool present = false;
      for (size_t i = 0; i + 1 < ids.size() && !present; ++i) present = ids[i] == a && ids[i + 1] == b;
      if (!present) continue;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const uint64_t k = pair_key(ids[i], ids[i + 1]);
        count[k] -= f;
        touched.push_back(k);
      }
      merged.clear();
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
          merged.push_back(new_id);
          i += 2;
        } else {
          merged.push_back(ids[i++]);
        }
      }
      ids.assign(merged.begin(), merged.end());
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const uint64_t k = pair_key(ids[i], ids[i + 1]);
        count[k] += f;
        touched.push_back(k);
        if (ids[i] == new_id || ids[i + 1] == new_id) {
          auto& list = where[k];
          if (list.empty() || list.back() != w) list.push_back(w);
        }
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      auto it = count.find(k);
      if (it->second <= 0) count.erase(it);
      else heap.push({it->second, k});
    }
  }
  return std::make_unique<BpeTokenizer>(std::move(merges));
}

BpeTokenizer::BpeTokenizer(std::vector<Pair> merges) : merges_(std::move(merges)) {
  token_bytes_.reserve(256 + merges_.size());
  for (int c = 0; c < 256; ++c) token_bytes_.emplace_back(1, static_cast<char>(c));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [a, b] = merges_[i];
    const int32_t limit = static_cast<int32_t>(256 + i);
    QKV_CHECK(a >= 0 && a < limit && b >= 0 && b < limit, "[bpe] merge ", i, " (", a, ", ", b,
              ") uses a token that does not exist yet");
    QKV_CHECK(rank_.emplace(pair_key(a, b), static_cast<int32_t>(i)).second, "[bpe] merge ", i, " (", a, ", ", b,
              ") repeats an earlier merge");
    token_bytes_.push_back(token_bytes_[a] + token_bytes_[b]);
  }
}

void BpeTokenizer::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  const size_t start = out.size();
  for (unsigned char c : chunk) out.push_back(c);
  size_t n = out.size() - start;
  int32_t* ids = out.data() + start;
  while (n >= 2) {
    int32_t best = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i) {
      auto it = rank_.find(pair_key(ids[i], ids[i + 1]));
      if (it != rank_.end() && it->second < best) best = it->second;
    }
    if (best == INT32_MAX) break;
    const auto [a, b] = merges_[static_cast<size_t>(best)];
    size_t o = 0;
    for (size_t i = 0; i < n;) {
      if (i + 1 < n && ids[i] == a && ids[i + 1] == b) {
        ids[o++] = 256 + best;
        i += 2;
      } else {
        ids[o++] = ids[i++];
      }
    }
    n = o;
  }
  out.resize(start + n);
}

// Natural text repeats its words: each distinct chunk is encoded once per cache.
void BpeTokenizer::encode_cached(std::string_view text, ChunkCache& cache, std::vector<int32_t>& out) const {
  for (std::string_view chunk : bpe_pre_split(text)) {
    auto it = cache.find(chunk);
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      encode_chunk(chunk, ids);
      it = cache.emplace(chunk, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  ChunkCache cache;
  encode_cached(text, cache, out);
  return out;
}

std::vector<std::vector<int32_t>> BpeTokenizer::encode_each(std::span<const std::string> texts) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  ChunkCache cache;  // keys view into `texts`, which outlive it
  for (size_t i = 0; i < texts.size(); ++i) encode_cached(texts[i], cache, out[i]);
  return out;
}

void BpeTokenizer::append_token(int32_t id, std::string& out) const {
  QKV_CHECK(id >= 0 && id < vocab_size(), "[bpe tokenizer] token id ", id, " is outside the vocabulary [0, ",
            vocab_size(), ")");
  out += token_bytes_[static_cast<size_t>(id)];
}

std::string BpeTokenizer::serialize() const {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges_) m.push_back({a, b});
  return nlohmann::json{{"kind", kind()}, {"version", 1}, {"pre_split", kPreSplit}, {"merges", m}}.dump();
}

}  // namespace qkv
