// Batchers (see data/batcher.h). Batches are small (B·T ids), so rows are filled by plain loops;
// what matters is that every random choice is a pure function of (seed, counters) so a resumed
// run and a run on more ranks see exactly the same rows.
#include "data/batcher.h"

#include <algorithm>

#include "tensor/error.h"
#include "tensor/philox.h"

namespace qkv {

namespace {

// Stream tags in Philox's last counter word keep the batchers' draws apart from each other and
// from other users of the same seed (dropout, sampling).
constexpr uint32_t kWindowStream = 0x77696e64u;  // "wind"
constexpr uint32_t kOrderStream = 0x6f726472u;   // "ordr"

// 64 random bits for counter (a, b) under `seed`; b (a row or list index) stays below 2^32.
uint64_t draw64(uint64_t seed, uint64_t a, uint64_t b, uint32_t stream) {
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(b),
                                  stream, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

Batch alloc_batch(int64_t rows, int64_t t) {
  Batch b;
  b.x = Tensor::empty({rows, t}, DType::i64);
  b.y = Tensor::empty({rows, t}, DType::i64);
  return b;
}

}  // namespace

namespace {
// "a, b or c" from a table's names.
template <class E, size_t N>
std::string spelled_out(const std::array<Choice<E>, N>& choices) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(choices[i].name);
  return out;
}
}  // namespace

BatchMode parse_batch_mode(std::string_view name) {
  if (const BatchMode* m = find_choice(kBatchModes, name)) return *m;
  fail("[batcher] unknown batch mode '", name, "' (expected ", spelled_out(kBatchModes), ")");
}

const char* batch_mode_name(BatchMode mode) { return choice_name(kBatchModes, mode).data(); }

Padding parse_padding(std::string_view name) {
  if (const Padding* p = find_choice(kPaddingSides, name)) return *p;
  fail("[batcher] unknown padding '", name, "' (expected ", spelled_out(kPaddingSides), ")");
}

std::array<int64_t, 5> BatcherState::to_array() const { return {static_cast<int64_t>(seed), step, epoch, doc, token}; }

BatcherState BatcherState::from_array(std::span<const int64_t> a) {
  QKV_CHECK(a.size() == 5, "[batcher] a saved batcher state has 5 integers, got ", a.size());
  BatcherState s;
  s.seed = static_cast<uint64_t>(a[0]);
  s.step = a[1];
  s.epoch = a[2];
  s.doc = a[3];
  s.token = a[4];
  return s;
}

Batcher::Batcher(std::shared_ptr<const TokenSplit> split, const BatcherOptions& opts)
    : split_(std::move(split)), opts_(opts) {
  QKV_CHECK(split_ != nullptr, "[batcher] no token split given");
  const TokenSplit& s = *split_;
  const int64_t t = opts_.block_size;
  QKV_CHECK(opts_.batch_size >= 1 && t >= 1 && opts_.micro_batches >= 1, "[batcher] batch_size ", opts_.batch_size,
            ", micro_batches ", opts_.micro_batches, " and block_size ", t, " must be positive");
  QKV_CHECK(opts_.world >= 1 && opts_.rank >= 0 && opts_.rank < opts_.world, "[batcher] rank ", opts_.rank,
            " is outside world ", opts_.world);
  state_.seed = opts_.seed;
  if (opts_.mode == BatchMode::random_windows || opts_.mode == BatchMode::packed_docs) {
    QKV_CHECK(s.size() >= t + 1, "[batcher] ", s.name, " has ", s.size(), " tokens; block_size ", t, " needs at least ",
              t + 1);
  }
  if (opts_.mode == BatchMode::random_windows) return;
  const int64_t min_len = opts_.mode == BatchMode::padded_docs ? 2 : 1;
  for (int64_t d = 0; d < s.n_docs(); ++d)
    if (s.doc_offsets[d + 1] - s.doc_offsets[d] >= min_len) eligible_.push_back(d);
  QKV_CHECK(!eligible_.empty(), "[batcher] ", s.name, " has ", s.n_docs(), " documents and none with at least ",
            min_len, " tokens (", s.size(), " tokens in all)");
}

void Batcher::restore(const BatcherState& s) {
  QKV_CHECK(s.seed == opts_.seed, "[batcher] saved data state has seed ", s.seed, " but this run's seed is ",
            opts_.seed);
  QKV_CHECK(s.step >= 0 && s.epoch >= 0 && s.doc >= 0 && s.token >= 0,
            "[batcher] saved data state has negative counters");
  if (opts_.mode != BatchMode::random_windows) {
    QKV_CHECK(s.doc <= static_cast<int64_t>(eligible_.size()), "[batcher] saved data state points at document ", s.doc,
              " of an epoch of ", eligible_.size(), " documents (", split_->name, " changed?)");
  }
  state_ = s;
  micro_ = 0;
}

void Batcher::build_order(int64_t epoch) {
  order_ = eligible_;
  if (opts_.shuffle) {
    // Fisher-Yates with one keyed draw per position.
    for (size_t i = order_.size(); i > 1; --i) {
      const uint64_t j = draw64(opts_.seed, static_cast<uint64_t>(epoch), i - 1, kOrderStream) % i;
      std::swap(order_[i - 1], order_[j]);
    }
  }
  order_epoch_ = epoch;
}

int64_t Batcher::current_doc(BatcherState& s) {
  if (s.doc >= static_cast<int64_t>(eligible_.size())) {
    ++s.epoch;
    s.doc = 0;
    s.token = 0;
  }
  if (order_epoch_ != s.epoch) build_order(s.epoch);
  return order_[static_cast<size_t>(s.doc)];
}

// Rows [first, first + n) of a batch, with their target count.
static Batch slice_rows(const Batch& all, int64_t first, int64_t n) {
  Batch b;
  const auto rows = [&](const Tensor& t) { return t.defined() ? t.narrow(0, first, n).contiguous() : Tensor(); };
  b.x = rows(all.x);
  b.y = rows(all.y);
  b.key_padding = rows(all.key_padding);
  b.positions = rows(all.positions);
  b.segment_ids = rows(all.segment_ids);
  const int64_t* y = b.y.data<int64_t>();
  for (int64_t i = 0; i < b.y.numel(); ++i) b.n_targets += y[i] != kIgnoreIndex;
  return b;
}

Batch Batcher::next() {
  const int64_t micro = opts_.micro_batches, rows = opts_.batch_size;
  const int64_t step = micro_ == 0 ? state_.step : state_.step - 1;
  if (micro_ == 0) {
    switch (opts_.mode) {
      case BatchMode::random_windows:
        step_rows_ = draw_random_windows();
        break;
      case BatchMode::padded_docs:
        step_rows_ = draw_padded_docs();
        break;
      case BatchMode::packed_docs:
        step_rows_ = draw_packed_docs();
        break;
    }
    ++state_.step;
  }
  Batch b = micro == 1 ? step_rows_ : slice_rows(step_rows_, micro_ * rows, rows);
  b.step = step;
  b.first_row = opts_.rank * rows * micro + micro_ * rows;
  micro_ = (micro_ + 1) % micro;
  return b;
}

Batch Batcher::draw_random_windows() {
  const int64_t rows = opts_.batch_size * opts_.micro_batches, t = opts_.block_size;
  const auto n_offsets = static_cast<uint64_t>(split_->size() - t);  // o in [0, n - T - 1]
  Batch b = alloc_batch(rows, t);
  int64_t* x = b.x.data<int64_t>();
  int64_t* y = b.y.data<int64_t>();
  const int32_t* tok = split_->tokens.data();
  for (int64_t i = 0; i < rows; ++i) {
    const auto g = static_cast<uint64_t>(opts_.rank * rows + i);
    const auto o =
        static_cast<int64_t>(draw64(opts_.seed, static_cast<uint64_t>(state_.step), g, kWindowStream) % n_offsets);
    for (int64_t k = 0; k < t; ++k) {
      x[i * t + k] = tok[o + k];
      y[i * t + k] = tok[o + k + 1];
    }
  }
  b.n_targets = rows * t;
  return b;
}

Batch Batcher::draw_padded_docs() {
  const int64_t rows = opts_.batch_size * opts_.micro_batches, t = opts_.block_size;
  Batch b = alloc_batch(rows, t);
  b.key_padding = Tensor::empty({rows, t}, DType::boolean);
  b.positions = Tensor::empty({rows, t}, DType::i64);
  int64_t* x = b.x.data<int64_t>();
  int64_t* y = b.y.data<int64_t>();
  int64_t* pos = b.positions.data<int64_t>();
  bool* mask = b.key_padding.data<bool>();
  std::fill(x, x + rows * t, opts_.pad_id);
  std::fill(y, y + rows * t, kIgnoreIndex);
  std::fill(pos, pos + rows * t, 0);
  std::fill(mask, mask + rows * t, false);
  // Every rank walks all G documents of the global batch and keeps its own rows.
  const int64_t global = rows * opts_.world;
  for (int64_t g = 0; g < global; ++g) {
    const int64_t d = current_doc(state_);
    ++state_.doc;
    const int64_t i = g - opts_.rank * rows;
    if (i < 0 || i >= rows) continue;
    const std::span<const int32_t> doc = split_->doc(d);
    const int64_t real = std::min<int64_t>(static_cast<int64_t>(doc.size()), t + 1) - 1;  // inputs with a target
    const int64_t start = opts_.padding == Padding::left ? t - real : 0;
    for (int64_t k = 0; k < real; ++k) {
      const int64_t c = i * t + start + k;
      x[c] = doc[k];
      y[c] = doc[k + 1];
      pos[c] = k;
      mask[c] = true;
    }
    b.n_targets += real;
  }
  return b;
}

Batch Batcher::draw_packed_docs() {
  const int64_t rows = opts_.batch_size * opts_.micro_batches, t = opts_.block_size;
  Batch b = alloc_batch(rows, t);
  b.positions = Tensor::empty({rows, t}, DType::i64);
  b.segment_ids = Tensor::empty({rows, t}, DType::i32);
  int64_t* x = b.x.data<int64_t>();
  int64_t* y = b.y.data<int64_t>();
  int64_t* pos = b.positions.data<int64_t>();
  int32_t* seg = b.segment_ids.data<int32_t>();
  std::vector<int32_t> row_tok(static_cast<size_t>(t + 1));
  std::vector<int32_t> row_seg(static_cast<size_t>(t + 1));
  std::vector<int64_t> row_pos(static_cast<size_t>(t + 1));
  const int64_t global = rows * opts_.world;
  for (int64_t g = 0; g < global; ++g) {
    // Fill T+1 tokens; the state after the first T is where the next row starts.
    BatcherState cur = state_, after_t = state_;
    int64_t filled = 0;
    int32_t piece = 0;
    while (filled < t + 1) {
      const int64_t d = current_doc(cur);
      const std::span<const int32_t> doc = split_->doc(d);
      const int64_t take = std::min<int64_t>(static_cast<int64_t>(doc.size()) - cur.token, t + 1 - filled);
      for (int64_t k = 0; k < take; ++k) {
        row_tok[filled + k] = doc[cur.token + k];
        row_seg[filled + k] = piece;
        row_pos[filled + k] = k;
        if (filled + k + 1 == t) {  // the T-th token is consumed by this row
          after_t = cur;
          after_t.token += k + 1;
          if (after_t.token == static_cast<int64_t>(doc.size())) {
            ++after_t.doc;
            after_t.token = 0;
          }
        }
      }
      filled += take;
      cur.token += take;
      if (cur.token == static_cast<int64_t>(doc.size())) {
        ++cur.doc;
        cur.token = 0;
      }
      ++piece;
    }
    state_.epoch = after_t.epoch;
    state_.doc = after_t.doc;
    state_.token = after_t.token;
    const int64_t i = g - opts_.rank * rows;
    if (i < 0 || i >= rows) continue;
    for (int64_t k = 0; k < t; ++k) {
      const int64_t c = i * t + k;
      x[c] = row_tok[k];
      const bool same = row_seg[k + 1] == row_seg[k];
      y[c] = same ? row_tok[k + 1] : kIgnoreIndex;
      b.n_targets += same;
      pos[c] = row_pos[k];
      seg[c] = row_seg[k];
    }
  }
  return b;
}

EvalWindows::EvalWindows(std::span<const int32_t> tokens, int64_t block_size, std::string name, int64_t max_windows)
    : tokens_(tokens), block_(block_size) {
  QKV_CHECK(block_size >= 1, "[eval] block_size ", block_size, " must be positive");
  const auto n = static_cast<int64_t>(tokens.size());
  QKV_CHECK(n >= block_size + 1, "[eval] ", name, " has ", n, " tokens; block_size ", block_size, " needs at least ",
            block_size + 1);
  n_windows_ = n / (block_size + 1);
  if (max_windows > 0) n_windows_ = std::min(n_windows_, max_windows);
}

bool EvalWindows::next(int64_t max_rows, Batch& out) {
  QKV_CHECK(max_rows >= 1, "[eval] max_rows ", max_rows, " must be positive");
  if (next_ >= n_windows_) return false;
  const int64_t rows = std::min(max_rows, n_windows_ - next_), t = block_;
  out = alloc_batch(rows, t);
  int64_t* x = out.x.data<int64_t>();
  int64_t* y = out.y.data<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t* w = tokens_.data() + (next_ + i) * (t + 1);
    for (int64_t k = 0; k < t; ++k) {
      x[i * t + k] = w[k];
      y[i * t + k] = w[k + 1];
    }
  }
  out.n_targets = rows * t;
  next_ += rows;
  return true;
}

}  // namespace qkv
