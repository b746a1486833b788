// Exact or refused, for sizes: the cost model's figures are exact integers or refused naming the
// figure (analysis/cost.cpp counts with overflow-checked arithmetic), a model that cannot fit this
// machine is refused with both figures before anything is allocated (train/memory_budget.h), and
// an allocation that fails anyway reaches the user as one line, never as "std::bad_alloc".
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "analysis/cost.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "train/config.h"
#include "train/memory_budget.h"
#include "train/model_factory.h"
#include "train/session.h"
#include "build_dir.h"

using namespace qkv;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using i128 = __int128;

Config parse(const std::vector<std::string>& overrides) { return parse_config_text("", "x.toml", overrides); }

// The largest model every key's range allows (gpt2: learned positions, biases, LayerNorm, GELU,
// tied head; fused kernel), one row of the longest block.
const std::vector<std::string> kLargest = {
    "model.family=\"gpt2\"",    "model.n_layer=1024",        "model.n_embd=65536", "model.n_head=64",
    "model.block_size=1048576", "model.vocab_size=16777216", "train.batch_size=1", "model.attn_kernel=\"fused\""};

// A model of 192 TiB of parameters that passes every key's range (multi-head: n_kv_head = n_head).
const std::vector<std::string> kHuge = {"model.n_layer=1024", "model.n_embd=65536",  "model.n_head=64",
                                        "model.n_kv_head=0",  "model.block_size=64", "model.vocab_size=256"};

struct Run {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `qkv ARGS` run by the shell (ARGS is shell text); `prefix` runs first in the same shell (ulimit).
Run qkv_cli(const std::string& args, const std::string& prefix = "") {
  const std::string base = fs::temp_directory_path() / ("qkv_budgets_" + std::to_string(::getpid()));
  const std::string cmd =
      prefix + std::string(QKV_BINARY_DIR) + "/qkv " + args + " >" + base + ".out 2>" + base + ".err </dev/null";
  const int rc = std::system(cmd.c_str());
  Run r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(base + ".out"), slurp(base + ".err")};
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

bool have_cli() {
  if (fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) return true;
  WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
  return false;
}

// " --set 'k=v'" for each (no value holds a single quote).
std::string sets(const std::vector<std::string>& kv) {
  std::string s;
  for (const auto& x : kv) s += " --set '" + x + "'";
  return s;
}

}  // namespace

TEST_CASE("budgets: cost at the ends of the key ranges equals exact hand-computed products", "[budgets][cost]") {
  const analysis::CostReport r = analysis::estimate_cost(parse(kLargest));
  const i128 L = 1024, C = 65536, Hq = 64, V = i128{1} << 24, N = i128{1} << 20, B = 1, T = N, F = 4 * C;
  // Per block: c_attn 3C² + 3C, c_proj C² + C, c_fc CF + F, mlp proj FC + C, two LayerNorms 4C.
  const i128 block = 3 * C * C + 3 * C + C * C + C + 2 * C * F + F + C + 4 * C;
  const i128 params = L * block + V * C + N * C + 2 * C;  // + tok_emb, pos_emb, ln_f; head tied
  CHECK(i128{r.params} == params);
  CHECK(i128{r.embedding_params} == V * C + N * C);
  // Kept per token per block (gpt2 packed path, cost.h's list): x, ln1 out, h, ln2 out, 2 stats per
  // norm, qkv 3C, O C, lse Hq, the MLP's pre-activation and activation 2F.
  const i128 per_token = 4 * C + 4 + 3 * C + C + Hq + 2 * F;
  CHECK(i128{r.activation_bytes} == 4 * L * B * T * per_token);
  CHECK(i128{r.activation_bytes_recompute} == 4 * L * C * B * T);
  CHECK(i128{r.attn_weights_naive_bytes} == 4 * L * B * Hq * T * T);
  CHECK(i128{r.kv_cache_bytes_per_sequence_f32} == L * 2 * C * 4 * N);
  CHECK(i128{r.full_pairs_context} == N * (N + 1) / 2);
  CHECK(i128{r.state_bytes} == 3 * 4 * params);
  CHECK(r.peak_step_bytes >= r.state_bytes + r.activation_bytes);
  for (double f : {r.train.total(), r.prefill.total(), r.decode.total(), r.train_flops_per_step, r.prefill_flops}) {
    CHECK(std::isfinite(f));
    CHECK(f > 0);
  }
  // Decode at context N: 2 FLOPs per block weight, 4·C·N per layer for QKᵀ and AV over all N keys,
  // 2 per ln_f weight and 2·C·V for the tied head.
  const long double decode = 2.0L * static_cast<long double>(L * block) + 4.0L * static_cast<long double>(L * C * N) +
                             2.0L * static_cast<long double>(2 * C) + 2.0L * static_cast<long double>(C * V);
  CHECK(static_cast<long double>(r.decode.total()) == Approx(static_cast<double>(decode)).epsilon(1e-12));

  // The longest step: B = T = 2^20 - 1 rows and tokens, C = 16384, one head. Each layer keeps
  // 16C + 5 floats per token, 4 · B · T · (16C + 5) ≈ 2^60 bytes: an odd multiple of 4 past 2^53,
  // which a double cannot hold exactly; the count must be exact.
  const analysis::CostReport s =
      analysis::estimate_cost(parse({"model.family=\"gpt2\"", "model.n_layer=1", "model.n_embd=16384", "model.n_head=1",
                                     "model.block_size=1048575", "model.vocab_size=65536", "train.batch_size=1048575",
                                     "model.attn_kernel=\"fused\"", "train.numerics=\"standard\""}));
  const i128 Bs = 1048575, Ts = 1048575, Cs = 16384;
  CHECK(i128{s.activation_bytes} == 4 * Bs * Ts * (16 * Cs + 5));
  CHECK(i128{s.activation_bytes_recompute} == 4 * Bs * Ts * Cs);
  CHECK(i128{s.attn_weights_naive_bytes} == 4 * Bs * Ts * Ts);
  CHECK(i128{s.attn_fused_kept_bytes} == 4 * (Bs * Ts * Cs + Bs * Ts));
  CHECK(s.peak_step_bytes >= s.activation_bytes);
  CHECK(std::isfinite(s.train_flops_per_step));
  CHECK(s.row_tree_bytes == 0);
  // Invariant numerics runs the rows alone: one row's activations, and 21 tree blocks of the
  // parameters (2^20 - 1 rows: levels 0 .. 19, + the newest).
  const analysis::CostReport t = analysis::estimate_cost(parse(
      {"model.family=\"gpt2\"", "model.n_layer=1", "model.n_embd=16384", "model.n_head=1", "model.block_size=1048575",
       "model.vocab_size=65536", "train.batch_size=1048575", "model.attn_kernel=\"fused\""}));
  CHECK(t.row_tree);
  CHECK(t.peak_step_bytes < s.peak_step_bytes);
  CHECK(t.peak_step_bytes >= t.activation_bytes / Bs);
  CHECK(i128{t.row_tree_bytes} == 20 * 4 * i128{t.params});
}

TEST_CASE("budgets: a cost figure past int64 is refused naming the figure and the keys", "[budgets][cost]") {
  // 4 bytes · B · Hq · T² per layer = 2^2 · 2^20 · 8 · 2^40 = 2^65 bytes of naive attention weights.
  const Config cfg = parse({"model.n_layer=2", "model.n_embd=64", "model.n_head=8", "model.block_size=1048576",
                            "model.vocab_size=256", "train.batch_size=1048576"});
  try {
    analysis::estimate_cost(cfg);
    FAIL("a figure of 2^65 bytes was not refused");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Contains("attention weights a naive kernel stores exceeds 2^63 - 1"));
    CHECK_THAT(m, Contains("train.batch_size = 1048576"));
    CHECK_THAT(m, Contains("train.seq_len = 1048576"));
    CHECK_THAT(m, Contains("model.n_head = 8"));
  }
}

TEST_CASE("budgets: a model that cannot fit this machine is refused before anything is allocated", "[budgets]") {
  const Config cfg = parse(kHuge).resolved();
  const train::MachineMemory mem = train::machine_memory();
  REQUIRE(mem.bytes > 0);
  REQUIRE(mem.bytes < (int64_t{1} << 47));  // 128 TiB: less than the model's 192 TiB of parameters
  const int64_t before = allocator_stats().bytes_in_use;
  try {
    train::build_model(cfg, 256);
    FAIL("a model of 192 TiB was built");
  } catch (const Error& e) {
    const std::string m = e.what();
    // 4 bytes · (1024 · (12C² + 13C) + 256·C + 64·C + 2C) with C = 65536: 192.003 TiB, plus its
    // KV cache for 64 tokens (1024 · 2C · 4 · 64 = 32 GiB).
    CHECK_THAT(m, Contains("model needs ~192 TiB (parameters 192 TiB, KV cache of 64 tokens 32 GiB)"));
    CHECK_THAT(m, Contains(mem.what + " " + train::gib_text(static_cast<double>(mem.bytes))));
  }
  CHECK(allocator_stats().bytes_in_use == before);
}

TEST_CASE("budgets: training is refused when its step cannot fit, naming the activations", "[budgets]") {
  // 2 layers of C = 64, but a step of 16384 rows x 65536 tokens: BT = 2^30 tokens, each keeping
  // 16C + 4 + Hq = 1036 floats per layer: 2 · 4 · 1036 · 2^30 bytes = 8.09 TiB of activations.
  const Config cfg = parse({"model.n_layer=2", "model.n_embd=64", "model.n_head=8", "model.block_size=65536",
                            "model.vocab_size=256", "train.batch_size=16384", "train.numerics=\"standard\""})
                         .resolved();
  REQUIRE(train::machine_memory().bytes < (int64_t{1} << 43));  // less than 8 TiB
  try {
    train::build_model(cfg, 256, train::ModelUse::training);
    FAIL("a step of 8 TiB of activations was let through");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Contains("for a training step"));
    CHECK_THAT(m, Contains("activations 8.09 TiB for train.batch_size 16384 x train.seq_len 65536 tokens"));
    CHECK_THAT(m, Contains("(or set train.recompute = true)"));
  }
  // The same model for inference is small (its KV cache for 65536 tokens: 2 · 2 · 64 · 4 · 65536 = 64 MiB).
  CHECK(train::build_model(cfg, 256)->parameter_count() > 0);
  // Invariant numerics trains the rows alone (one per thread): one row keeps 2 · 4 · 1036 · 65536 bytes
  // (0.5 GiB), and the step fits where the batched one does not; rows 1024 times wider do not
  // (one keeps 2 · 4 · (16 · 65536 + 4 + 64) · 65536 bytes, 0.5 TiB).
  Config rows = cfg;
  rows.train.numerics = Numerics::invariant;
  CHECK(train::build_model(rows, 256, train::ModelUse::training)->parameter_count() > 0);
  rows.model.n_embd = 65536;
  rows.model.n_head = 64;
  try {
    train::build_model(rows, 256, train::ModelUse::training);
    FAIL("a step of 65536-wide rows of 65536 tokens was let through");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains("for one row of train.seq_len 65536 tokens (invariant numerics runs rows alone)"));
  }
}

TEST_CASE("budgets: train.threads above 4 x the processors is refused with the reason", "[budgets]") {
  const Config cfg = parse({"train.threads=4096"});
  if (omp_get_num_procs() * 4 >= 4096) {
    WARN("this machine has " << omp_get_num_procs() << " processors: 4096 threads are allowed");
    return;
  }
  CHECK_THROWS_WITH(train::apply_thread_setting(cfg),
                    Contains("train.threads = 4096 is more than 4 x the") && Contains("wait at every barrier"));
}

TEST_CASE("budgets: the CLI refuses a model too big to train in one line and cost states its figures",
          "[budgets][cli]") {
  if (!have_cli()) return;
  const std::string config = std::string(QKV_SOURCE_DIR) + "/configs/tiny.toml";
  std::vector<std::string> kv = kHuge;
  kv.push_back("data.random_tokens=true");
  kv.push_back("data.path=\"\"");
  kv.push_back("train.out_dir=\"" + (fs::temp_directory_path() / "qkv_budgets_run").string() + "\"");
  const Run train = qkv_cli("train --config " + config + sets(kv));
  CHECK(train.rc == 2);
  CHECK_THAT(train.err, Contains("qkv: model needs ~"));
  CHECK_THAT(train.err, Contains("for a training step (parameters 192 TiB, gradients 192 TiB, AdamW moments 384 TiB"));
  CHECK(std::count(train.err.begin(), train.err.end(), '\n') == 1);
  CHECK(train.err.find("bad_alloc") == std::string::npos);

  // cost builds nothing: it states the exact count and says the step does not fit.
  const Run cost = qkv_cli("cost --config " + config + sets(kv));
  CHECK(cost.rc == 0);
  CHECK_THAT(cost.out, Contains("params: 52777451651072 total"));  // 1024·(12C² + 13C) + 320·C + 2C
  CHECK_THAT(cost.out, Contains("does not fit: a training step needs ~"));
  CHECK_THAT(cost.out, Contains("(qkv train refuses it)"));
}

TEST_CASE("budgets: an allocation that fails anyway is one line naming the command, never std::bad_alloc",
          "[budgets][cli]") {
  if (!have_cli()) return;
#if defined(__SANITIZE_ADDRESS__) || defined(QKV_SANITIZED_ADDRESS)
  // AddressSanitizer reserves terabytes of address space for its shadow memory: no process of
  // this build starts under an address-space limit, so the limit cannot be what fails here.
  WARN("built with AddressSanitizer: the ulimit -v case is checked by the other builds");
  return;
#endif
  // Reading a corpus is not part of a model's estimate: a sparse 4 GiB text file under a 700 MB
  // address-space limit (qkv itself starts in under 600 MB) fails while the text is read.
  const fs::path big = fs::temp_directory_path() / ("qkv_budgets_big_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(big).close();
  fs::resize_file(big, uintmax_t{4} << 30);
  const std::string config = std::string(QKV_SOURCE_DIR) + "/configs/tiny.toml";
  const Run r =
      qkv_cli("train --config " + config +
                  sets({"data.path=\"" + big.string() + "\"",
                        "train.out_dir=\"" + (fs::temp_directory_path() / "qkv_budgets_run").string() + "\""}),
              "ulimit -v 700000; ");
  fs::remove(big);
  CHECK(r.rc == 2);
  CHECK(r.err ==
        "qkv: out of memory while running `qkv train`: a memory request failed; `qkv cost --config FILE` "
        "estimates what a config needs\n");
}
