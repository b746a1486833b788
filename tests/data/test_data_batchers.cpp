// Batchers against hand-worked rows, resume and rank-slicing identities, eval windows, and the
// leakage measure on a constructed split.
#include <catch2/catch.hpp>

#include <map>
#include <numeric>

#include "data/batcher.h"
#include "data/leakage.h"
#include "tensor/error.h"
#include "tensor/philox.h"

using namespace qkv;

namespace {

std::shared_ptr<TokenSplit> make_split(const std::vector<std::vector<int32_t>>& docs,
                                       const std::string& name = "hand") {
  auto s = std::make_shared<TokenSplit>();
  s->name = name;
  s->doc_offsets = {0};
  for (const auto& d : docs) {
    s->tokens.insert(s->tokens.end(), d.begin(), d.end());
    s->doc_offsets.push_back(s->size());
  }
  return s;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int64_t> row(const Tensor& t, int64_t r) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < t.size(1); ++k) out.push_back(static_cast<int64_t>(t.at({r, k})));
  return out;
}

using Row = std::vector<int64_t>;

bool same_batch(const Batch& a, const Batch& b) {
  const auto eq = [](const Tensor& x, const Tensor& y) {
    if (x.defined() != y.defined()) return false;
    return !x.defined() || (x.shape() == y.shape() && x.to_vector() == y.to_vector());
  };
  return eq(a.x, b.x) && eq(a.y, b.y) && eq(a.key_padding, b.key_padding) && eq(a.positions, b.positions) &&
         eq(a.segment_ids, b.segment_ids) && a.n_targets == b.n_targets;
}

// Rows [r0, r0+n) of a batch as a batch of its own.
Batch rows_of(const Batch& b, int64_t r0, int64_t n) {
  Batch o;
  const auto cut = [&](const Tensor& t) { return t.defined() ? t.narrow(0, r0, n).contiguous() : Tensor(); };
  o.x = cut(b.x);
  o.y = cut(b.y);
  o.key_padding = cut(b.key_padding);
  o.positions = cut(b.positions);
  o.segment_ids = cut(b.segment_ids);
  o.n_targets = 0;
  for (double v : o.y.to_vector()) o.n_targets += v != kIgnoreIndex;
  return o;
}

// Documents of varied lengths 1..12 for the mode-agnostic identities.
std::shared_ptr<TokenSplit> varied_docs() {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 23; ++d) docs.push_back(iota_tokens(1 + (d * 5) % 12, 100 * d));
  return make_split(docs, "varied");
}

}  // namespace

TEST_CASE("random windows are shifted pairs at Philox offsets keyed by seed and step", "[data][batcher]") {
  auto split = make_split({iota_tokens(1000)});  // token value = its offset
  BatcherOptions o;
  o.batch_size = 4;
  o.block_size = 8;
  o.seed = 0x123456789abcdefull;
  Batcher b(split, o);
  for (int64_t step = 0; step < 3; ++step) {
    const Batch batch = b.next();
    REQUIRE(batch.x.shape() == Shape{4, 8});
    CHECK(batch.x.dtype() == DType::i64);
    CHECK(batch.n_targets == 32);
    CHECK_FALSE(batch.positions.defined());
    for (int64_t i = 0; i < 4; ++i) {
      // o = (philox(seed; step, row) as 64 bits) mod (n - T)
      const Philox4 r = philox4x32_10(static_cast<uint32_t>(step), 0, static_cast<uint32_t>(i), 0x77696e64u,
                                      static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32));
      const auto off = static_cast<int64_t>(((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) % (1000 - 8));
      Row want_x(8), want_y(8);
      std::iota(want_x.begin(), want_x.end(), off);
      std::iota(want_y.begin(), want_y.end(), off + 1);
      CHECK(row(batch.x, i) == want_x);
      CHECK(row(batch.y, i) == want_y);
    }
  }
  // Offsets cover [0, n - T - 1] and nothing else.
  auto tiny = make_split({iota_tokens(12)});
  o.block_size = 4;
  o.batch_size = 50;
  Batcher t(tiny, o);
  std::vector<int> hits(12, 0);
  for (int s = 0; s < 4; ++s) {
    const Batch batch = t.next();
    for (int64_t i = 0; i < 50; ++i) ++hits[static_cast<size_t>(batch.x.at({i, 0}))];
  }
  for (int k = 0; k < 8; ++k) CHECK(hits[k] > 0);
  for (int k = 8; k < 12; ++k) CHECK(hits[k] == 0);
}

TEST_CASE("a batcher restored from its state continues with identical batches", "[data][batcher]") {
  for (BatchMode mode : {BatchMode::random_windows, BatchMode::padded_docs, BatchMode::packed_docs}) {
    CAPTURE(batch_mode_name(mode));
    BatcherOptions o;
    o.mode = mode;
    o.batch_size = 5;
    o.block_size = 6;
    o.seed = 77;
    Batcher full(varied_docs(), o);
    std::vector<Batch> want;
    for (int s = 0; s < 12; ++s) want.push_back(full.next());  // several epochs of 23 documents

    Batcher first(varied_docs(), o);
    for (int s = 0; s < 5; ++s) first.next();
    const auto saved = first.state().to_array();
    Batcher resumed(varied_docs(), o);
    resumed.restore(BatcherState::from_array(saved));
    CHECK(resumed.state().step == 5);
    for (int s = 5; s < 12; ++s) CHECK(same_batch(resumed.next(), want[static_cast<size_t>(s)]));
    CHECK(resumed.state() == full.state());

    o.seed = 78;
    Batcher other(varied_docs(), o);
    CHECK_FALSE(same_batch(other.next(), want[0]));
    CHECK_THROWS_WITH(other.restore(BatcherState::from_array(saved)),
                      Catch::Contains("seed 77") && Catch::Contains("seed is 78"));
  }
}

TEST_CASE("rank r of world N gets rows r*b to (r+1)*b - 1 of the single-process batch", "[data][batcher]") {
  for (BatchMode mode : {BatchMode::random_windows, BatchMode::padded_docs, BatchMode::packed_docs}) {
    CAPTURE(batch_mode_name(mode));
    BatcherOptions g;
    g.mode = mode;
    g.batch_size = 6;
    g.block_size = 5;
    g.seed = 3;
    Batcher global(varied_docs(), g);
    std::vector<Batcher> ranks;
    for (int r = 0; r < 3; ++r) {
      BatcherOptions o = g;
      o.batch_size = 2;
      o.rank = r;
      o.world = 3;
      ranks.emplace_back(varied_docs(), o);
    }
    for (int s = 0; s < 8; ++s) {
      const Batch all = global.next();
      for (int r = 0; r < 3; ++r) CHECK(same_batch(ranks[static_cast<size_t>(r)].next(), rows_of(all, 2 * r, 2)));
    }
  }
}

TEST_CASE("padded documents: hand-worked rows under right and left padding", "[data][batcher]") {
  // A = 10 11 12, B = 20..26, C = 30 (too short: skipped), D = 40 41; T = 4, file order.
  auto split = make_split({{10, 11, 12}, {20, 21, 22, 23, 24, 25, 26}, {30}, {40, 41}});
  BatcherOptions o;
  o.mode = BatchMode::padded_docs;
  o.batch_size = 3;
  o.block_size = 4;
  o.shuffle = false;
  o.pad_id = 0;
  const int64_t I = kIgnoreIndex;
  SECTION("right") {
    Batcher b(split, o);
    const Batch batch = b.next();
    CHECK(row(batch.x, 0) == Row{10, 11, 0, 0});
    CHECK(row(batch.y, 0) == Row{11, 12, I, I});
    CHECK(row(batch.key_padding, 0) == Row{1, 1, 0, 0});
    CHECK(row(batch.positions, 0) == Row{0, 1, 0, 0});
    CHECK(row(batch.x, 1) == Row{20, 21, 22, 23});  // cut to T+1 = 5 tokens
    CHECK(row(batch.y, 1) == Row{21, 22, 23, 24});
    CHECK(row(batch.key_padding, 1) == Row{1, 1, 1, 1});
    CHECK(row(batch.positions, 1) == Row{0, 1, 2, 3});
    CHECK(row(batch.x, 2) == Row{40, 0, 0, 0});
    CHECK(row(batch.y, 2) == Row{41, I, I, I});
    CHECK(row(batch.key_padding, 2) == Row{1, 0, 0, 0});
    CHECK(batch.n_targets == 7);
    CHECK(batch.key_padding.dtype() == DType::boolean);
    CHECK_FALSE(batch.segment_ids.defined());
    // The next batch starts the second epoch: same documents again.
    const Batch again = b.next();
    CHECK(b.state().epoch == 1);
    CHECK(row(again.x, 0) == Row{10, 11, 0, 0});
  }
  SECTION("left") {
    o.padding = Padding::left;
    Batcher b(split, o);
    const Batch batch = b.next();
    CHECK(row(batch.x, 0) == Row{0, 0, 10, 11});
    CHECK(row(batch.y, 0) == Row{I, I, 11, 12});
    CHECK(row(batch.key_padding, 0) == Row{0, 0, 1, 1});
    CHECK(row(batch.positions, 0) == Row{0, 0, 0, 1});  // first real token at position 0
    CHECK(row(batch.x, 1) == Row{20, 21, 22, 23});
    CHECK(row(batch.positions, 1) == Row{0, 1, 2, 3});
    CHECK(row(batch.x, 2) == Row{0, 0, 0, 40});
    CHECK(row(batch.y, 2) == Row{I, I, I, 41});
    CHECK(row(batch.key_padding, 2) == Row{0, 0, 0, 1});
    CHECK(row(batch.positions, 2) == Row{0, 0, 0, 0});
  }
}

TEST_CASE("packed documents: hand-worked segments, positions and boundary targets", "[data][batcher]") {
  // Stream: A = 1 2 3 | B = 4 5 | C = 6..12 | (next epoch) A ...; T = 4, rows overlap by the look-ahead.
  auto split = make_split({{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10, 11, 12}});
  BatcherOptions o;
  o.mode = BatchMode::packed_docs;
  o.batch_size = 2;
  o.block_size = 4;
  o.shuffle = false;
  Batcher b(split, o);
  const int64_t I = kIgnoreIndex;
  const Batch b1 = b.next();
  CHECK(row(b1.x, 0) == Row{1, 2, 3, 4});
  CHECK(row(b1.y, 0) == Row{2, 3, I, 5});
  CHECK(row(b1.segment_ids, 0) == Row{0, 0, 0, 1});
  CHECK(row(b1.positions, 0) == Row{0, 1, 2, 0});
  CHECK(row(b1.x, 1) == Row{5, 6, 7, 8});  // starts at the previous row's look-ahead token
  CHECK(row(b1.y, 1) == Row{I, 7, 8, 9});
  CHECK(row(b1.segment_ids, 1) == Row{0, 1, 1, 1});
  CHECK(row(b1.positions, 1) == Row{0, 0, 1, 2});
  CHECK(b1.n_targets == 6);
  CHECK(b1.segment_ids.dtype() == DType::i32);
  CHECK_FALSE(b1.key_padding.defined());
  CHECK(b.state().doc == 2);
  CHECK(b.state().token == 3);
  const Batch b2 = b.next();
  CHECK(row(b2.x, 0) == Row{9, 10, 11, 12});  // C continued: a new piece from position 0
  CHECK(row(b2.y, 0) == Row{10, 11, 12, I});
  CHECK(row(b2.positions, 0) == Row{0, 1, 2, 3});
  CHECK(row(b2.x, 1) == Row{1, 2, 3, 4});  // second epoch
  CHECK(b.state().epoch == 1);
}

TEST_CASE("packed rows train every in-document pair exactly once per epoch", "[data][batcher]") {
  auto split = varied_docs();
  BatcherOptions o;
  o.mode = BatchMode::packed_docs;
  o.batch_size = 1;
  o.block_size = 7;
  o.seed = 5;
  Batcher b(split, o);
  std::map<std::pair<int64_t, int64_t>, int> trained;
  while (b.state().epoch == 0) {
    const Batch batch = b.next();
    for (int64_t k = 0; k < 7; ++k)
      if (batch.y.at({0, k}) != kIgnoreIndex)
        ++trained[{static_cast<int64_t>(batch.x.at({0, k})), static_cast<int64_t>(batch.y.at({0, k}))}];
  }
  // The last batch may have run into epoch 1; count only pairs of documents, then check each once or
  // (for pairs reached again after the epoch turned) at most twice.
  int64_t expected = 0;
  for (int64_t d = 0; d < split->n_docs(); ++d) {
    const auto doc = split->doc(d);
    for (size_t i = 0; i + 1 < doc.size(); ++i) {
      ++expected;
      const int n = trained.count({doc[i], doc[i + 1]}) ? trained[{doc[i], doc[i + 1]}] : 0;
      CHECK(n >= 1);
      CHECK(n <= 2);
    }
  }
  int64_t total = 0, twice = 0;
  for (const auto& [p, n] : trained) total += n, twice += n == 2;
  CHECK(static_cast<int64_t>(trained.size()) == expected);  // no cross-document pair is ever a target
  CHECK(twice <= 7);  // only the final row's spill into the next epoch repeats pairs
  CHECK(total == expected + twice);
}

TEST_CASE("too-short data is refused naming the split and the sizes", "[data][batcher]") {
  BatcherOptions o;
  o.block_size = 10;
  CHECK_THROWS_WITH(Batcher(make_split({iota_tokens(10)}, "tiny.h5:train"), o),
                    Catch::Contains("tiny.h5:train has 10 tokens; block_size 10 needs at least 11"));
  o.mode = BatchMode::padded_docs;
  CHECK_THROWS_WITH(Batcher(make_split({{1}, {2}}, "ones"), o),
                    Catch::Contains("ones has 2 documents and none with at least 2 tokens"));
  o.rank = 2;
  o.world = 2;
  CHECK_THROWS_WITH(Batcher(make_split({{1, 2}}), o), Catch::Contains("rank 2 is outside world 2"));
  CHECK_THROWS_WITH(parse_batch_mode("shuffled"), Catch::Contains("unknown batch mode 'shuffled'"));
  CHECK_THROWS_WITH(BatcherState::from_array(std::vector<int64_t>{1, 2}), Catch::Contains("5 integers, got 2"));
}

TEST_CASE("eval windows are consecutive non-overlapping blocks of T+1 tokens", "[data][batcher]") {
  const std::vector<int32_t> tokens = iota_tokens(23);
  EvalWindows w(tokens, 4, "e.txt");
  CHECK(w.n_windows() == 4);  // 23 / 5, the partial window 20..22 dropped
  CHECK(w.n_targets() == 16);
  Batch b;
  REQUIRE(w.next(3, b));
  REQUIRE(b.x.shape() == Shape{3, 4});
  CHECK(row(b.x, 0) == Row{0, 1, 2, 3});
  CHECK(row(b.y, 0) == Row{1, 2, 3, 4});
  CHECK(row(b.x, 1) == Row{5, 6, 7, 8});
  CHECK(row(b.y, 2) == Row{11, 12, 13, 14});
  REQUIRE(w.next(3, b));
  REQUIRE(b.x.shape() == Shape{1, 4});
  CHECK(row(b.x, 0) == Row{15, 16, 17, 18});
  CHECK(row(b.y, 0) == Row{16, 17, 18, 19});
  CHECK(b.n_targets == 4);
  CHECK_FALSE(w.next(3, b));
  w.reset();
  CHECK(w.next(8, b));
  CHECK(b.x.size(0) == 4);
  CHECK(EvalWindows(tokens, 4, "e.txt", 2).n_windows() == 2);
  CHECK_THROWS_WITH(EvalWindows(iota_tokens(4), 4, "short.txt"),
                    Catch::Contains("short.txt has 4 tokens; block_size 4 needs at least 5"));
}

TEST_CASE("leakage counts shared val n-grams and duplicated documents on a constructed split", "[data][leakage]") {
  // train: 0..99 and 500 501 502.  val (n = 8):
  //   50..89          40 tokens, 33 windows, all inside train's first document
  //   1000..1019      20 tokens, 13 windows, none in train
  //   500 501 502     a copy of a train document (shorter than n: no windows)
  //   1 2 3           a piece of a train document, not a duplicate
  //   96..99 500..503 one window that exists only across train's document boundary: not shared
  auto train = make_split({iota_tokens(100), {500, 501, 502}});
  std::vector<int32_t> cross = {96, 97, 98, 99, 500, 501, 502, 503};
  auto val = make_split({iota_tokens(40, 50), iota_tokens(20, 1000), {500, 501, 502}, {1, 2, 3}, cross});
  const LeakageReport r = measure_leakage(*train, *val, 8);
  CHECK(r.val_ngrams == 33 + 13 + 1);
  CHECK(r.shared_ngrams == 33);
  CHECK(r.ngram_share == Approx(33.0 / 47.0));
  CHECK(r.val_docs == 5);
  CHECK(r.duplicated_docs == 1);
  const LeakageReport clean = measure_leakage(*train, *make_split({iota_tokens(50, 2000)}), 8);
  CHECK(clean.shared_ngrams == 0);
  CHECK(clean.ngram_share == 0.0);
  CHECK(clean.duplicated_docs == 0);
}
