// Data-parallel pieces that run in one process: shard and bucket arithmetic, the ZeRO-1 slicing
// of the optimizer (checked against the full AdamW, bitwise), the single-process group, and the
// DataParallel wrapper on one rank (it must be exactly the plain AdamW loop). The multi-process
// behaviour is in test_distributed_mpi.cpp (ctest label "mpi").
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "autograd/engine.h"
#include "compare_util.h"
#include "autograd/functions.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "distributed/data_parallel.h"
#include "distributed/distributed.h"
#include "distributed/nccl.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace qkv;
using namespace qkv::dist;
using namespace qkv::train;

namespace {

// Deterministic values in [-1, 1) (independent of the library's RNG).
void fill_lcg(const Tensor& t, uint64_t seed) {
  float* p = t.data<float>();
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<double>(s >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.numel() * 4) == 0;
}

// Parameters of assorted sizes (some smaller than 16 elements, some not multiples of 16), with
// the decay convention of the trainer: 2-D decays, 1-D does not.
std::vector<OptimParam> make_params(uint64_t seed) {
  const std::vector<Shape> shapes = {{7, 5}, {3}, {40, 16}, {1}, {33}, {9, 9}, {100}};
  std::vector<OptimParam> ps;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = Tensor::empty(shapes[i], DType::f32);
    fill_lcg(t, seed + i);
    ps.push_back({"p" + std::to_string(i), t, shapes[i].size() >= 2});
  }
  return ps;
}

std::vector<OptimParam> clone_params(const std::vector<OptimParam>& ps) {
  std::vector<OptimParam> out;
  for (const auto& p : ps) out.push_back({p.name, p.param.clone(), p.decay});
  return out;
}

}  // namespace

TEST_CASE("shard ranges split the flat range into contiguous slices cut at multiples of 16", "[distributed]") {
  for (int64_t total : {0, 1, 15, 16, 17, 100, 1000, 123457}) {
    for (int world : {1, 2, 3, 4, 7, 8}) {
      int64_t expect_lo = 0;
      for (int r = 0; r < world; ++r) {
        const auto [lo, hi] = shard_range(total, r, world);
        INFO("total " << total << " world " << world << " rank " << r << " -> [" << lo << ", " << hi << ")");
        CHECK(lo == expect_lo);
        CHECK(hi >= lo);
        if (r + 1 < world) CHECK((hi % 16 == 0 || hi == total));
        // Near-equal: no slice longer than an even share plus one cache line.
        CHECK(hi - lo <= total / world + 16);
        expect_lo = hi;
      }
      CHECK(expect_lo == total);
    }
  }
  CHECK_THROWS_AS(shard_range(10, 2, 2), Error);
}

TEST_CASE("bucket bounds cover the range in pieces no longer than the bucket", "[distributed]") {
  CHECK(bucket_bounds(0, 4) == std::vector<int64_t>{0});
  CHECK(bucket_bounds(10, 4) == std::vector<int64_t>{0, 4, 8, 10});
  CHECK(bucket_bounds(8, 4) == std::vector<int64_t>{0, 4, 8});
  CHECK(bucket_bounds(3, 0) == std::vector<int64_t>{0, 1, 2, 3});  // a bucket holds at least 1
  // Config M: 10.77 M parameters in 4 MiB buckets.
  const auto b = bucket_bounds(10'770'816, kDefaultBucketBytes / 4);
  CHECK(b.size() - 1 == 11);
  CHECK(b.back() == 10'770'816);
}

TEST_CASE("shard counts of a bucket are its intersections with each rank's slice", "[distributed]") {
  const int64_t total = 100;  // world 3: slices [0,48) [48,80) [80,100)
  REQUIRE(shard_range(total, 0, 3) == std::pair<int64_t, int64_t>{0, 48});
  REQUIRE(shard_range(total, 1, 3) == std::pair<int64_t, int64_t>{48, 80});
  CHECK(shard_counts(40, 60, total, 3) == std::vector<int64_t>{8, 12, 0});
  CHECK(shard_counts(0, 100, total, 3) == std::vector<int64_t>{48, 32, 20});
  CHECK(shard_counts(85, 90, total, 3) == std::vector<int64_t>{0, 0, 5});
}

TEST_CASE("slice_params gives views of exactly the elements in the range, names and decay kept", "[distributed]") {
  auto ps = make_params(1);  // numels 35, 3, 640, 1, 33, 81, 100 -> offsets 0, 35, 38, 678, 679, 712, 793
  const auto s = slice_params(ps, 30, 700);
  REQUIRE(s.size() == 5);
  CHECK(s[0].name == "p0");
  CHECK(s[0].param.numel() == 5);
  CHECK(s[0].param.data<float>() == ps[0].param.data<float>() + 30);  // a view, not a copy
  CHECK(s[1].name == "p1");
  CHECK(s[1].decay == false);
  CHECK(s[2].param.numel() == 640);
  CHECK(s[2].decay == true);
  CHECK(s[4].name == "p4");
  CHECK(s[4].param.numel() == 700 - 679);
  CHECK(slice_params(ps, 5, 5).empty());
}

TEST_CASE("ZeRO-1: per-rank AdamW over the slices updates every element exactly as the full AdamW",
          "[distributed][zero][exact]") {
  const AdamWOptions o{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  auto full_params = make_params(11);
  auto sharded_params = clone_params(full_params);
  AdamW full(full_params, o);
  // Three ranks' optimizers over one set of parameters; gradients are the same tensors' slices.
  const int world = 3;
  const int64_t total = std::accumulate(full_params.begin(), full_params.end(), int64_t{0},
                                        [](int64_t a, const OptimParam& p) { return a + p.param.numel(); });
  std::vector<std::unique_ptr<AdamW>> shards;
  std::vector<Tensor> grads;
  for (const auto& p : sharded_params) grads.push_back(Tensor::empty(p.param.shape(), DType::f32));
  for (int r = 0; r < world; ++r) {
    const auto [lo, hi] = shard_range(total, r, world);
    auto mine = slice_params(sharded_params, lo, hi);
    // The matching gradient slices: slice_params over parameters whose tensors are the gradients.
    std::vector<OptimParam> gp;
    for (size_t k = 0; k < grads.size(); ++k) gp.push_back({sharded_params[k].name, grads[k], true});
    auto gslices = slice_params(gp, lo, hi);
    REQUIRE(gslices.size() == mine.size());
    for (size_t i = 0; i < mine.size(); ++i) mine[i].param.set_grad(gslices[i].param);
    shards.push_back(std::make_unique<AdamW>(std::move(mine), o));
  }
  for (int step = 0; step < 3; ++step) {
    for (size_t k = 0; k < grads.size(); ++k) {
      fill_lcg(grads[k], 100 + step * 10 + k);
      Tensor h = full_params[k].param;
      h.set_grad(grads[k].clone());
    }
    full.step(1e-2 * (step + 1), 0.5f);
    for (auto& s : shards) s->step(1e-2 * (step + 1), 0.5f);
  }
  for (size_t k = 0; k < full_params.size(); ++k) {
    INFO(full_params[k].name);
    CHECK(same_bits(full_params[k].param, sharded_params[k].param));
  }
  CHECK(shards[0]->step_count() == 3);
}

TEST_CASE("the single-process group: collectives are identities and sums are the value itself", "[distributed]") {
  dist::SingleProcess one;
  CHECK(one.world() == 1);
  CHECK(one.is_root());
  std::vector<float> v = {1.5f, -2.0f, 3.25f};
  one.allreduce_sum(v.data(), 3);
  CHECK(v == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(one.sum_ordered(0.1) == 0.1);
  CHECK(one.sum_ordered(int64_t{42}) == 42);
  CHECK(one.gather_all(7u) == std::vector<uint64_t>{7u});
  std::vector<float> dst(3, 0.0f);
  const std::vector<int64_t> counts{3};
  one.gatherv(v.data(), dst.data(), counts, 0);
  CHECK(dst == v);
  CHECK_NOTHROW(dist::check_same_on_all_ranks(one, 123, "anything"));
  CHECK(rank_dropout_seed(1337, 0) == 1337);
  CHECK(rank_dropout_seed(1337, 1) != 1337);
  CHECK(rank_dropout_seed(1337, 1) != rank_dropout_seed(1337, 2));
  CHECK(row_dropout_seed(1337, 0) != row_dropout_seed(1337, 1));
  CHECK(row_dropout_seed(1337, 1) != rank_dropout_seed(1337, 1));
}

TEST_CASE("a process not started by mpirun is one rank, whatever the build", "[distributed]") {
  if (dist::launched_by_mpi()) return;  // the hidden [mpi] cases are run by ctest, not under mpirun
  dist::init(nullptr, nullptr);
  CHECK(dist::world().world() == 1);
  CHECK(std::string(dist::world().backend()) == "single");
  dist::finalize();
}

TEST_CASE("DataParallel on one rank is the plain AdamW loop, bitwise", "[distributed][exact]") {
  const AdamWOptions o{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  auto a = make_params(5);
  auto b = clone_params(a);
  dist::SingleProcess one;
  DataParallel dp(one, a, {.zero = 1});  // zero = 1 on one rank: nothing to shard
  CHECK_FALSE(dp.distributed());
  CHECK_FALSE(dp.sharded());
  CHECK(dp.allreduce_bytes_per_step() == 0);
  // Not sharded: the optimizer is built over the parameters themselves, not copies or slices.
  REQUIRE(dp.optimizer_params().size() == a.size());
  CHECK(dp.optimizer_params()[2].param.data<float>() == a[2].param.data<float>());
  AdamW opt(dp.optimizer_params(), o);
  AdamW ref(b, o);
  for (int step = 0; step < 2; ++step) {
    dp.zero_grads();
    for (const auto& p : a) CHECK_FALSE(p.param.grad().defined());
    for (size_t k = 0; k < a.size(); ++k) {
      Tensor g = Tensor::empty(a[k].param.shape(), DType::f32);
      fill_lcg(g, 40 + step * 10 + k);
      Tensor ha = a[k].param, hb = b[k].param;
      ha.set_grad(g);
      hb.set_grad(g.clone());
    }
    dp.reduce_grads();
    opt.step(2e-3, 0.75f);
    dp.gather_params();
    ref.step(2e-3, 0.75f);
  }
  for (size_t k = 0; k < a.size(); ++k) CHECK(same_bits(a[k].param, b[k].param));
  CHECK(opt.step_count() == 2);
  const auto saved = full_optimizer_state(dp, opt);
  REQUIRE(saved);
  CHECK(saved.get() == &opt);  // replicated: the optimizer itself, no copy
  CHECK(same_bits(saved->states()[2].exp_avg, ref.states()[2].exp_avg));
  CHECK(dp.parameter_hash() != 0);
}

TEST_CASE("train.zero other than 0 or 1 is refused with a message naming the key", "[distributed]") {
  dist::SingleProcess one;
  auto ps = make_params(3);
  try {
    DataParallel dp(one, ps, {.zero = 2});
    FAIL("no error");
  } catch (const Error& e) { CHECK_THAT(e.what(), Catch::Contains("train.zero = 2")); }
}

namespace {

// Rank 0 of a pretend two-rank group whose other rank holds the same gradients: a sum over ranks
// doubles each element. Records when each bucket was started and finished relative to backward.
class TwinRanks final : public dist::Communicator {
 public:
  const char* backend() const override { return "twin"; }
  int rank() const override { return 0; }
  int world() const override { return 2; }
  void allreduce_sum(float* data, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= 2.0f;
    log.push_back({data, n, in_backward});
  }
  void allreduce_sum(double* data, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= 2.0;
  }
  void allreduce_sum_start(float* data, int64_t n) override {
    allreduce_sum(data, n);
    started++;
  }
  void wait_all() override { waits++; }
  void broadcast(void*, int64_t, int) override {}
  void allgather(const void* send, void* recv, int64_t bytes) override {
    std::memcpy(recv, send, bytes);
    std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  }
  void allgatherv(float*, std::span<const int64_t>) override {}
  void gatherv(const float*, float*, std::span<const int64_t>, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int) override { throw Error(message); }

  struct Call {
    const float* data;
    int64_t n;
    bool during_backward;
  };
  std::vector<Call> log;
  bool in_backward = false;
  int started = 0, waits = 0;
};

}  // namespace

TEST_CASE("bucket all-reduces start during the last backward, last bucket first, each exactly once", "[distributed]") {
  // y = sum_k w_k * x_k over parameters of assorted sizes; 64-byte buckets cut across them.
  auto ps = make_params(8);
  std::vector<Tensor> xs;
  for (size_t k = 0; k < ps.size(); ++k) {
    ps[k].param.set_requires_grad(true);
    Tensor x = Tensor::empty(ps[k].param.shape(), DType::f32);
    fill_lcg(x, 70 + k);
    xs.push_back(x);
  }
  auto loss = [&] {
    Tensor total = ag::sum(ag::mul(ps[0].param, xs[0]));
    for (size_t k = 1; k < ps.size(); ++k) total = ag::add(total, ag::sum(ag::mul(ps[k].param, xs[k])));
    return total;
  };
  TwinRanks twin;
  DataParallel dp(twin, ps, {.zero = 0, .bucket_bytes = 64});
  REQUIRE(dp.overlaps());
  REQUIRE(dp.bucket_count() > 10);
  for (int accum = 1; accum <= 2; ++accum) {
    INFO("micro-batches " << accum);
    twin.log.clear();
    twin.started = twin.waits = 0;
    dp.zero_grads();
    for (int micro = 0; micro < accum; ++micro) {
      if (micro == accum - 1) dp.arm_overlap();
      twin.in_backward = true;
      autograd::backward(loss());
      twin.in_backward = false;
      if (micro < accum - 1) CHECK(twin.log.empty());  // earlier micro-batches send nothing
    }
    dp.reduce_grads();
    // Every bucket once, in descending order, most of them while backward was still running.
    REQUIRE(static_cast<int64_t>(twin.log.size()) == dp.bucket_count());
    CHECK(twin.started == dp.bucket_count());
    CHECK(twin.waits == 1);
    int during = 0;
    for (size_t i = 0; i < twin.log.size(); ++i) {
      during += twin.log[i].during_backward ? 1 : 0;
      if (i > 0) CHECK(twin.log[i].data < twin.log[i - 1].data);
    }
    CHECK(during == dp.bucket_count());  // every parameter gets its gradient in this backward
    // Mean over the two equal ranks: the gradient itself, x_k summed over micro-batches.
    for (size_t k = 0; k < ps.size(); ++k) {
      const auto g = ps[k].param.grad().to_vector(), x = xs[k].to_vector();
      for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == static_cast<float>(x[i] * accum));
    }
  }
}

TEST_CASE("with overlap off (train.dp_overlap = false) every bucket is reduced after backward, the same sums",
          "[distributed]") {
  auto ps = make_params(8);
  std::vector<Tensor> xs;
  for (size_t k = 0; k < ps.size(); ++k) {
    ps[k].param.set_requires_grad(true);
    Tensor x = Tensor::empty(ps[k].param.shape(), DType::f32);
    fill_lcg(x, 90 + k);
    xs.push_back(x);
  }
  TwinRanks twin;
  DataParallel dp(twin, ps, {.zero = 0, .bucket_bytes = 64, .overlap = false});
  CHECK_FALSE(dp.overlaps());
  REQUIRE(dp.bucket_count() > 10);
  CHECK_THAT(dp.describe(), Catch::Contains("after backward"));
  dp.zero_grads();
  dp.arm_overlap();
  twin.in_backward = true;
  Tensor total = ag::sum(ag::mul(ps[0].param, xs[0]));
  for (size_t k = 1; k < ps.size(); ++k) total = ag::add(total, ag::sum(ag::mul(ps[k].param, xs[k])));
  autograd::backward(total);
  twin.in_backward = false;
  CHECK(twin.log.empty());  // nothing started while backward ran
  dp.reduce_grads();
  REQUIRE(static_cast<int64_t>(twin.log.size()) == dp.bucket_count());
  for (size_t i = 0; i < twin.log.size(); ++i) {
    CHECK_FALSE(twin.log[i].during_backward);
    if (i > 0) CHECK(twin.log[i].data < twin.log[i - 1].data);  // the same order as with overlap
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    const auto g = ps[k].param.grad().to_vector(), x = xs[k].to_vector();
    for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == static_cast<float>(x[i]));
  }
}

TEST_CASE("the NCCL gradient communicator refuses clearly without a GPU or without the build parts",
          "[distributed][cuda]") {
  dist::SingleProcess one;
  if (!dist::built_with_nccl()) {
    CHECK_THROWS_WITH(dist::make_nccl_gradients(one), Catch::Contains("needs both CUDA and MPI"));
  } else if (cuda::device_count() == 0) {
    CHECK_THROWS_WITH(dist::make_nccl_gradients(one), Catch::Contains("[nccl] no CUDA device is visible on rank 0"));
  } else {
    // One rank on the GPU: the unique id, the communicator and an all-reduce of device memory.
    auto nccl = dist::make_nccl_gradients(one);
    CHECK(std::string(nccl->backend()) == "nccl");
    Tensor x = from_vector({1.5, -2.0, 3.25}, {3}).to(Device::cuda);
    nccl->allreduce_sum(x.data<float>(), 3);
    CHECK(x.to_vector() == std::vector<double>{1.5, -2.0, 3.25});
    double host = 2.5;
    nccl->allreduce_sum(&host, 1);  // host memory goes to the host group
    CHECK(host == 2.5);
  }
}

namespace {

// Row r's leaf: n floats spanning many magnitudes, so that how a sum is grouped changes its bits.
std::vector<float> row_leaf(int64_t r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull + 12345;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) / static_cast<double>(1ull << 53);
    x = static_cast<float>((u - 0.5) * std::pow(10.0, static_cast<double>((s >> 7) % 9) - 4.0));
  }
  return v;
}

// The tree of row_tree.h written as its definition: [0, G) cut into maximal aligned blocks from
// the left (one per set bit of G, largest first), each summed as (left half) + (right half),
// folded as B_0 + (B_1 + (... + B_k)).
float node_sum(int64_t first, int64_t size, size_t i) {
  if (size == 1) return row_leaf(first, static_cast<int64_t>(i) + 1)[i];
  return node_sum(first, size / 2, i) + node_sum(first + size / 2, size / 2, i);
}
float tree_definition(int64_t G, size_t i) {
  std::vector<float> blocks;
  int64_t at = 0;
  for (int b = 62; b >= 0; --b)
    if (G & (int64_t{1} << b)) {
      blocks.push_back(node_sum(at, int64_t{1} << b, i));
      at += int64_t{1} << b;
    }
  float acc = blocks.back();
  for (size_t k = blocks.size() - 1; k-- > 0;) acc = blocks[k] + acc;
  return acc;
}

}  // namespace

TEST_CASE("the row tree sums rows in one tree of their global indices, however they are split", "[row_tree]") {
  constexpr int64_t n = 24;
  int64_t order_mattered = 0;
  for (int64_t G = 1; G <= 24; ++G) {
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = tree_definition(G, i);
    // Rows in order into one tree.
    RowTree one(n);
    for (int64_t r = 0; r < G; ++r) one.push(row_leaf(r, n).data(), r);
    std::vector<float> got(n);
    one.fold(got.data());
    CAPTURE(G);
    CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * n) == 0);
    // Left to right, the plain way: it differs somewhere for most G (so the check above can fail).
    std::vector<float> seq(n, 0.0f);
    for (int64_t r = 0; r < G; ++r)
      for (size_t i = 0; i < n; ++i) seq[i] += row_leaf(r, n)[i];
    order_mattered += std::memcmp(seq.data(), want.data(), sizeof(float) * n) != 0;
    // Every split into `world` equal parts: each part's tree, then their blocks merged in order.
    for (int64_t world = 2; world <= G; ++world) {
      if (G % world) continue;
      const int64_t R = G / world;
      std::vector<std::unique_ptr<RowTree>> parts;
      std::vector<RowBlock> stack;
      for (int64_t w = 0; w < world; ++w) {
        parts.push_back(std::make_unique<RowTree>(n));
        for (int64_t r = w * R; r < (w + 1) * R; ++r) parts.back()->push(row_leaf(r, n).data(), r);
        const std::vector<RowBlock> shapes = block_shapes(w * R, R);
        REQUIRE(shapes.size() == parts.back()->blocks().size());
        for (size_t k = 0; k < shapes.size(); ++k) {
          CHECK(shapes[k].first_row == parts.back()->blocks()[k].first_row);
          CHECK(shapes[k].level == parts.back()->blocks()[k].level);
        }
      }
      for (auto& p : parts)
        for (const RowBlock& b : p->blocks()) push_block(stack, b, n);
      std::vector<float> merged(n);
      fold_blocks(stack, n, merged.data());
      CAPTURE(world);
      CHECK(std::memcmp(merged.data(), want.data(), sizeof(float) * n) == 0);
    }
  }
  CHECK(order_mattered >= 15);
  // Rows out of order are refused.
  RowTree t(n);
  t.push(row_leaf(0, n).data(), 0);
  CHECK_THROWS_WITH(t.push(row_leaf(2, n).data(), 2), Catch::Contains("consecutive order"));
}

TEST_CASE("DataParallel's row tree on one process: pushed rows summed by the tree, grads bound", "[row_tree]") {
  SingleProcess one;
  Tensor w = zeros({3, 4});
  w.set_requires_grad(true);
  Tensor b = zeros({5});
  b.set_requires_grad(true);
  DataParallel dp(one, {{"w", w, true}, {"b", b, false}}, {.tree_rows = 3});
  CHECK(dp.row_tree());
  CHECK(dp.flat_grads());
  dp.zero_grads();
  std::vector<std::vector<float>> leaves;
  for (int64_t r = 0; r < 3; ++r) {
    leaves.push_back(row_leaf(r, 17));
    const std::vector<double> v(leaves.back().begin(), leaves.back().end());
    w.set_grad(from_vector(std::vector<double>(v.begin(), v.begin() + 12), {3, 4}));
    if (r != 1) b.set_grad(from_vector(std::vector<double>(v.begin() + 12, v.end()), {5}));
    else leaves.back().resize(12, 0.0f);  // a row that gave b no gradient: zeros
    leaves.back().resize(17, 0.0f);
    dp.push_row(r);
    CHECK_FALSE(w.grad().defined());  // the next row's backward starts afresh
  }
  dp.reduce_grads();
  for (size_t i = 0; i < 17; ++i) {
    const float want = (leaves[0][i] + leaves[1][i]) + leaves[2][i];  // G = 3: [0, 2) + [2]
    const float got = i < 12 ? w.grad().data<float>()[i] : b.grad().data<float>()[i - 12];
    CHECK(got == want);
  }
  CHECK_THROWS_WITH(dp.push_row(3), Catch::Contains("one more than the 3 rows"));
}

TEST_CASE(
    "the row tree: a pair pushed at once, rows pushed one by one and blocks merged give the same bits, "
    "-0 and rows without a gradient included",
    "[row_tree]") {
  // Two pieces per row; each row has -0, +0, ordinary values, and some rows lack a piece.
  constexpr int64_t n = 6;
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 6; ++r) rows.push_back({-0.0f, 0.0f, 1.5f * static_cast<float>(r), -0.0f, 3.0f, -0.0f});
  const auto missing = [](int r, int piece) { return (r == 1 && piece == 0) || (r == 2 && piece == 1) || r == 4; };
  const auto pieces = [&](int r) {
    return std::vector<RowTree::Piece>{{0, 3, missing(r, 0) ? nullptr : rows[r].data()},
                                       {3, 3, missing(r, 1) ? nullptr : rows[r].data() + 3}};
  };
  const auto bits = [](const std::vector<float>& v) {
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * 4);
    return b;
  };
  RowTree single(n), paired(n);
  for (int r = 0; r < 6; ++r) single.push(pieces(r), r);
  for (int r = 0; r < 6; r += 2) paired.push_pair(pieces(r), pieces(r + 1), r);
  std::vector<float> a(n), b(n);
  single.fold(a.data());
  paired.fold(b.data());
  CHECK(bits(a) == bits(b));
  // Three ranks of two rows, each pushing its rows alone, their blocks merged.
  std::vector<std::unique_ptr<RowTree>> ranks;
  std::vector<RowBlock> stack;
  for (int w = 0; w < 3; ++w) {
    ranks.push_back(std::make_unique<RowTree>(n));
    for (int r = 2 * w; r < 2 * w + 2; ++r) ranks.back()->push(pieces(r), r);
    for (const RowBlock& blk : ranks.back()->blocks()) push_block(stack, blk, n);
  }
  std::vector<float> c(n);
  fold_blocks(stack, n, c.data());
  CHECK(bits(a) == bits(c));
  // Six ranks of one row: every leaf alone (its copy keeps -0) until merged.
  std::vector<std::unique_ptr<RowTree>> ones;
  std::vector<RowBlock> stack1;
  for (int r = 0; r < 6; ++r) {
    ones.push_back(std::make_unique<RowTree>(n));
    ones.back()->push(pieces(r), r);
    push_block(stack1, ones.back()->blocks()[0], n);
  }
  std::vector<float> d(n);
  fold_blocks(stack1, n, d.data());
  CHECK(bits(a) == bits(d));
  // -0 survives where every row has -0 and a gradient; a row without one makes it +0.
  CHECK(std::signbit(a[0]) == false);  // row 1 lacks piece 0 (and row 4 everything)
}

TEST_CASE("the row tree on the GPU gives the host tree's bits", "[row_tree][cuda]") {
  if (!test::cuda_device_present()) return;
  // 11 rows of 3 pieces (n = 37): row 4 has no gradient for piece 1, row 7 none at all, and some
  // values are -0; pushed as pairs where a row's sibling follows, else alone, as DataParallel does.
  const int64_t n = 37, G = 11;
  const std::vector<std::pair<int64_t, int64_t>> cut{{0, 10}, {10, 20}, {30, 7}};
  std::vector<Tensor> device_leaves;
  std::vector<std::vector<float>> host_leaves;
  for (int64_t r = 0; r < G; ++r) {
    std::vector<float> v = row_leaf(r, n);
    if (r % 3 == 0) v[static_cast<size_t>(r)] = -0.0f;
    host_leaves.push_back(v);
    device_leaves.push_back(from_vector(std::vector<double>(v.begin(), v.end()), {n}).to(Device::cuda));
  }
  const auto pieces = [&](int64_t r, bool device) {
    std::vector<RowTree::Piece> p;
    for (size_t k = 0; k < cut.size(); ++k) {
      const bool none = r == 7 || (r == 4 && k == 1);
      const float* base = device ? device_leaves[r].data<float>() : host_leaves[r].data();
      p.push_back({cut[k].first, cut[k].second, none ? nullptr : base + cut[k].first});
    }
    return p;
  };
  RowTree host(n), gpu(n, Device::cuda);
  for (int64_t r = 0; r < G; ++r) {
    if (r % 2 == 0 && r + 1 < G) {
      host.push_pair(pieces(r, false), pieces(r + 1, false), r);
      gpu.push_pair(pieces(r, true), pieces(r + 1, true), r);
      ++r;
    } else {
      host.push(pieces(r, false), r);
      gpu.push(pieces(r, true), r);
    }
  }
  REQUIRE(gpu.blocks().size() == host.blocks().size());
  std::vector<float> want(n);
  host.fold(want.data());
  Tensor got = Tensor::empty({n}, DType::f32, Device::cuda);
  gpu.fold(got.data<float>());
  const std::vector<double> g = got.to(Device::cpu).to_vector();
  size_t negative_zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const float gi = static_cast<float>(g[i]);
    CHECK(std::memcmp(&want[i], &gi, sizeof(float)) == 0);
    negative_zeros += std::signbit(want[i]) && want[i] == 0.0f;
  }
  CHECK(negative_zeros == 0);  // a missing gradient is +0: -0 + +0 = +0
  // Blocks merged on the device (what the ranks' all-gathered blocks go through).
  std::vector<RowBlock> hs, ds;
  std::vector<Tensor> keep;
  for (int64_t r = 0; r < G; ++r) {
    push_block(hs, {r, 0, host_leaves[r].data()}, n);
    keep.push_back(device_leaves[r].clone());
    push_block(ds, {r, 0, keep.back().data<float>()}, n, nullptr, Device::cuda);
  }
  fold_blocks(hs, n, want.data());
  fold_blocks(ds, n, got.data<float>(), Device::cuda);
  const std::vector<double> g2 = got.to(Device::cpu).to_vector();
  for (int64_t i = 0; i < n; ++i) CHECK(static_cast<float>(g2[i]) == want[i]);
}
