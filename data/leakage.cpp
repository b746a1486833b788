// Leakage measures (see data/leakage.h). Train windows are hashed once into a sorted vector
// (O(N log N), 8 bytes per window, cache-friendlier than a hash set at a million entries);
// each val window is then a binary search. Rolling hash mod the Mersenne prime 2^61 - 1:
// h(t_0..t_{n-1}) = sum_i (t_i + 1) · B^(n-1-i), updated in O(1) per shift.
#include "data/leakage.h"

#include <algorithm>
#include <unordered_map>

#include "tensor/error.h"

namespace qkv {

namespace {

constexpr uint64_t kMod = (1ull << 61) - 1;
constexpr uint64_t kBase = 0x1f3d5b79a2c4e687ull % kMod;

uint64_t mulmod(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  uint64_t r = static_cast<uint64_t>(p & kMod) + static_cast<uint64_t>(p >> 61);
  if (r >= kMod) r -= kMod;
  return r;
}
uint64_t addmod(uint64_t a, uint64_t b) {
  uint64_t r = a + b;
  if (r >= kMod) r -= kMod;
  return r;
}

// Calls fn(hash) for every n-token window of every document of `s`.
template <class Fn>
void for_each_window(const TokenSplit& s, int n, uint64_t top_power, Fn&& fn) {
  for (int64_t d = 0; d < s.n_docs(); ++d) {
    const std::span<const int32_t> doc = s.doc(d);
    if (static_cast<int64_t>(doc.size()) < n) continue;
    uint64_t h = 0;
    for (int i = 0; i < n; ++i) h = addmod(mulmod(h, kBase), static_cast<uint64_t>(doc[i]) + 1);
    fn(h);
    for (size_t i = static_cast<size_t>(n); i < doc.size(); ++i) {
      const uint64_t out = mulmod(static_cast<uint64_t>(doc[i - n]) + 1, top_power);
      h = addmod(mulmod(addmod(h, kMod - out), kBase), static_cast<uint64_t>(doc[i]) + 1);
      fn(h);
    }
  }
}

uint64_t hash_all(std::span<const int32_t> t) {
  uint64_t h = static_cast<uint64_t>(t.size()) % kMod;
  for (int32_t v : t) h = addmod(mulmod(h, kBase), static_cast<uint64_t>(v) + 1);
  return h;
}

}  // namespace

LeakageReport measure_leakage(const TokenSplit& train, const TokenSplit& val, int n) {
  QKV_CHECK(n >= 1, "[leakage] n-gram length ", n, " must be positive");
  LeakageReport r;
  r.n = n;
  uint64_t top = 1;  // B^(n-1)
  for (int i = 1; i < n; ++i) top = mulmod(top, kBase);

  std::vector<uint64_t> seen;
  seen.reserve(static_cast<size_t>(std::max<int64_t>(0, train.size())));
  for_each_window(train, n, top, [&](uint64_t h) { seen.push_back(h); });
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  for_each_window(val, n, top, [&](uint64_t h) {
    ++r.val_ngrams;
    r.shared_ngrams += std::binary_search(seen.begin(), seen.end(), h);
  });
  r.ngram_share = r.val_ngrams ? static_cast<double>(r.shared_ngrams) / static_cast<double>(r.val_ngrams) : 0.0;

  std::unordered_multimap<uint64_t, int64_t> train_docs;
  for (int64_t d = 0; d < train.n_docs(); ++d) train_docs.emplace(hash_all(train.doc(d)), d);
  r.val_docs = val.n_docs();
  for (int64_t d = 0; d < val.n_docs(); ++d) {
    const std::span<const int32_t> v = val.doc(d);
    auto [lo, hi] = train_docs.equal_range(hash_all(v));
    for (auto it = lo; it != hi; ++it) {
      const std::span<const int32_t> t = train.doc(it->second);
      if (std::equal(v.begin(), v.end(), t.begin(), t.end())) {
        ++r.duplicated_docs;
        break;
      }
    }
  }
  return r;
}

}  // namespace qkv
