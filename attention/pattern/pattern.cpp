// Sparse attention patterns: the predicate (definitions in attention.h) and the block layout.
#include "attention/pattern/pattern.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <list>
#include <mutex>
#include <sstream>

#include "attention/attention.h"
#include "attention/cpu/fused.h"
#include "data/input_file.h"
#include "tensor/error.h"
#include "tensor/philox.h"

namespace qkv::attn {

namespace {

constexpr struct {
  const char* name;
  Pattern kind;
} kPatternNames[] = {{"full", Pattern::full},       {"window", Pattern::window},
                     {"strided", Pattern::strided}, {"global", Pattern::global},
                     {"bigbird", Pattern::bigbird}, {"block_sparse", Pattern::block_sparse}};

bool is_generator(const std::string& layout) { return layout == "local_global" || layout == "fixed"; }

int64_t ceil_sqrt(int64_t n) {
  int64_t s = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)))));
  while (s > 1 && (s - 1) * (s - 1) >= n) --s;
  while (s * s < n) ++s;
  return std::max<int64_t>(s, 1);
}

}  // namespace

const char* pattern_name(Pattern p) {
  for (const auto& n : kPatternNames)
    if (n.kind == p) return n.name;
  return "?";
}

bool parse_pattern(std::string_view name, Pattern* out) {
  for (const auto& n : kPatternNames)
    if (name == n.name) {
      *out = n.kind;
      return true;
    }
  return false;
}

void SparsePattern::validate() const {
  QKV_CHECK(stride >= 0, "[attention] pattern stride must be >= 0 (0 = ceil(sqrt(N))), got ", stride);
  QKV_CHECK(local >= 0, "[attention] pattern local width must be >= 0 (0 = the pattern's default), got ", local);
  QKV_CHECK(global >= 0, "[attention] pattern global count must be >= 0, got ", global);
  for (int64_t t : global_tokens) QKV_CHECK(t >= 0, "[attention] pattern global token ", t, " is negative");
  QKV_CHECK(random_blocks >= 0, "[attention] pattern random blocks must be >= 0, got ", random_blocks);
  QKV_CHECK(block_size > 0, "[attention] pattern block size must be > 0, got ", block_size);
  if (kind == Pattern::block_sparse && !is_generator(layout))
    QKV_CHECK(
        layout_rows > 0 && layout_cols > 0 && static_cast<int64_t>(layout_table.size()) == layout_rows * layout_cols,
        "[attention] block_sparse layout \"", layout, "\" is neither local_global, fixed nor a loaded file");
}

void SparsePattern::validate_for(int64_t n, std::string_view key_prefix, std::string_view context) const {
  auto key = [&](std::string name) {
    if (key_prefix.starts_with("--")) std::replace(name.begin(), name.end(), '_', '-');
    return std::string(key_prefix) + name;
  };
  // The rules validate() also states, here by the name the user wrote (validate() has none).
  for (int64_t t : global_tokens)
    QKV_CHECK(t >= 0, key("global_tokens"), ": position ", t, " is negative; positions count from 0");
  auto not_negative = [&](const char* name, int64_t v) {
    QKV_CHECK(v >= 0, key(name), " = ", v, " is negative; it must be in [0, ", n, "]");
  };
  not_negative("stride", stride);
  not_negative("local", local);
  not_negative("global", global);
  not_negative("random_blocks", random_blocks);
  QKV_CHECK(block_size > 0, key("block_size"), " = ", block_size, " must be at least 1");
  validate();
  auto at_most_n = [&](const char* name, int64_t v) {
    QKV_CHECK(v <= n, key(name), " = ", v, " exceeds ", context, " = ", n, " (", pattern_name(kind),
              " would be full attention); it must be in [0, ", n, "]");
  };
  if (kind == Pattern::full) return;
  if (kind == Pattern::strided) at_most_n("stride", stride);
  if (kind != Pattern::block_sparse) at_most_n("local", local);
  if (kind == Pattern::global || kind == Pattern::bigbird) {
    if (global_tokens.empty()) at_most_n("global", global);
    for (int64_t t : global_tokens)
      QKV_CHECK(t < n, key("global_tokens"), ": position ", t, " is outside the context [0, ", context, " = ", n, ")");
  }
  if (kind != Pattern::bigbird && kind != Pattern::block_sparse) return;
  QKV_CHECK(block_size <= n && n % block_size == 0, key("block_size"), " = ", block_size, " does not divide ", context,
            " = ", n, " (the last block would be cut short); use a divisor of ", n);
  const int64_t blocks = n / block_size;
  if (kind == Pattern::bigbird)
    QKV_CHECK(random_blocks <= blocks, key("random_blocks"), " = ", random_blocks, " exceeds the ", blocks,
              " blocks of ", context, " = ", n, " (", key("block_size"), " = ", block_size, ")");
  if (kind == Pattern::block_sparse && !is_generator(layout)) {
    QKV_CHECK(layout_rows >= blocks && layout_cols >= blocks, key("layout"), " ", layout, " has ", layout_rows, "x",
              layout_cols, " blocks but ", context, " / ", key("block_size"), " needs ", blocks, "x", blocks);
    for (int64_t qb = 0; qb < blocks; ++qb) {
      const uint8_t* row = layout_table.data() + qb * layout_cols;
      QKV_CHECK(std::any_of(row, row + qb + 1, [](uint8_t v) { return v != 0; }), key("layout"), " ", layout,
                ": query block ", qb, " sees no key block at or before its own (its rows would attend to nothing)");
    }
  }
}

std::string SparsePattern::describe() const {
  std::ostringstream s;
  s << pattern_name(kind);
  switch (kind) {
    case Pattern::full:
      break;
    case Pattern::window:
      s << " l=" << (local ? std::to_string(local) : std::to_string(block_size));
      break;
    case Pattern::strided:
      s << " s=" << (stride ? std::to_string(stride) : "sqrt(N)") << " l=" << (local ? std::to_string(local) : "s");
      break;
    case Pattern::global:
    case Pattern::bigbird:
      s << " l=" << (local ? local : (kind == Pattern::global ? 1 : block_size));
      if (global_tokens.empty()) s << " g=" << global;
      else s << " globals=" << global_tokens.size();
      if (kind == Pattern::bigbird) s << " r=" << random_blocks << " bs=" << block_size << " seed=" << seed;
      break;
    case Pattern::block_sparse:
      s << " bs=" << block_size << " layout=" << layout;
      break;
  }
  return s.str();
}

void load_layout(SparsePattern& p) {
  if (p.kind != Pattern::block_sparse || is_generator(p.layout)) return;
  // model.pattern_layout is local_global, fixed, the rows inline ("rows:10/11", what a checkpoint
  // stores) or a file of 0/1 rows (a regular file of at most kLayoutFileCap bytes).
  constexpr std::string_view kInline = "rows:";
  std::string text;
  if (p.layout.starts_with(kInline)) {
    text = p.layout.substr(kInline.size());
    std::replace(text.begin(), text.end(), '/', '\n');
  } else {
    try {
      text = read_input_file(p.layout, kLayoutFileCap, "a block_sparse layout (model.pattern_layout)");
    } catch (const Error& e) { fail("[attention] ", e.what()); }
  }
  std::istringstream in(text);
  std::vector<uint8_t> table;
  int64_t rows = 0, cols = 0, line_no = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    int64_t n = 0;
    for (char c : line) {
      if (c == ' ' || c == '\t' || c == '\r' || c == ',') continue;
      QKV_CHECK(c == '0' || c == '1', "[attention] block_sparse layout file ", p.layout, " line ", line_no,
                ": expected 0 or 1, got '", c, "'");
      table.push_back(c == '1');
      ++n;
    }
    if (n == 0) continue;
    QKV_CHECK(cols == 0 || n == cols, "[attention] block_sparse layout file ", p.layout, " line ", line_no, " has ", n,
              " blocks, earlier rows have ", cols);
    cols = n;
    ++rows;
  }
  QKV_CHECK(rows > 0, "[attention] block_sparse layout file ", p.layout, " holds no rows");
  p.layout_rows = rows;
  p.layout_cols = cols;
  p.layout_table = std::move(table);
}

std::string inline_layout(const SparsePattern& p) {
  if (p.kind != Pattern::block_sparse || is_generator(p.layout)) return p.layout;
  std::string s = "rows:";
  for (int64_t r = 0; r < p.layout_rows; ++r) {
    if (r) s += '/';
    for (int64_t c = 0; c < p.layout_cols; ++c) s += p.layout_table[size_t(r * p.layout_cols + c)] ? '1' : '0';
  }
  return s;
}

PatternPredicate::PatternPredicate(const SparsePattern& p, int64_t nk, bool causal)
    : kind_(p.kind), nk_(nk), causal_(causal), seed_(p.seed), layout_(p.layout) {
  p.validate();
  bs_ = p.block_size;
  nkb_ = std::max<int64_t>(1, (nk + bs_ - 1) / bs_);
  switch (kind_) {
    case Pattern::full:
      break;
    case Pattern::window:
      l_ = p.local ? p.local : bs_;
      break;
    case Pattern::strided:
      s_ = p.stride ? p.stride : ceil_sqrt(nk);
      l_ = p.local ? p.local : s_;
      break;
    case Pattern::global:
      l_ = p.local ? p.local : 1;
      break;
    case Pattern::bigbird:
      l_ = p.local ? p.local : bs_;
      r_ = p.random_blocks;
      break;
    case Pattern::block_sparse:
      if (!is_generator(layout_)) {
        rows_ = p.layout_rows;
        cols_ = p.layout_cols;
        table_ = p.layout_table;
        QKV_CHECK(cols_ >= nkb_ && rows_ >= nkb_, "[attention] block_sparse layout ", layout_, " has ", rows_, "x",
                  cols_, " blocks of ", bs_, " but Nk=", nk, " needs ", nkb_, "x", nkb_);
      }
      break;
  }
  if (kind_ == Pattern::global || kind_ == Pattern::bigbird) {
    if (p.global_tokens.empty()) {
      g_ = p.global;
    } else {
      globals_ = p.global_tokens;
      std::sort(globals_.begin(), globals_.end());
      globals_.erase(std::unique(globals_.begin(), globals_.end()), globals_.end());
    }
  }
}

bool PatternPredicate::is_global(int64_t x) const {
  if (globals_.empty()) return x >= 0 && x < g_;
  return std::binary_search(globals_.begin(), globals_.end(), x);
}

int64_t PatternPredicate::random_block(int64_t qb, int64_t k) const {
  const Philox4 r =
      philox4x32_10(static_cast<uint32_t>(qb), static_cast<uint32_t>(k), 0x5ba25e00u, static_cast<uint32_t>(qb >> 32),
                    static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32));
  const uint64_t m = causal_ ? static_cast<uint64_t>(std::max<int64_t>(qb, 0)) + 1 : static_cast<uint64_t>(nkb_);
  const uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  return static_cast<int64_t>(x % m);
}

bool PatternPredicate::block_allowed(int64_t qb, int64_t kb) const {
  if (layout_ == "local_global") return std::abs(qb - kb) <= 1 || kb == 0 || qb == 0;
  if (layout_ == "fixed") return kb == qb || kb % 4 == 3;
  if (qb < 0 || kb < 0 || qb >= rows_ || kb >= cols_) return false;
  return table_[qb * cols_ + kb] != 0;
}

bool PatternPredicate::allows(int64_t p, int64_t j) const {
  const int64_t d = p - j;
  switch (kind_) {
    case Pattern::full:
      return true;
    case Pattern::window:
      return std::abs(d) < l_;
    case Pattern::strided:
      return std::abs(d) < l_ || d % s_ == 0;
    case Pattern::global:
      return std::abs(d) < l_ || is_global(p) || is_global(j);
    case Pattern::bigbird: {
      if (std::abs(d) < l_ || is_global(p) || is_global(j)) return true;
      const int64_t qb = floor_div(p, bs_), kb = floor_div(j, bs_);
      for (int64_t k = 0; k < r_; ++k)
        if (random_block(qb, k) == kb) return true;
      return false;
    }
    case Pattern::block_sparse:
      return block_allowed(floor_div(p, bs_), floor_div(j, bs_));
  }
  return false;
}

void PatternPredicate::keys(int64_t p, int64_t a, int64_t e, std::vector<int64_t>& out) const {
  for_each_allowed(p, a, e, [&](int64_t x0, int64_t x1) {
    for (int64_t j = x0; j < x1; ++j) out.push_back(j);
  });
}

int64_t StridedWalk::tiles(int64_t tq, int64_t tk) const {
  int64_t n = 0, a, e;
  for (int64_t i0 = 0; i0 < nq; i0 += tq) {
    band(i0, std::min(nq, i0 + tq), nk, &a, &e);
    n += (e - a + tk - 1) / tk;
  }
  // Each non-empty residue group once: the one whose first row is i (i < s).
  for (int64_t i = 0; i < groups(); ++i) {
    const int64_t r = ((pos(i) % s) + s) % s, rows_r = rows(r);
    for (int64_t n0 = 0; n0 < rows_r; n0 += tq) {
      residue(r, n0, std::min(rows_r, n0 + tq), nk, &a, &e);
      n += (e - a + tk - 1) / tk;
    }
  }
  return n;
}

namespace {

// Logits the regrouped walk computes for one (b, h): Σ rows × keys over its tiles of `tq` rows.
int64_t walk_area(const StridedWalk& w, int64_t tq) {
  int64_t area = 0, a, e;
  for (int64_t i0 = 0; i0 < w.nq; i0 += tq) {
    const int64_t i1 = std::min(w.nq, i0 + tq);
    w.band(i0, i1, w.nk, &a, &e);
    area += (i1 - i0) * (e - a);
  }
  for (int64_t i = 0; i < w.groups(); ++i) {
    const int64_t r = ((w.pos(i) % w.s) + w.s) % w.s, rows_r = w.rows(r);
    for (int64_t n0 = 0; n0 < rows_r; n0 += tq) {
      const int64_t n1 = std::min(rows_r, n0 + tq);
      w.residue(r, n0, n1, w.nk, &a, &e);
      area += (n1 - n0) * (e - a);
    }
  }
  return area;
}

std::shared_ptr<const BlockLayout> compute_layout(const SparsePattern& pattern, const MaskRules& rules, int64_t nq,
                                                  int64_t nk, int64_t tq, int64_t tk) {
  auto L = std::make_shared<BlockLayout>();
  L->nq = nq;
  L->nk = nk;
  L->tq = tq;
  L->tk = tk;
  L->nqt = (nq + tq - 1) / tq;
  L->nkt = (nk + tk - 1) / tk;
  const PatternPredicate pred(pattern, nk, rules.has_hi);
  std::vector<int64_t> count(static_cast<size_t>(L->nqt * L->nkt), 0);
  QKV_CHECK(tq <= 255 && tk <= 255, "[attention] block layout tiles of ", tq, "x", tk, " (at most 255 a side)");
  std::vector<BlockLayout::Box> box(count.size(), BlockLayout::Box{255, 0, 255, 0});
  std::vector<int64_t> stamp(static_cast<size_t>(nk), -1), keys;
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = rules.q_offset + i;
    int64_t a = rules.has_lo ? std::max<int64_t>(0, p + rules.lo) : 0;
    int64_t e = rules.has_hi ? std::min<int64_t>(nk, p + rules.hi) : nk;
    a = std::min(a, nk);
    keys.clear();
    pred.keys(p, a, e, keys);
    int64_t* row = count.data() + (i / tq) * L->nkt;
    BlockLayout::Box* row_box = box.data() + (i / tq) * L->nkt;
    const auto r = static_cast<uint8_t>(i % tq);
    for (int64_t j : keys) {
      if (stamp[j] == i) continue;
      stamp[j] = i;
      ++row[j / tk];
      ++L->kept_pairs;
      BlockLayout::Box& b = row_box[j / tk];
      const auto c = static_cast<uint8_t>(j % tk);
      b.r0 = std::min(b.r0, r);
      b.r1 = std::max<uint8_t>(b.r1, r + 1);
      b.c0 = std::min(b.c0, c);
      b.c1 = std::max<uint8_t>(b.c1, c + 1);
    }
  }
  int64_t grid_area = 0;  // logits the grid walk computes
  L->state.assign(count.size(), BlockLayout::empty);
  L->row_ptr.assign(static_cast<size_t>(L->nqt + 1), 0);
  L->col_ptr.assign(static_cast<size_t>(L->nkt + 1), 0);
  for (int64_t qt = 0; qt < L->nqt; ++qt)
    for (int64_t kt = 0; kt < L->nkt; ++kt) {
      const int64_t c = count[qt * L->nkt + kt];
      if (c == 0) continue;
      const int64_t area = (std::min(nq, (qt + 1) * tq) - qt * tq) * (std::min(nk, (kt + 1) * tk) - kt * tk);
      grid_area += area;
      L->state[qt * L->nkt + kt] = c == area ? BlockLayout::full : BlockLayout::partial;
      ++L->visited_tiles;
      L->full_tiles += c == area;
      L->row_tiles.push_back(kt);
      BlockLayout::Box b = box[qt * L->nkt + kt];
      b.c0 = static_cast<uint8_t>(b.c0 / 8 * 8);  // whole vectors of 8 keys for the kernels' row loops
      b.c1 = static_cast<uint8_t>(std::min<int64_t>(tk, (b.c1 + 7) / 8 * 8));
      L->row_boxes.push_back(b);
      ++L->row_ptr[qt + 1];
      ++L->col_ptr[kt + 1];
    }
  for (int64_t qt = 0; qt < L->nqt; ++qt) L->row_ptr[qt + 1] += L->row_ptr[qt];
  for (int64_t kt = 0; kt < L->nkt; ++kt) L->col_ptr[kt + 1] += L->col_ptr[kt];
  L->col_tiles.assign(L->row_tiles.size(), 0);
  L->col_boxes.assign(L->row_tiles.size(), BlockLayout::Box{});
  std::vector<int64_t> fill(L->col_ptr.begin(), L->col_ptr.end() - 1);
  for (int64_t qt = 0; qt < L->nqt; ++qt)
    for (int64_t e = L->row_ptr[qt]; e < L->row_ptr[qt + 1]; ++e) {
      const int64_t at = fill[L->row_tiles[e]]++;
      L->col_tiles[at] = qt;
      L->col_boxes[at] = L->row_boxes[e];
    }
  // Under a causal rule, the regrouped walk (patterns.h) when it computes fewer logits:
  //  - strided: at s = √N it visits O(N/64 + s·(N/s/64)²) tiles against the grid's O((N/64)²):
  //    every grid tile below the diagonal holds a stride column once s <= 64, or N/s rows of them
  //    cut by columns;
  //  - a window (the pattern, or the structural rule under the full pattern): the band alone, each
  //    8-row tile clamped per row, ~l + 7 logits a row against the grid's l + 32 and its
  //    per-element masks (1.1-1.5x faster at l = 32..3000, docs/perf.md).
  // (A sliding window that cuts nothing is causal attention, whose plain path is as fast.)
  const bool sliding_window = pattern.kind == Pattern::full && rules.sliding_window_cuts(nq);
  const bool walkable = pattern.kind == Pattern::strided || pattern.kind == Pattern::window || sliding_window;
  if (walkable && rules.has_hi && rules.hi <= 1) {
    StridedWalk w;
    w.residues = pattern.kind == Pattern::strided;
    w.s = w.residues ? pred.stride() : 1;
    // The sliding window's lower bound is the walk's lo; no pattern width of its own.
    w.l = sliding_window ? std::numeric_limits<int64_t>::max() / 4 : pred.local();
    w.q_offset = rules.q_offset;
    w.nq = nq;
    w.nk = nk;
    w.has_lo = rules.has_lo;
    w.lo = rules.lo;
    w.hi = rules.hi;
    // The walk's tiles are kWalkQ rows tall (fused.h); compared, and reported, by the logits
    // they compute, in tq × tk tiles' worth.
    const int64_t area = walk_area(w, kWalkQ);
    if (area < grid_area) {
      L->regrouped = true;
      L->walk = w;
      L->visited_tiles = (area + tq * tk - 1) / (tq * tk);
      L->full_tiles = 0;
    }
  }
  return L;
}

}  // namespace

std::shared_ptr<const BlockLayout> block_layout(const SparsePattern& pattern, const MaskRules& rules, int64_t nq,
                                                int64_t nk, int64_t tq, int64_t tk) {
  // Cache key: every field that changes the layout (a layout table by its contents).
  std::ostringstream key;
  key << static_cast<int>(pattern.kind) << '|' << pattern.stride << '|' << pattern.local << '|' << pattern.global << '|'
      << pattern.random_blocks << '|' << pattern.block_size << '|' << pattern.seed << '|' << pattern.layout << '|'
      << pattern.layout_rows << 'x' << pattern.layout_cols << '|';
  for (int64_t t : pattern.global_tokens) key << t << ',';
  key << '|';
  for (uint8_t c : pattern.layout_table) key << static_cast<char>('0' + c);
  key << '|' << nq << '|' << nk << '|' << rules.q_offset << '|' << rules.has_lo << rules.lo << '|' << rules.has_hi
      << rules.hi << '|' << tq << '|' << tk;
  const std::string k = key.str();
  static std::mutex mu;
  static std::list<std::pair<std::string, std::shared_ptr<const BlockLayout>>> lru;
  constexpr size_t kCapacity = 32;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->first == k) {
        lru.splice(lru.begin(), lru, it);
        return lru.front().second;
      }
  }
  auto L = compute_layout(pattern, rules, nq, nk, tq, tk);
  std::lock_guard<std::mutex> lock(mu);
  lru.emplace_front(k, L);
  if (lru.size() > kCapacity) lru.pop_back();
  return L;
}

}  // namespace qkv::attn
