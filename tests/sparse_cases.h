// Shared by the sparse-pattern tests (test_attention_sparse*.cpp): the patterns they run, and the
// documented predicate written out again from attention.h alone (no code of attention/pattern/pattern.*),
// the independent reference both the layout/mask tests and the kernels' float64 brute force use.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/mask.h"
#include "tensor/philox.h"

namespace qkv::test {

using attn::Pattern;
using attn::SparsePattern;

// The CPU kernels' (square) tile grid, in which layouts and visited tiles are counted.
static_assert(attn::kTileQ == attn::kTileK);
constexpr int64_t kT = attn::kTileQ;

inline std::shared_ptr<const SparsePattern> make(Pattern kind, std::function<void(SparsePattern&)> set = {}) {
  auto p = std::make_shared<SparsePattern>();
  p->kind = kind;
  if (set) set(*p);
  attn::load_layout(*p);
  return p;
}

// The documented predicate, written out again from attention.h (not from patterns.cpp).
inline bool doc_allows(const SparsePattern& sp, int64_t nk, bool causal, int64_t p, int64_t j) {
  const int64_t d = p - j, ad = d < 0 ? -d : d, bs = sp.block_size;
  int64_t s = sp.stride;
  if (s == 0) {
    s = 1;
    while (s * s < nk) ++s;
  }
  auto global = [&](int64_t x) {
    if (sp.global_tokens.empty()) return x < sp.global;
    for (int64_t t : sp.global_tokens)
      if (t == x) return true;
    return false;
  };
  const int64_t qb = p / bs, kb = j / bs;
  switch (sp.kind) {
    case Pattern::full:
      return true;
    case Pattern::window:
      return ad < (sp.local ? sp.local : bs);
    case Pattern::strided:
      return ad < (sp.local ? sp.local : s) || d % s == 0;
    case Pattern::global:
      return ad < (sp.local ? sp.local : 1) || global(p) || global(j);
    case Pattern::bigbird: {
      if (ad < (sp.local ? sp.local : bs) || global(p) || global(j)) return true;
      for (int64_t k = 0; k < sp.random_blocks; ++k) {
        const Philox4 r = philox4x32_10(uint32_t(qb), uint32_t(k), 0x5ba25e00u, uint32_t(qb >> 32), uint32_t(sp.seed),
                                        uint32_t(sp.seed >> 32));
        const uint64_t m = causal ? uint64_t(qb) + 1 : uint64_t((nk + bs - 1) / bs);
        if (int64_t(((uint64_t(r.v[0]) << 32) | r.v[1]) % m) == kb) return true;
      }
      return false;
    }
    case Pattern::block_sparse:
      if (sp.layout == "local_global") return std::abs(qb - kb) <= 1 || kb == 0 || qb == 0;
      if (sp.layout == "fixed") return kb == qb || kb % 4 == 3;
      return sp.layout_table[qb * sp.layout_cols + kb] != 0;
  }
  return false;
}

struct Case {
  std::string name;
  std::shared_ptr<const SparsePattern> pattern;
};

inline std::vector<Case> patterns_at_300() {
  return {
      {"window l=50", make(Pattern::window, [](SparsePattern& p) { p.local = 50; })},
      {"window l=200 (full tiles)", make(Pattern::window, [](SparsePattern& p) { p.local = 200; })},
      {"block_sparse local_global bs=64 (full tiles)",
       make(Pattern::block_sparse, [](SparsePattern& p) { p.block_size = 64; })},
      {"strided auto (s=l=18)", make(Pattern::strided)},
      {"strided s=7 l=20", make(Pattern::strided,
                                [](SparsePattern& p) {
                                  p.stride = 7;
                                  p.local = 20;
                                })},
      {"global g=3 l=30", make(Pattern::global,
                               [](SparsePattern& p) {
                                 p.global = 3;
                                 p.local = 30;
                               })},
      {"global list", make(Pattern::global,
                           [](SparsePattern& p) {
                             p.global_tokens = {5, 100, 257};
                           })},
      {"bigbird bs=32 r=2", make(Pattern::bigbird,
                                 [](SparsePattern& p) {
                                   p.block_size = 32;
                                   p.global = 2;
                                   p.seed = 5;
                                 })},
      {"block_sparse local_global bs=48", make(Pattern::block_sparse, [](SparsePattern& p) { p.block_size = 48; })},
      {"block_sparse fixed bs=40", make(Pattern::block_sparse,
                                        [](SparsePattern& p) {
                                          p.block_size = 40;
                                          p.layout = "fixed";
                                        })},
  };
}

}  // namespace qkv::test
