// Decoding on a busy machine: matrix-vector products pick their threads by size
// (one thread for the small ones of a decode step), are split in chunks fixed by the shape so the
// result is bitwise independent of the thread count, and every chunk runs exactly once whoever
// claims it; `qkv bench --what decode` and `qkv sample --json` report tokens/s and peak RSS.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint_test_util.h"
#include "autograd/grad_mode.h"
#include "compare_util.h"
#include "nn/transformer.h"
#include "tensor/cpu/parallel.h"
#include "tensor/numerics.h"
#include "train/bench.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "train/sampler.h"
#include "build_dir.h"

using namespace qkv;
using test::with_threads;

namespace {

// float64 reference of x [1, K] @ w^T (w [N, K]).
std::vector<double> reference_row(const Tensor& x, const Tensor& w) {
  const auto xv = x.to_vector(), wv = w.to_vector();
  const int64_t N = w.size(0), K = w.size(1);
  std::vector<double> y(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) y[n] += xv[k] * wv[n * K + k];
  return y;
}

}  // namespace

TEST_CASE("split_threads gives one thread to a small model's decode GEMVs and all of them to GPT-2's",
          "[decode][threads]") {
  // shakespeare_char's widest decode product: c_fc 128 -> 512 (256 KiB of float32).
  CHECK(cpu::split_threads(512 * 128 * 4, 2) == 1);
  CHECK(cpu::split_threads(512 * 128 * 4, 16) == 1);
  // 2 MiB is the least that wakes a second thread.
  CHECK(cpu::split_threads(2 * cpu::kSplitBytesPerThread - 4, 2) == 1);
  CHECK(cpu::split_threads(2 * cpu::kSplitBytesPerThread, 2) == 2);
  // GPT-2 124M: c_attn 768 -> 2304 (6.75 MiB) and the tied LM head (147 MiB).
  CHECK(cpu::split_threads(2304 * 768 * 4, 2) == 2);
  CHECK(cpu::split_threads(2304 * 768 * 4, 4) == 4);
  CHECK(cpu::split_threads(int64_t(50257) * 768 * 4, 2) == 2);
  CHECK(cpu::split_threads(int64_t(50257) * 768 * 4, 1) == 1);  // never more than asked for
  CHECK(cpu::split_threads(0, 2) == 1);
}

TEST_CASE("a decode-sized x @ W^T runs on one thread; a large one splits, bitwise equal to one thread",
          "[decode][threads][matmul]") {
  SECTION("small: 128 -> 512 stays on the calling thread even with 2 threads") {
    const Tensor x = randn({1, 128}, 1, 0, 0.0, 1.0, DType::f32), w = randn({512, 128}, 2, 0, 0.0, 0.1, DType::f32);
    const Tensor y = with_threads(2, [&] { return matmul(x, w.transpose(0, 1)); });
    CHECK(cpu::last_split_trace().threads == 1);
    const auto ref = reference_row(x, w);
    const auto got = y.to_vector();
    for (size_t i = 0; i < ref.size(); ++i) REQUIRE(got[i] == Approx(ref[i]).margin(1e-4));
  }
  SECTION("large: 768 -> 2304 (rows form) and [K, N] storage (columns form), strided vector") {
    const Tensor x = randn({1, 768}, 3, 0, 0.0, 1.0, DType::f32), w = randn({2304, 768}, 4, 0, 0.0, 0.1, DType::f32);
    const Tensor wt = w.transpose(0, 1).contiguous();  // [K, N]: the columns form reads it row by row
    const Tensor xs = randn({768, 2}, 5, 0, 0.0, 1.0, DType::f32).select(1, 0).unsqueeze(0);  // stride 2
    for (const Tensor& b : {w.transpose(0, 1), wt}) {
      for (const Tensor& a : {x, xs}) {
        const Tensor y1 = with_threads(1, [&] { return matmul(a, b); });
        CHECK(cpu::last_split_trace().threads == 1);
        const Tensor y2 = with_threads(2, [&] { return matmul(a, b); });
        CHECK(cpu::last_split_trace().threads == 2);
        CHECK(max_abs_diff(y1, y2) == 0.0);
        const auto ref = reference_row(a.contiguous(), w);
        const auto got = y2.to_vector();
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
        CHECK(worst < 1e-4);
      }
    }
  }
  SECTION("beta = 1 adds into out (the bias path), N == 1 column products in float64") {
    const Tensor a = randn({3000, 700}, 6, 0, 0.0, 1.0, DType::f64), v = randn({700, 1}, 7, 0, 0.0, 1.0, DType::f64);
    const Tensor base = randn({3000, 1}, 8, 0, 0.0, 1.0, DType::f64);
    Tensor out = base.clone();
    with_threads(2, [&] {
      matmul_into(a, v, out, 2.0, 1.0);
      return 0;
    });
    CHECK(cpu::last_split_trace().threads == 2);
    const auto av = a.to_vector(), vv = v.to_vector(), bv = base.to_vector(), ov = out.to_vector();
    double worst = 0;
    for (int64_t i = 0; i < 3000; ++i) {
      double s = 0;
      for (int64_t k = 0; k < 700; ++k) s += av[i * 700 + k] * vv[k];
      worst = std::max(worst, std::abs(ov[i] - (2 * s + bv[i])));
    }
    CHECK(worst < 1e-9);
  }
}

TEST_CASE("run_split runs every chunk exactly once, also with two callers at a time", "[decode][threads]") {
  constexpr int64_t kChunks = 97;
  auto once = [](int threads) {
    std::vector<std::atomic<int>> hits(kChunks);
    for (auto& h : hits) h = 0;
    cpu::run_split(kChunks, threads, [&](int64_t c) { hits[static_cast<size_t>(c)]++; });
    for (auto& h : hits)
      if (h.load() != 1) return false;
    return true;
  };
  for (int i = 0; i < 200; ++i) REQUIRE(once(2));
  REQUIRE(once(1));
  // A second caller while the pool is taken runs its chunks itself.
  std::atomic<bool> ok{true};
  std::thread other([&] {
    for (int i = 0; i < 200; ++i) ok = ok && once(3);
  });
  for (int i = 0; i < 200; ++i) REQUIRE(once(2));
  other.join();
  CHECK(ok.load());
}

TEST_CASE("greedy KV-cache decoding gives bitwise the same logits and tokens with 1 and 2 threads",
          "[decode][threads][model]") {
  // Wide enough that the LM head (2304 x 256, 2.25 MiB) splits over two threads.
  nn::ModelConfig mc;
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_kv_head = 4;
  mc.n_embd = 256;
  mc.ffn_hidden = 1024;
  mc.vocab_size = 2304;
  mc.block_size = 64;
  nn::DecoderModel model(mc);
  model.init_weights(11);
  model.eval();
  train::SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 24;
  const std::vector<int32_t> prompt = {5};
  const auto t1 = with_threads(1, [&] { return train::generate(model, prompt, o); });
  const auto t2 = with_threads(2, [&] { return train::generate(model, prompt, o); });
  CHECK(t1 == t2);
  // Decode steps' logits, compared element by element. Token by token from the first one: a
  // multi-token prefill is a GEMM, which OpenBLAS splits differently by thread count.
  auto step_logits = [&] {
    autograd::NoGradGuard ng;
    nn::ModelCache cache = model.make_cache(1, mc.block_size);
    nn::ForwardArgs args;
    args.cache = &cache;
    Tensor l;
    for (int64_t id : {5, 17, 3, 9}) {
      args.ids = from_vector_i64({id}, {1, 1});
      l = model.forward(args);
    }
    return l;
  };
  const Tensor l1 = with_threads(1, step_logits);
  const Tensor l2 = with_threads(2, step_logits);
  CHECK(cpu::last_split_trace().threads == 2);  // the LM head of the step above was split
  CHECK(max_abs_diff(l1, l2) == 0.0);
}

TEST_CASE("bench_decode reports tokens/s, ms/token, peak RSS, context and threads", "[decode][bench]") {
  Config cfg = ckpt_test::tiny_config("gpt2");
  cfg.model.vocab_size = 70;
  cfg.train.threads = 2;
  const auto r = train::bench_decode(cfg, 12);
  CHECK(r.tokens == 12);
  CHECK(r.context_tokens == 13);
  CHECK(r.token_ms.size() == 12);
  CHECK(r.tokens_per_s > 0);
  CHECK(r.ms_per_token > 0);
  CHECK(r.peak_rss_bytes > 0);
  CHECK(r.threads == 2);
  // The weights a step reads: every Linear and norm parameter, and the tied head's [V, C] table
  // (the position table is only gathered from).
  const int64_t C = cfg.model.n_embd, V = 70, L = cfg.model.n_layer, T = cfg.model.block_size;
  const int64_t kv = cfg.model.resolved_n_kv_head() * cfg.model.head_dim(),
                F = cfg.resolved().model.resolved_ffn_hidden();
  const int64_t per_layer = 2 * 2 * C + (C * (C + 2 * kv) + C + 2 * kv) + (C * C + C) + (C * F + F) + (F * C + C);
  CHECK(r.params == V * C + T * C + L * per_layer + 2 * C);
  CHECK(r.weight_bytes == 4 * (L * per_layer + 2 * C + V * C));
  CHECK(r.weight_gb_per_s == Approx(r.weight_bytes / (r.ms_per_token / 1e3) / 1e9));
  CHECK(r.stream_gb_per_s > 0);
  CHECK_THROWS_WITH(train::bench_decode(cfg, cfg.model.block_size),
                    Catch::Contains("--tokens") && Catch::Contains("block_size"));
}

TEST_CASE("bench_numerics alternates the two modes and reports per-round ratios", "[decode][bench][invariant]") {
  Config cfg = ckpt_test::tiny_config("gpt2");
  cfg.model.vocab_size = 70;
  cfg.train.threads = 1;
  cfg.data.random_tokens = true;
  const auto r = train::bench_numerics(cfg, 2, 6, 2);
  for (int mode = 0; mode < 2; ++mode) {
    REQUIRE(r.step_ms[mode].size() == 2);
    REQUIRE(r.token_ms[mode].size() == 2);
    CHECK(r.decode[mode].tokens == 6);
  }
  const double a = r.step_ms[1][0] / r.step_ms[0][0], b = r.step_ms[1][1] / r.step_ms[0][1];
  CHECK(r.step_ratio == Approx((a + b) / 2));
  CHECK(numerics() == Numerics::standard);  // each benchmark restores the mode it found
  CHECK_THROWS_WITH(train::bench_numerics(cfg, 2, 6, 0), Catch::Contains("--rounds"));
}

TEST_CASE("qkv bench --what decode --json and qkv sample --json carry tokens_per_s and peak_rss_bytes",
          "[decode][bench][cli]") {
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  std::string out;
  if (::access(qkv.c_str(), X_OK) != 0) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  auto last_json = [](std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return nlohmann::json::parse(s.substr(s.find_last_of('\n') + 1));  // npos + 1 == 0
  };
  REQUIRE(ckpt_test::run_command(
              "cd " + std::string(QKV_SOURCE_DIR) + " && " + qkv +
                  " bench --config configs/tiny.toml --what decode --tokens 8 --threads 2 --json 2>/dev/null",
              out) == 0);
  const nlohmann::json b = last_json(out);
  REQUIRE(b["results"].size() == 1);
  const auto& d = b["results"][0];
  CHECK(d["name"] == "decode");
  CHECK(d["tokens_per_s"].get<double>() > 0);
  CHECK(d["ms_per_token"].get<double>() > 0);
  CHECK(d["peak_rss_bytes"].get<int64_t>() > 0);
  CHECK(d["context_tokens"] == 9);
  CHECK(d["tokens"] == 8);
  CHECK(d["threads"] == 2);
  // Without --tokens, what fits tiny's block of 32 after the prompt; asked for more, one line.
  REQUIRE(ckpt_test::run_command("cd " + std::string(QKV_SOURCE_DIR) + " && " + qkv +
                                     " bench --config configs/tiny.toml --what decode --threads 1 --json 2>/dev/null",
                                 out) == 0);
  CHECK(last_json(out)["results"][0]["tokens"] == 31);
  CHECK(last_json(out)["results"][0]["context_tokens"] == 32);
  CHECK(ckpt_test::run_command("cd " + std::string(QKV_SOURCE_DIR) + " && " + qkv +
                                   " bench --config configs/tiny.toml --what decode --tokens 32 2>&1",
                               out) != 0);
  CHECK(out.find("--tokens 32 plus the 1-token prompt exceeds model.block_size 32") != std::string::npos);

  ckpt_test::TempDir dir;
  const std::string path = dir.file("ckpt_1.h5");
  ckpt_test::save(ckpt_test::make_run("gpt2"), path);
  REQUIRE(ckpt_test::run_command(qkv + " sample --checkpoint " + path +
                                     " --prompt 'It was' --temperature 0 --max-new-tokens 5 --json 2>/dev/null",
                                 out) == 0);
  const nlohmann::json s = last_json(out);
  CHECK(s["tokens"].size() == 5);
  CHECK(s["tokens_per_s"].get<double>() > 0);
  CHECK(s["peak_rss_bytes"].get<int64_t>() > 0);
}

namespace {

// VmHWM and VmRSS of this process, bytes.
std::pair<int64_t, int64_t> peak_and_current_rss() {
  std::ifstream f("/proc/self/status");
  std::string line;
  int64_t hwm = -1, rss = -1;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6)) * 1024;
  }
  return {hwm, rss};
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false where /proc does not allow it.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace

TEST_CASE("loading for inference keeps one copy of the weights: buffers taken over, the heap scan not resident",
          "[decode][checkpoint][memory]") {
  ckpt_test::TempDir dir;
  const std::string path = dir.file("ckpt_big.h5");
  // 256 wide, 8192 tokens: ~14 MB of weights, ~43 MB of file with the optimizer's moments (the
  // scan goes in 4 MiB windows).
  ckpt_test::Run r = ckpt_test::make_run("gpt2", 256, 2);
  {
    Config cfg = r.cfg;
    cfg.model.vocab_size = 8192;
    r.cfg = cfg;
    r.model = train::build_model(cfg, 8192);
    r.model->init_weights(3);
    r.opt = ckpt_test::make_optimizer(*r.model, cfg);
  }
  ckpt_test::save(r, path);
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));

  SECTION("take_buffers: the parameters hold the loaded values, tied weights stay tied, nothing is copied") {
    auto a = train::build_model(r.cfg, 8192), b = train::build_model(r.cfg, 8192);
    train::load_model_weights(path, *a);
    const auto before = b->named_parameters();
    std::vector<const void*> old_ptrs;
    for (const auto& p : before) old_ptrs.push_back(p.tensor.raw_data());
    train::load_model_weights(path, *b, /*take_buffers=*/true);
    const auto pa = a->named_parameters(), pb = b->named_parameters(), want = r.model->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      CHECK(ckpt_test::bitwise_equal(pa[i].tensor, want[i].tensor));
      CHECK(ckpt_test::bitwise_equal(pb[i].tensor, want[i].tensor));
      CHECK(pb[i].tensor.raw_data() != old_ptrs[i]);  // the loaded buffer, not a copy into the old one
    }
    nn::ForwardArgs args;
    args.ids = from_vector_i64({1, 2, 3}, {1, 3});
    autograd::NoGradGuard ng;
    const Tensor la = a->forward(args), lb = b->forward(args);
    CHECK(max_abs_diff(la, lb) == 0.0);  // the tied LM head reads the loaded embedding
  }
  SECTION("the global-heap scan does not leave the file's pages resident") {
    if (!reset_peak_rss()) {
      WARN("/proc/self/clear_refs is not writable: peak RSS not checked");
      return;
    }
    const int64_t rss0 = peak_and_current_rss().second;
    for (int i = 0; i < 3; ++i) (void)train::read_checkpoint_meta(path);
    const auto [hwm, rss1] = peak_and_current_rss();
    INFO("file " << file_bytes << " B, RSS " << rss0 << " -> peak " << hwm << " -> " << rss1);
    CHECK(hwm - rss0 < file_bytes / 2);
  }
}
