// Multi-process data parallelism, end to end: these cases launch
//   mpirun --allow-run-as-root --oversubscribe -np 2 qkv train ...
// on a tiny config and corpus they write themselves, then read the checkpoints back through the
// library. Hidden from the default run ([.]); ctest registers each as "mpi_<tag>" with the label
// "mpi" (tests/CMakeLists.txt) when the build has MPI and an mpirun. Reference values come from
// plain single-process runs of the same binary.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

#ifdef QKV_MPIEXEC
const char* kMpiexec = QKV_MPIEXEC;
#else
const char* kMpiexec = "";
#endif

// Why the MPI cases cannot run here, or "" when they can.
std::string mpi_unavailable() {
#ifndef QKV_WITH_MPI
  return "this build has no MPI (configure with -DQKV_MPI=ON)";
#endif
  if (!*kMpiexec || !fs::exists(kMpiexec)) return "no mpirun found";
  return "";
}

#define SKIP_WITHOUT_MPI()                      \
  do {                                          \
    const std::string why_ = mpi_unavailable(); \
    if (!why_.empty()) {                        \
      WARN("skipped: " << why_);                \
      return;                                   \
    }                                           \
  } while (0)

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qkv_mpi_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A small corpus and a tiny gpt2 config beside it (nothing from shared/).
std::string write_config(const std::string& dir, const std::string& extra_train = "") {
  std::string text;
  const char* lines[] = {"the quick brown fox jumps over the lazy dog\n", "pack my box with five dozen liquor jugs\n",
                         "how vexingly quick daft zebras jump\n", "sphinx of black quartz, judge my vow\n"};
  for (int i = 0; i < 300; ++i) text += lines[(i * 7) % 4];
  std::ofstream(dir + "/corpus.txt") << text;
  const std::string cfg = dir + "/tiny.toml";
  std::ofstream(cfg) << "[model]\nfamily = \"gpt2\"\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 16\n"
                        "dropout = 0.0\n\n[data]\npath = \""
                     << dir << "/corpus.txt\"\ntokenizer = \"char\"\nseparator = \"none\"\n\n"
                     << "[train]\nnumerics = \"standard\"\nbatch_size = 4\nmax_steps = 5\nlr = 3e-3\nmin_lr = 3e-4\n"
                        "warmup_steps = 2\n"
                        "eval_interval = 5\neval_batches = 2\nlog_interval = 1\nthreads = 1\nkeep_last = 10\n"
                     << extra_train;
  return cfg;
}

struct Job {
  int status = -1;
  std::string err;
  double seconds = 0;
};

Job run(const std::string& cmd) {
  static int counter = 0;
  const std::string errfile =
      fs::temp_directory_path() / ("qkv_mpi_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system((cmd + " >/dev/null 2>" + errfile).c_str());
  Job j;
  j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  j.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  std::ifstream in(errfile);
  j.err = std::string(std::istreambuf_iterator<char>(in), {});
  fs::remove(errfile);
  return j;
}

const std::string kQkv = std::string(QKV_BINARY_DIR) + "/qkv";

// `qkv train` on one process (no launcher).
Job train1(const std::string& cfg, const std::string& sets) {
  return run("OMP_NUM_THREADS=1 " + kQkv + " train --quiet --config " + cfg + " " + sets);
}

const std::string kMpirun = std::string(kMpiexec) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 ";

// `qkv train` as an N-rank MPI job.
Job train_ranks(int ranks, const std::string& cfg, const std::string& sets) {
  return run(std::string(kMpiexec) + " --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
             " -x OMP_NUM_THREADS=1 " + kQkv + " train --quiet --config " + cfg + " " + sets);
}

// `qkv train` as a 2-rank MPI job.
Job train2(const std::string& cfg, const std::string& sets) {
  return run(kMpirun + kQkv + " train --quiet --config " + cfg + " " + sets);
}

struct Loaded {
  train::CheckpointMeta meta;
  std::unique_ptr<nn::DecoderModel> model;
  std::vector<nn::NamedParameter> params;
  std::unique_ptr<train::AdamW> opt;
};

Loaded load(const std::string& path) {
  Loaded l;
  l.meta = train::read_checkpoint_meta(path);
  l.model = train::build_model(l.meta.config, l.meta.tokenizer->vocab_size());
  train::load_model_weights(path, *l.model);
  l.params = l.model->named_parameters();
  std::vector<train::OptimParam> ops;
  for (const auto& p : l.params) ops.push_back({p.name, p.tensor, p.decay});
  l.opt = std::make_unique<train::AdamW>(ops, train::AdamWOptions{});
  train::load_optimizer_state(path, *l.opt);
  return l;
}

double largest_abs_diff(const Tensor& a, const Tensor& b) {
  const float *x = a.data<float>(), *y = b.data<float>();
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(static_cast<double>(x[i]) - y[i]));
  return m;
}

double max_param_diff(const Loaded& a, const Loaded& b) {
  REQUIRE(a.params.size() == b.params.size());
  double m = 0;
  for (size_t i = 0; i < a.params.size(); ++i)
    m = std::max(m, largest_abs_diff(a.params[i].tensor, b.params[i].tensor));
  return m;
}

double max_moment_diff(const Loaded& a, const Loaded& b) {
  double m = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    m = std::max(m, largest_abs_diff(a.opt->states()[i].exp_avg, b.opt->states()[i].exp_avg));
    m = std::max(m, largest_abs_diff(a.opt->states()[i].exp_avg_sq, b.opt->states()[i].exp_avg_sq));
  }
  return m;
}

bool bitwise_same(const Loaded& a, const Loaded& b) {
  auto same = [](const Tensor& x, const Tensor& y) {
    return x.numel() == y.numel() && std::memcmp(x.raw_data(), y.raw_data(), x.numel() * 4) == 0;
  };
  for (size_t i = 0; i < a.params.size(); ++i)
    if (!same(a.params[i].tensor, b.params[i].tensor) ||
        !same(a.opt->states()[i].exp_avg, b.opt->states()[i].exp_avg) ||
        !same(a.opt->states()[i].exp_avg_sq, b.opt->states()[i].exp_avg_sq))
      return false;
  return a.opt->step_count() == b.opt->step_count();
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Split invariance (train.numerics = "invariant"): a tiny model of `family` on documents of many
// lengths separated by blank lines, so packed and padded batching have pieces, padding and rows
// with different target counts. Dropout on (both kinds), clipping that bites, 10 steps, G = 8.
std::string write_split_config(const std::string& dir, const std::string& family, const std::string& batching) {
  std::string text;
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "zebras", "vow"};
  for (int d = 0; d < 120; ++d) {
    const int len = 1 + (d * 7) % 13;
    for (int w = 0; w < len; ++w) text += std::string(words[(d * 3 + w * 5) % 11]) + (w + 1 < len ? " " : ".");
    text += "\n\n";
  }
  std::ofstream(dir + "/docs.txt") << text;
  const std::string cfg = dir + "/" + family + "_" + batching + ".toml";
  std::ofstream(cfg) << "[model]\nfamily = \"" << family
                     << "\"\nn_layer = 2\nn_head = 4\nn_kv_head = " << (family == "llama" ? 2 : 4)
                     << "\nn_embd = 32\nblock_size = 16\n"
                     << "dropout = 0.1\nattn_dropout = 0.1\n\n[data]\npath = \"" << dir
                     << "/docs.txt\"\ntokenizer = \"char\"\nseparator = \"blank_line\"\nbatching = \"" << batching
                     << "\"\n"
                     << (batching == "padded_docs" ? "padding_side = \"left\"\n" : "")
                     << "\n[train]\nnumerics = \"invariant\"\nbatch_size = 8\nmax_steps = 10\nlr = 3e-3\n"
                        "min_lr = 3e-4\nwarmup_steps = 2\ngrad_clip = 0.3\neval_interval = 5\neval_batches = 2\n"
                        "log_interval = 1\nthreads = 1\nkeep_last = 10\ncheckpoint_interval = 5\n";
  return cfg;
}

// "--set ..." for a split of G = 8 rows: batch_size x grad_accum per rank, threads, ZeRO, out_dir.
std::string split_sets(int64_t batch, int64_t accum, int threads, int zero, const std::string& out) {
  return "--set train.batch_size=" + std::to_string(batch) + " --set train.grad_accum=" + std::to_string(accum) +
         " --set train.threads=" + std::to_string(threads) + " --set train.zero=" + std::to_string(zero) +
         " --set train.out_dir=" + out;
}

// Every figure a run logs but its timings, line by line.
std::vector<nlohmann::json> logged_figures(const std::string& out) {
  std::vector<nlohmann::json> m = read_metrics(out + "/metrics.jsonl");
  for (auto& row : m)
    for (const char* timing : {"ms_per_step", "tokens_per_s", "comm_ms_per_step"}) row.erase(timing);
  return m;
}

// Checks run `out` against the reference run `ref`: weights, both AdamW moments and every logged
// figure bitwise.
void check_same_run(const std::string& ref, const std::string& out, const std::string& ckpt) {
  INFO(out << " against " << ref);
  CHECK(bitwise_same(load(ref + "/" + ckpt), load(out + "/" + ckpt)));
  const auto a = logged_figures(ref), b = logged_figures(out);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].dump() == b[i].dump());
}

}  // namespace

TEST_CASE(
    "invariant training: every split of 8 rows into batch rows and micro-batches on 1 and 2 threads gives "
    "the same bits",
    "[train][split][long]") {
  const std::string dir = temp_dir("split1");
  for (const auto& [family, batching] : {std::pair{"gpt2", "random_windows"}, std::pair{"llama", "packed_docs"},
                                         std::pair{"gpt2", "padded_docs"}, std::pair{"llama", "random_windows"}}) {
    INFO(family << ", " << batching);
    const std::string cfg = write_split_config(dir, family, batching);
    const std::string base = dir + "/" + family + "_" + batching;
    const Job ref = train1(cfg, split_sets(8, 1, 1, 0, base + "_8x1_t1"));
    INFO(ref.err);
    REQUIRE(ref.status == 0);
    for (const auto& [batch, accum, threads] :
         {std::tuple{8, 1, 2}, std::tuple{4, 2, 1}, std::tuple{2, 4, 2}, std::tuple{1, 8, 1}, std::tuple{1, 8, 2}}) {
      const std::string out =
          base + "_" + std::to_string(batch) + "x" + std::to_string(accum) + "_t" + std::to_string(threads);
      const Job j = run("OMP_NUM_THREADS=" + std::to_string(threads) + " " + kQkv + " train --quiet --config " + cfg +
                        " " + split_sets(batch, accum, threads, 0, out));
      INFO(j.err);
      REQUIRE(j.status == 0);
      check_same_run(base + "_8x1_t1", out, "ckpt_000010.h5");
    }
  }
  // The checks can fail: the standard mode's batched step differs in the last bits between splits.
  const std::string cfg = write_split_config(dir, "gpt2", "random_windows");
  REQUIRE(train1(cfg, split_sets(8, 1, 1, 0, dir + "/std_8x1") + " --set train.numerics=standard").status == 0);
  REQUIRE(train1(cfg, split_sets(4, 2, 1, 0, dir + "/std_4x2") + " --set train.numerics=standard").status == 0);
  CHECK_FALSE(bitwise_same(load(dir + "/std_8x1/ckpt_000010.h5"), load(dir + "/std_4x2/ckpt_000010.h5")));
}

TEST_CASE("invariant training: a run resumed under another split of its global batch continues bit for bit",
          "[train][split][long]") {
  const std::string dir = temp_dir("split_resume");
  const std::string cfg = write_split_config(dir, "llama", "packed_docs");
  REQUIRE(train1(cfg, split_sets(8, 1, 1, 0, dir + "/straight")).status == 0);
  REQUIRE(train1(cfg, split_sets(2, 4, 1, 0, dir + "/first")).status == 0);  // resumed from its step 5
  const Job resumed =
      train1(cfg, split_sets(4, 2, 2, 0, dir + "/second") + " --resume " + dir + "/first/ckpt_000005.h5");
  INFO(resumed.err);
  REQUIRE(resumed.status == 0);
  CHECK(bitwise_same(load(dir + "/straight/ckpt_000010.h5"), load(dir + "/second/ckpt_000010.h5")));
  CHECK(load(dir + "/second/ckpt_000010.h5").meta.state.global_batch_rows == 8);
  const auto straight = logged_figures(dir + "/straight"), second = logged_figures(dir + "/second");
  REQUIRE(second.size() == 5);
  for (size_t i = 0; i < second.size(); ++i) CHECK(second[i].dump() == straight[5 + i].dump());
  // Another global batch is refused, naming both, unless asked for.
  const Job other = train1(cfg, split_sets(4, 1, 1, 0, dir + "/other") + " --resume " + dir + "/first/ckpt_000005.h5");
  CHECK(other.status == 2);
  CHECK_THAT(other.err, Catch::Contains("the global batch is 8 rows in the run being resumed but 4 now (1 process x "
                                        "batch_size 4 x grad_accum 1)"));
  CHECK_FALSE(fs::exists(dir + "/other/ckpt_000010.h5"));
  const Job asked = train1(
      cfg, split_sets(4, 1, 1, 0, dir + "/asked") + " --resume " + dir + "/first/ckpt_000005.h5 --change-global-batch");
  INFO(asked.err);
  CHECK(asked.status == 0);
  CHECK(load(dir + "/asked/ckpt_000010.h5").meta.state.global_batch_rows == 4);
  const Job alone = train1(cfg, split_sets(4, 1, 1, 0, dir + "/alone") + " --change-global-batch");
  CHECK(alone.status == 2);
  CHECK_THAT(alone.err, Catch::Contains("--change-global-batch needs --resume"));
}

TEST_CASE("invariant training: 1, 2 and 4 ranks, with and without ZeRO-1, give the bits of one process",
          "[.][mpi][split]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("split_mpi");
  for (const auto& [family, batching] : {std::pair{"gpt2", "random_windows"}, std::pair{"llama", "packed_docs"}}) {
    INFO(family << ", " << batching);
    const std::string cfg = write_split_config(dir, family, batching);
    const std::string base = dir + "/" + family;
    REQUIRE(train1(cfg, split_sets(8, 1, 1, 0, base + "_ref")).status == 0);
    for (const auto& [ranks, batch, accum, zero] :
         {std::tuple{2, 4, 1, 0}, std::tuple{2, 2, 2, 1}, std::tuple{2, 1, 4, 0}, std::tuple{4, 2, 1, 1},
          std::tuple{4, 1, 2, 0}}) {
      const std::string out = base + "_" + std::to_string(ranks) + "x" + std::to_string(batch) + "x" +
                              std::to_string(accum) + "_z" + std::to_string(zero);
      const Job j = train_ranks(ranks, cfg, split_sets(batch, accum, 1, zero, out));
      INFO(j.err);
      REQUIRE(j.status == 0);
      check_same_run(base + "_ref", out, "ckpt_000010.h5");
    }
  }
  // 5 steps on 2 ranks, then 5 on one process: the 10 straight steps' bits (the schedule's
  // train.max_steps is the same, so the first run goes on to 10; its step-5 checkpoint is resumed).
  const std::string cfg = write_split_config(dir, "gpt2", "padded_docs");
  REQUIRE(train1(cfg, split_sets(8, 1, 1, 0, dir + "/straight")).status == 0);
  REQUIRE(train_ranks(2, cfg, split_sets(4, 1, 1, 1, dir + "/first")).status == 0);  // resumed from its step 5
  const Job resumed =
      train1(cfg, split_sets(2, 4, 1, 0, dir + "/second") + " --resume " + dir + "/first/ckpt_000005.h5");
  INFO(resumed.err);
  REQUIRE(resumed.status == 0);
  CHECK(bitwise_same(load(dir + "/straight/ckpt_000010.h5"), load(dir + "/second/ckpt_000010.h5")));
}

TEST_CASE("2 ranks x batch b train the same model as 1 process x batch 2b", "[.][mpi][dp_equivalence]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("equiv");
  const std::string cfg = write_config(dir);
  const Job ref = train1(cfg, "--set train.batch_size=8 --set train.out_dir=" + dir + "/ref");
  REQUIRE(ref.status == 0);
  const Job half = train1(cfg, "--set train.batch_size=4 --set train.out_dir=" + dir + "/half");
  REQUIRE(half.status == 0);
  const Job dp = train2(cfg, "--set train.batch_size=4 --set train.out_dir=" + dir + "/dp");
  INFO(dp.err);
  REQUIRE(dp.status == 0);

  const Loaded r = load(dir + "/ref/ckpt_000005.h5"), d = load(dir + "/dp/ckpt_000005.h5"),
               h = load(dir + "/half/ckpt_000005.h5");
  const double diff = max_param_diff(r, d), diff_half = max_param_diff(r, h);
  WARN("2 ranks x 4 vs 1 process x 8 after 5 steps: max |param diff| = "
       << diff << " (max |moment diff| = " << max_moment_diff(r, d) << "); 1 process x 4 differs by " << diff_half
       << "; mpirun job " << dp.seconds << " s");
  CHECK(diff < 2e-5);
  // The check can fail: training on half the rows (what both ranks taking the same rows would
  // amount to) moves the weights far more than reduction order does.
  CHECK(diff_half > 100 * std::max(diff, 1e-7));
  CHECK(d.meta.state.tokens_seen == r.meta.state.tokens_seen);  // global tokens, 5 x 8 x 16

  // Rank 0 alone writes the metrics; losses are the global batch's.
  const auto mr = read_metrics(dir + "/ref/metrics.jsonl"), md = read_metrics(dir + "/dp/metrics.jsonl");
  REQUIRE(md.size() == mr.size());
  REQUIRE(md.size() == 5);
  for (size_t i = 0; i < md.size(); ++i) {
    CHECK(md[i]["loss"].get<double>() == Approx(mr[i]["loss"].get<double>()).epsilon(1e-5));
    CHECK(md[i]["grad_norm"].get<double>() == Approx(mr[i]["grad_norm"].get<double>()).epsilon(1e-4));
  }
  CHECK(md.back()["val_loss"].get<double>() == Approx(mr.back()["val_loss"].get<double>()).epsilon(1e-5));
}

TEST_CASE("two 2-rank runs are bitwise identical (dropout, grad accumulation, several buckets, overlap on or off)",
          "[.][mpi][reproducible]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("repro");
  const std::string cfg = write_config(dir, "grad_accum = 2\n");
  const std::string sets = "--set model.dropout=0.1 --set model.attn_dropout=0.1 --set train.out_dir=";
  const std::string small = " --set train.dp_bucket_kb=16";  // ~110 KB of gradients: 7 buckets
  const Job a = run(kMpirun + kQkv + " train --config " + cfg + " " + sets + dir + "/a" + small);
  INFO(a.err);
  REQUIRE(a.status == 0);
  CHECK_THAT(a.err, Catch::Contains("in 7 buckets (mpi, during backward)"));
  const Job b = train2(cfg, sets + dir + "/b" + small);
  REQUIRE(b.status == 0);
  const Loaded la = load(dir + "/a/ckpt_000005.h5"), lb = load(dir + "/b/ckpt_000005.h5");
  CHECK(bitwise_same(la, lb));
  const auto ma = read_metrics(dir + "/a/metrics.jsonl"), mb = read_metrics(dir + "/b/metrics.jsonl");
  REQUIRE(ma.size() == 5);
  REQUIRE(mb.size() == 5);
  for (size_t i = 0; i < ma.size(); ++i) CHECK(ma[i]["loss"].get<double>() == mb[i]["loss"].get<double>());
  // One bucket instead of seven: the same sums, since with two ranks each element's sum is a
  // single addition (commutative, so the same bits whichever rank adds).
  const Job c = train2(cfg, sets + dir + "/c");
  REQUIRE(c.status == 0);
  CHECK(bitwise_same(la, load(dir + "/c/ckpt_000005.h5")));
  // Buckets reduced after backward instead of during it: the same sums, the same bits.
  // (Not --quiet: rank 0's first line says how the keys laid the reduction out.)
  const Job d = run(kMpirun + kQkv + " train --config " + cfg + " " + sets + dir + "/d" + small +
                    " --set train.dp_overlap=false");
  INFO(d.err);
  REQUIRE(d.status == 0);
  CHECK_THAT(d.err, Catch::Contains("in 7 buckets (mpi, after backward)"));
  CHECK(bitwise_same(la, load(dir + "/d/ckpt_000005.h5")));
  // Recomputed blocks write their parameters' gradients from a nested backward, whose hooks start
  // the buckets: the same bits again.
  const Job e = train2(cfg, "--set train.recompute=true " + sets + dir + "/e" + small);
  REQUIRE(e.status == 0);
  CHECK(bitwise_same(la, load(dir + "/e/ckpt_000005.h5")));
}

TEST_CASE("ZeRO-1 trains the same model as plain data parallelism and saves the full optimizer state",
          "[.][mpi][zero1]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("zero");
  const std::string cfg = write_config(dir);
  const std::string small = " --set train.dp_bucket_kb=16";  // slices and buckets cut across tensors
  const Job dp = train2(cfg, "--set train.out_dir=" + dir + "/dp" + small);
  REQUIRE(dp.status == 0);
  const Job z = train2(cfg, "--set train.zero=1 --set train.out_dir=" + dir + "/zero" + small);
  INFO(z.err);
  REQUIRE(z.status == 0);
  const Loaded a = load(dir + "/dp/ckpt_000005.h5"), b = load(dir + "/zero/ckpt_000005.h5");
  const double dparam = max_param_diff(a, b), dmoment = max_moment_diff(a, b);
  WARN("ZeRO-1 vs plain DP after 5 steps: max |param diff| = " << dparam << ", max |moment diff| = " << dmoment
                                                               << (bitwise_same(a, b) ? " (bitwise identical)" : ""));
  CHECK(dparam < 2e-5);
  CHECK(dmoment < 2e-5);
  CHECK(b.opt->step_count() == 5);
  // Every moment was gathered: none is left at its initial zero where plain DP's is not.
  int64_t missing = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const float *va = a.opt->states()[i].exp_avg_sq.data<float>(), *vb = b.opt->states()[i].exp_avg_sq.data<float>();
    for (int64_t k = 0; k < a.params[i].tensor.numel(); ++k) missing += va[k] != 0 && vb[k] == 0;
  }
  CHECK(missing == 0);
}

TEST_CASE("a 2-rank run resumed from its checkpoint ends bitwise where the uninterrupted run ends",
          "[.][mpi][resume]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("resume");
  const std::string cfg = write_config(dir, "checkpoint_interval = 5\n");
  for (const char* zero : {"0", "1"}) {
    INFO("train.zero = " << zero);
    const std::string sets = std::string("--set train.max_steps=10 --set model.dropout=0.1 --set train.zero=") + zero;
    const std::string full = dir + "/full" + zero, resumed = dir + "/resumed" + zero;
    const Job a = train2(cfg, sets + " --set train.out_dir=" + full);
    INFO(a.err);
    REQUIRE(a.status == 0);
    const Job b = train2(cfg, sets + " --set train.out_dir=" + resumed + " --resume " + full + "/ckpt_000005.h5");
    INFO(b.err);
    REQUIRE(b.status == 0);
    CHECK(bitwise_same(load(full + "/ckpt_000010.h5"), load(resumed + "/ckpt_000010.h5")));
    const auto mf = read_metrics(full + "/metrics.jsonl"), mr = read_metrics(resumed + "/metrics.jsonl");
    REQUIRE(mf.size() == 10);
    REQUIRE(mr.size() == 5);
    for (size_t i = 0; i < mr.size(); ++i) CHECK(mr[i]["loss"].get<double>() == mf[5 + i]["loss"].get<double>());
  }
}

TEST_CASE("a rank that dies mid-run ends the job non-zero with the last checkpoint intact", "[.][mpi][fault]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("fault");
  const std::string cfg = write_config(dir, "checkpoint_interval = 3\n");
  // tests/rank_dies_at_step.cpp: `qkv train` whose rank 1 exits (_Exit(1), MPI not finalised)
  // just before step 7.
  const std::string driver = std::string(QKV_BINARY_DIR) + "/tests/qkv_rank_dies_at_step";
  REQUIRE(fs::exists(driver));
  const Job j = run(kMpirun + driver + " 7 " + cfg + " train.max_steps=40 train.out_dir=" + dir + "/run");
  INFO(j.err);
  CHECK(j.status != 0);
  CHECK(j.seconds < 60);  // no hang: the launcher ends rank 0
  CHECK_THAT(j.err, Catch::Contains("rank 1 exits with status 1 before step 7"));
  // Checkpoints are written only between collectives, so the one at step 6 was complete before
  // rank 1 could reach step 7; it loads in full (weights, moments, state).
  REQUIRE(fs::exists(dir + "/run/ckpt_000006.h5"));
  CHECK_FALSE(fs::exists(dir + "/run/ckpt_000009.h5"));
  const Loaded l = load(dir + "/run/ckpt_000006.h5");
  CHECK(l.meta.state.step == 6);
  CHECK(l.opt->step_count() == 6);
  // And training continues from it.
  const Job r = train2(
      cfg, "--set train.max_steps=8 --set train.out_dir=" + dir + "/run2 --resume " + dir + "/run/ckpt_000006.h5");
  CHECK(r.status == 0);
  CHECK(fs::exists(dir + "/run2/ckpt_000008.h5"));
}

TEST_CASE("ranks started with different configs stop with one clear message", "[.][mpi][config_mismatch]") {
  SKIP_WITHOUT_MPI();
  const std::string dir = temp_dir("mismatch");
  const std::string cfg = write_config(dir);
  const std::string train = kQkv + " train --quiet --config " + cfg + " --set train.out_dir=" + dir + "/run";
  const Job j = run(std::string(kMpiexec) + " --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np 1 " + train +
                    " : -np 1 " + train + " --set train.lr=0.01");
  INFO(j.err);
  CHECK(j.status != 0);
  CHECK(j.seconds < 60);
  CHECK_THAT(j.err, Catch::Contains(
                        "rank 0/2: the resolved config (--config and --set) differs across ranks: rank 1 has hash"));
  CHECK_FALSE(fs::exists(dir + "/run/ckpt_000005.h5"));
}
