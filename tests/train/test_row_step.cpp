// The backward of invariant training (train/row_step.h): rows run at once on worker threads give
// the bits of the same rows run one by one.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "data/batcher.h"
#include "distributed/data_parallel.h"
#include "nn/transformer.h"
#include "tensor/cpu/parallel.h"
#include "tensor/error.h"
#include "tensor/numerics.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/model_factory.h"
#include "train/row_step.h"

using namespace qkv;

namespace {

nn::ModelConfig small(const std::string& family, bool recompute = false) {
  Config cfg;
  cfg.train.recompute = recompute;
  apply_override(cfg, "model.family=" + family);
  cfg.model.vocab_size = 29;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = family == "gpt2" ? 4 : 2;
  cfg.model.n_embd = 16;
  cfg.model.block_size = 8;
  cfg.model.ffn_multiple_of = 16;
  cfg.model.dropout = 0.1;
  cfg.model.attn_dropout = 0.1;
  return train::model_config(cfg, 29);
}

Tensor ids_tensor(const std::vector<int64_t>& v, int64_t rows) {
  Tensor t = Tensor::empty({rows, static_cast<int64_t>(v.size()) / rows}, DType::i64);
  std::memcpy(t.data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// Five rows of 8 tokens (an odd count: the last worker chunk holds one row), left-padded: row 1
// has 3 pads, row 3 has no target at all (no gradient: +0 in the tree).
Batch five_rows(int64_t vocab, int64_t bad_id = -1) {
  const int64_t B = 5, T = 8;
  std::vector<int64_t> x(B * T), y(B * T), pos(B * T);
  Tensor pad = Tensor::empty({B, T}, DType::boolean);
  bool* real = pad.data<bool>();
  uint64_t s = 12345;
  Batch b;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t pads = r == 1 ? 3 : 0;
    for (int64_t t = 0; t < T; ++t) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t i = r * T + t;
      x[i] = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(vocab));
      real[i] = t >= pads;
      pos[i] = t >= pads ? t - pads : 0;
      y[i] = (t >= pads && r != 3) ? (x[i] * 7 + 3) % vocab : kIgnoreIndex;
      b.n_targets += y[i] != kIgnoreIndex;
    }
  }
  if (bad_id >= 0) x[2 * T + 4] = bad_id;
  b.x = ids_tensor(x, B);
  b.y = ids_tensor(y, B);
  b.positions = ids_tensor(pos, B);
  b.key_padding = pad;
  b.step = 4;
  b.first_row = 0;
  return b;
}

struct RowRun {
  std::vector<double> row_loss;
  std::vector<float> grads;
  int64_t masked = 0;
  int workers = 0;
};

RowRun run_rows(const nn::DecoderModel& model, const Batch& batch, int threads) {
  cpu::OmpThreadsGuard guard(threads);
  NumericsGuard invariant(Numerics::invariant);
  std::vector<autograd::OptimParam> params;
  for (const nn::NamedParameter& p : model.named_parameters()) params.push_back({p.name, p.tensor, p.decay});
  dist::SingleProcess one;
  dist::DataParallel dp(one, params, {.tree_rows = batch.x.size(0)});
  dp.zero_grads();
  RowRun run;
  run.workers = train::row_workers(model, batch.x.size(0));
  run.row_loss = train::row_tree_backward(model, dp, {batch}, batch.n_targets, 99, 4, &run.masked);
  dp.reduce_grads();
  for (const autograd::OptimParam& p : params) {
    const Tensor g = p.param.grad().contiguous();
    run.grads.insert(run.grads.end(), g.data<float>(), g.data<float>() + g.numel());
  }
  return run;
}

}  // namespace

TEST_CASE("rows on worker threads give the bits of rows run one by one", "[row_tree][train]") {
  for (const auto& [family, recompute] :
       {std::pair{"gpt2", false}, std::pair{"llama", false}, std::pair{"gpt2", true}}) {
    // Recomputation replays each block in backward with a leaf of its own, whose gradient must be
    // read from the worker's sink.
    CAPTURE(family, recompute);
    nn::DecoderModel model(small(family, recompute));
    model.init_weights(3);
    model.train();
    const Batch batch = five_rows(29);
    const RowRun one = run_rows(model, batch, 1);
    CHECK(one.workers == 1);
    REQUIRE(one.row_loss.size() == 5);
    CHECK(one.row_loss[3] == 0.0);  // no target
    CHECK(one.masked == 3);         // row 1's three pads see no real key
    size_t nonzero = 0;
    for (float g : one.grads) nonzero += g != 0.0f;
    CHECK(nonzero > one.grads.size() / 2);
    for (int threads : {2, 3}) {
      CAPTURE(threads);
      const RowRun many = run_rows(model, batch, threads);
      CHECK(many.workers == threads);  // the worker path runs
      CHECK(many.row_loss == one.row_loss);
      CHECK(many.masked == one.masked);
      REQUIRE(many.grads.size() == one.grads.size());
      CHECK(std::memcmp(many.grads.data(), one.grads.data(), one.grads.size() * sizeof(float)) == 0);
    }
    // Each row's dropout is its own: the same row at another global index gives another loss.
    Batch moved = batch;
    moved.first_row = 5;
    const RowRun shifted = run_rows(model, moved, 2);
    CHECK(shifted.row_loss != one.row_loss);
  }
}

TEST_CASE("an error in a row on a worker thread reaches the caller as qkv::Error", "[row_tree][train]") {
  nn::DecoderModel model(small("gpt2"));
  model.init_weights(3);
  model.train();
  const Batch bad = five_rows(29, /*bad_id=*/29);  // a token id outside the vocabulary
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    CHECK_THROWS_AS(run_rows(model, bad, threads), Error);
  }
}
