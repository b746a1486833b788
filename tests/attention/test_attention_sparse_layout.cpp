// Sparse attention patterns, their layouts and masks (attention/pattern/pattern.h): hand-written
// layouts, layout files, and the mask, the kept pairs, the layout's boxes and mask_row against the
// predicate written out again from the formulas alone (sparse_cases.h). The kernels' values are
// tested in test_attention_sparse.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <unistd.h>

#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "sparse_cases.h"
#include "tensor/ops.h"

using namespace qkv;
using namespace qkv::attn;
using namespace qkv::test;

namespace {

// rows of '0'/'1' of visibility_mask for one (b, h).
std::vector<std::string> mask_rows(const AttentionShape& s, const AttentionOptions& o) {
  const Tensor m = visibility_mask(s, o);
  std::vector<std::string> rows;
  for (int64_t i = 0; i < s.nq; ++i) {
    std::string r;
    for (int64_t j = 0; j < s.nk; ++j) r += m.data<bool>()[i * s.nk + j] ? '1' : '0';
    rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST_CASE("sparse: strided s=l=3 at N=10 is the hand-written layout", "[attention][sparse]") {
  AttentionOptions o;
  o.causal = true;
  o.pattern = make(Pattern::strided, [](SparsePattern& p) {
    p.stride = 3;
    p.local = 3;
  });
  // row p: the window p-2..p, and every j with (p - j) divisible by 3
  const std::vector<std::string> want = {
      "1000000000",  // 0
      "1100000000",  // 1
      "1110000000",  // 2
      "1111000000",  // 3: 0 by stride
      "0111100000",  // 4: 1 by stride
      "0011110000",  // 5: 2 by stride
      "1001111000",  // 6: 0, 3 by stride
      "0100111100",  // 7: 1, 4
      "0010011110",  // 8: 2, 5
      "1001001111",  // 9: 0, 3, 6
  };
  CHECK(mask_rows({1, 1, 1, 10, 10}, o) == want);
  // Without causal the same pattern is symmetric: |p - j| < 3 or 3 | (p - j).
  o.causal = false;
  const auto sym = mask_rows({1, 1, 1, 10, 10}, o);
  CHECK(sym[0] == "1111001001");
  CHECK(sym[4] == "0111111100");
  // Decode: the last 3 queries over 10 keys see rows 7..9 of the same layout.
  o.causal = true;
  const auto tail = mask_rows({1, 1, 1, 3, 10}, o);
  CHECK(tail == std::vector<std::string>(want.begin() + 7, want.end()));
}

TEST_CASE("sparse: global, block_sparse and window layouts by hand", "[attention][sparse]") {
  AttentionOptions o;
  o.pattern = make(Pattern::global, [](SparsePattern& p) { p.global = 2; });
  CHECK(mask_rows({1, 1, 1, 6, 6}, o) ==
        std::vector<std::string>{"111111", "111111", "111000", "110100", "110010", "110001"});
  o.causal = true;  // a global token sees only the past: row 1 sees 0 and 1, never later keys
  CHECK(mask_rows({1, 1, 1, 6, 6}, o) ==
        std::vector<std::string>{"100000", "110000", "111000", "110100", "110010", "110001"});
  o.causal = false;
  o.pattern = make(Pattern::block_sparse, [](SparsePattern& p) { p.block_size = 2; });  // local_global
  CHECK(mask_rows({1, 1, 1, 8, 8}, o) == std::vector<std::string>{"11111111", "11111111", "11111100", "11111100",
                                                                  "11111111", "11111111", "11001111", "11001111"});
  o.pattern = make(Pattern::window, [](SparsePattern& p) { p.local = 2; });
  CHECK(mask_rows({1, 1, 1, 4, 4}, o) == std::vector<std::string>{"1100", "1110", "0111", "0011"});
}

TEST_CASE("sparse: a layout file is read, checked, and can empty rows", "[attention][sparse]") {
  const std::string path = "sparse_layout_test.txt";
  {
    std::ofstream f(path);
    f << "# query blocks x key blocks\n10\n01\n";
  }
  AttentionOptions o;
  o.pattern = make(Pattern::block_sparse, [&](SparsePattern& p) {
    p.block_size = 2;
    p.layout = path;
  });
  CHECK(mask_rows({1, 1, 1, 4, 4}, o) == std::vector<std::string>{"1100", "1100", "0011", "0011"});
  // causal: rows 2 and 3 see keys 2..3 only up to themselves; with a table 01/00 row block 1 is empty
  {
    std::ofstream f(path);
    f << "1 0\n0 0\n";
  }
  o.pattern = make(Pattern::block_sparse, [&](SparsePattern& p) {
    p.block_size = 2;
    p.layout = path;
  });
  CHECK(count_fully_masked_rows({2, 3, 3, 4, 4}, o) == 2 * 3 * 2);
  Tensor q = randn({2, 3, 4, 4}, 1), k = randn({2, 3, 4, 4}, 2), v = randn({2, 3, 4, 4}, 3);
  const Tensor out = attention(q, k, v, o);  // zero policy: rows 2, 3 are zero, never NaN
  const auto ov = out.to_vector();
  for (size_t e = 0; e < ov.size(); ++e) {
    REQUIRE(std::isfinite(ov[e]));
    if ((e / 4) % 4 >= 2) CHECK(ov[e] == 0.0);
  }
  o.fully_masked = FullyMasked::error;
  CHECK_THROWS_WITH(attention(q, k, v, o), Catch::Contains("query row 2 of batch 0, head 0"));
  {
    std::ofstream f(path);
    f << "10\n0x\n";
  }
  SparsePattern bad;
  bad.kind = Pattern::block_sparse;
  bad.layout = path;
  CHECK_THROWS_WITH(load_layout(bad), Catch::Contains("line 2"));
  // A table smaller than the call
  {
    std::ofstream f(path);
    f << "11\n11\n";
  }
  o.fully_masked = FullyMasked::zero;
  o.pattern = make(Pattern::block_sparse, [&](SparsePattern& p) {
    p.block_size = 1;
    p.layout = path;
  });
  CHECK_THROWS_WITH(attention(q, k, v, o), Catch::Contains("needs 4x4"));
  std::remove(path.c_str());
}

TEST_CASE("sparse: visibility_mask, kept pairs and the layout agree with the documented predicate",
          "[attention][sparse]") {
  for (const Case& c : patterns_at_300())
    for (int causal = 0; causal < 2; ++causal)
      for (int64_t nq : {int64_t(300), int64_t(37)}) {
        INFO(c.name << " causal " << causal << " Nq " << nq);
        AttentionOptions o;
        o.causal = causal;
        o.pattern = c.pattern;
        const AttentionShape s{1, 2, 1, nq, 300};
        const Tensor m = visibility_mask(s, o);
        int64_t kept = 0, mismatch = 0;
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t j = 0; j < 300; ++j) {
              const int64_t p = 300 - nq + i;
              const bool want = (!causal || j <= p) && doc_allows(*c.pattern, 300, causal, p, j);
              kept += want;
              mismatch += m.data<bool>()[(h * nq + i) * 300 + j] != want;
            }
        CHECK(mismatch == 0);
        const PatternStats st = pattern_stats(s, o);
        CHECK(st.kept_pairs == kept);
        CHECK(st.visited_tiles <= st.total_tiles);
        CHECK(st.total_tiles == ((nq + kT - 1) / kT) * ((300 + kT - 1) / kT));
      }
  // Each non-empty tile's box is the bounding box of its visible pairs (keys rounded out to
  // multiples of 8), in both the CSR and the CSC order.
  for (const Case& c : patterns_at_300())
    for (int causal = 0; causal < 2; ++causal) {
      INFO(c.name << " causal " << causal << " (boxes)");
      AttentionOptions o;
      o.causal = causal;
      o.pattern = c.pattern;
      const int64_t nq = 300, nk = 300;
      const AttentionShape s{1, 1, 1, nq, nk};
      const Tensor m = visibility_mask(s, o);
      const auto L = block_layout(*c.pattern, mask_rules(s, o), nq, nk, kT, kT);
      int64_t checked = 0;
      for (int64_t qt = 0; qt < L->nqt; ++qt)
        for (int64_t e = L->row_ptr[qt]; e < L->row_ptr[qt + 1]; ++e) {
          const int64_t kt = L->row_tiles[e];
          int64_t r0 = kT, r1 = 0, c0 = kT, c1 = 0;
          for (int64_t i = qt * kT; i < std::min(nq, (qt + 1) * kT); ++i)
            for (int64_t j = kt * kT; j < std::min(nk, (kt + 1) * kT); ++j)
              if (m.data<bool>()[i * nk + j]) {
                r0 = std::min(r0, i - qt * kT);
                r1 = std::max(r1, i - qt * kT + 1);
                c0 = std::min(c0, j - kt * kT);
                c1 = std::max(c1, j - kt * kT + 1);
              }
          const BlockLayout::Box& box = L->row_boxes[e];
          CHECK(box.r0 == r0);
          CHECK(box.r1 == r1);
          CHECK(box.c0 == c0 / 8 * 8);
          CHECK(box.c1 == std::min<int64_t>(kT, (c1 + 7) / 8 * 8));
          int64_t at = L->col_ptr[kt];
          while (L->col_tiles[at] != qt) ++at;
          CHECK(std::memcmp(&L->col_boxes[at], &box, sizeof box) == 0);
          ++checked;
        }
      CHECK(checked == static_cast<int64_t>(L->row_tiles.size()));
      CHECK(checked > 0);
    }
  // The window skips tiles; a wide non-causal window has full tiles (no per-element mask there).
  AttentionOptions o;
  o.pattern = make(Pattern::window, [](SparsePattern& p) { p.local = 200; });
  const PatternStats st = pattern_stats({1, 1, 1, 640, 640}, o);
  CHECK(st.total_tiles == (640 / kT) * (640 / kT));
  CHECK(st.full_tiles > 0);
  // visited: per query tile r, key tiles from the one holding r·kT − 199 to the one holding
  // r·kT + kT − 1 + 199
  int64_t want = 0;
  for (int64_t r = 0; r < 640 / kT; ++r)
    want += std::min<int64_t>(640 / kT - 1, (r * kT + kT - 1 + 199) / kT) - std::max<int64_t>(0, r * kT - 199) / kT + 1;
  CHECK(st.visited_tiles == want);
  // Causal, it takes the band-only walk (fused.h): rows [i0, i0 + 8) compute the keys
  // [max(0, i0 − 199), i0 + 8), and visited_tiles is those logits in kT × kT tiles' worth.
  o.causal = true;
  const PatternStats walk = pattern_stats({1, 1, 1, 640, 640}, o);
  REQUIRE(kWalkQ == 8);
  int64_t logits = 0;
  for (int64_t i0 = 0; i0 < 640; i0 += 8) logits += 8 * (i0 + 8 - std::max<int64_t>(0, i0 - 199));
  CHECK(walk.visited_tiles == (logits + kT * kT - 1) / (kT * kT));
  CHECK(walk.full_tiles == 0);
  CHECK(walk.kept_pairs == 640 * 200 - 200 * 199 / 2);
  // The sliding window without a pattern takes the same walk while it cuts a key of some row;
  // as long as the last position (here 639 + 1 keys), it is causal attention and keeps the grid.
  for (int64_t w : {int64_t(200), int64_t(639), int64_t(640), int64_t(5000)}) {
    AttentionOptions sw;
    sw.window = w;
    const AttentionShape s{1, 1, 1, 640, 640};
    INFO("sliding window " << w);
    CHECK(block_layout(SparsePattern{}, mask_rules(s, sw), 640, 640, kT, kT)->regrouped == (w < 640));
    if (w == 200) CHECK(pattern_stats(s, sw).visited_tiles == walk.visited_tiles);
  }
  // Decode rows (q_offset > 0): one query at position 639 and a window of 639 still cuts key 0.
  AttentionOptions decode;
  decode.window = 639;
  CHECK(block_layout(SparsePattern{}, mask_rules({1, 1, 1, 1, 640}, decode), 1, 640, kT, kT)->regrouped);
}

// The kernels mask a partial tile's row through PatternPredicate::mask_row (intervals), not through
// allows() per key: each row it leaves must be exactly the documented predicate's, for ranges that
// start anywhere, cross block edges and exceed mask_row's 256-key pass, and keep the values it keeps.
TEST_CASE("sparse: mask_row masks exactly the keys the documented predicate drops", "[attention][sparse]") {
  std::vector<Case> cases = patterns_at_300();
  cases.push_back({"strided s=1 l=1 (every key)", make(Pattern::strided, [](SparsePattern& p) {
                     p.stride = 1;
                     p.local = 1;
                   })});
  cases.push_back({"bigbird list r=3", make(Pattern::bigbird, [](SparsePattern& p) {
                     p.block_size = 16;
                     p.global_tokens = {0, 31, 299};
                     p.random_blocks = 3;
                     p.seed = 11;
                   })});
  const int64_t nk = 300;
  uint64_t state = 12345;
  auto next = [&](int64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(n));
  };
  for (const Case& c : cases)
    for (int causal = 0; causal < 2; ++causal) {
      INFO(c.name << " causal " << causal);
      const PatternPredicate pred(*c.pattern, nk, causal);
      int64_t wrong = 0, dropped = 0, kept = 0;
      std::vector<float> row;
      for (int trial = 0; trial < 400; ++trial) {
        const int64_t p = next(nk), a = next(nk), e = a + next(nk - a + 1);
        row.assign(static_cast<size_t>(e - a), 0.f);
        for (int64_t j = a; j < e; ++j) row[j - a] = static_cast<float>(j) + 0.5f;
        pred.mask_row(p, a, e, row.data());
        for (int64_t j = a; j < e; ++j) {
          const bool want = doc_allows(*c.pattern, nk, causal, p, j);
          const float got = row[j - a];
          wrong += want ? got != static_cast<float>(j) + 0.5f : !(std::isinf(got) && got < 0);
          (want ? kept : dropped) += 1;
        }
      }
      CHECK(wrong == 0);
      CHECK(kept > 0);
      if (c.pattern->kind != Pattern::strided || c.pattern->stride != 1) CHECK(dropped > 0);
    }
  // A range longer than one 256-key pass, in double.
  const PatternPredicate pred(*make(Pattern::strided,
                                    [](SparsePattern& p) {
                                      p.stride = 5;
                                      p.local = 3;
                                    }),
                              1000, true);
  std::vector<double> row(700, 1.0);
  pred.mask_row(900, 100, 800, row.data());
  int64_t wrong = 0;
  for (int64_t j = 100; j < 800; ++j) {
    const int64_t d = 900 - j;
    const bool want = std::abs(d) < 3 || d % 5 == 0;
    wrong += want ? row[j - 100] != 1.0 : !std::isinf(row[j - 100]);
  }
  CHECK(wrong == 0);
}
