// Faults around the CLI and a training run: two runs on one out_dir, sample
// options out of range, `sample --json` on bytes that are not UTF-8, resuming with a changed
// setting or corpus, a failing metrics.jsonl, and the error JSON every command prints with --json.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "autograd/grad_mode.h"
#include "data/h5.h"
#include "data/input_file.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/optimizer.h"
#include "train/sampler.h"
#include "train/session.h"
#include "train/trainer.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qkv_faults_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const char* const kLines[] = {"the quick brown fox jumps over the lazy dog\n",
                              "pack my box with five dozen liquor jugs\n", "how vexingly quick daft zebras jump\n",
                              "sphinx of black quartz, judge my vow\n"};

// 200 lines; `shift` picks another order of the same lines (the same characters, another corpus).
std::string write_corpus(const std::string& dir, const std::string& name = "corpus.txt", int shift = 0) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += kLines[(i * 7 + shift * (i / 3)) % 4];
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

Config tiny_config(const std::string& dir) {
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.block_size = 16;
  c.data.path = write_corpus(dir);
  c.data.separator = DocSeparator::none;
  c.train.batch_size = 4;
  c.train.max_steps = 10;
  c.train.eval_interval = 5;
  c.train.eval_batches = 2;
  c.train.log_interval = 1;
  c.train.out_dir = dir + "/run";
  return c;
}

std::string write_config(const std::string& dir, const Config& c) {
  const std::string path = dir + "/config.toml";
  std::ofstream(path) << to_toml(c);
  return path;
}

struct CliResult {
  int rc = -1;
  std::string out, err;
  // The last non-empty stdout line, parsed (null when it is not JSON).
  nlohmann::json last_json() const {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    return nlohmann::json::parse(last, nullptr, false);
  }
};

CliResult run_cli(const std::string& args) {
  const std::string base = fs::temp_directory_path() / ("qkv_faults_cli_" + std::to_string(::getpid()));
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv " + args + " >" + base + ".out 2>" + base + ".err";
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  return r;
}

bool have_cli() { return fs::exists(std::string(QKV_BINARY_DIR) + "/qkv"); }

// A child process that holds OUT_DIR/train.lock the way a run does (flock, pid written) until it
// is killed; returns its pid once it holds the lock.
pid_t hold_run_lock(const std::string& dir) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // only async-signal-safe calls from here on
    const std::string path = dir + "/" + train::kRunLockFile;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(3);
    char buf[24];
    int n = 0;
    for (pid_t p = ::getpid(); p > 0; p /= 10) buf[n++] = static_cast<char>('0' + p % 10);
    for (int i = 0; i < n / 2; ++i) std::swap(buf[i], buf[n - 1 - i]);
    if (::ftruncate(fd, 0) != 0 || ::write(fd, buf, static_cast<size_t>(n)) != n) ::_exit(4);
    if (::write(ready[1], "x", 1) != 1) ::_exit(5);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  return pid;
}

}  // namespace

TEST_CASE("a second run on a locked out_dir is refused naming the holder's pid; kill -9 leaves no stale lock",
          "[faults][cli][train]") {
  const std::string dir = temp_dir("lock");
  const Config c = tiny_config(dir);
  fs::create_directories(c.train.out_dir);
  std::ofstream(c.train.out_dir + "/metrics.jsonl") << "{\"step\": 1}\n";  // the other run's log

  const pid_t holder = hold_run_lock(c.train.out_dir);
  try {
    train::run_training(c, {.progress = false});
    FAIL("the run started on a locked out_dir");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("pid " + std::to_string(holder)) != std::string::npos);
    CHECK(msg.find(c.train.out_dir) != std::string::npos);
    CHECK(msg.find("train.out_dir") != std::string::npos);
  }
  // Nothing of the other run was touched: its log is whole, no checkpoint was written.
  CHECK(read_file(c.train.out_dir + "/metrics.jsonl") == "{\"step\": 1}\n");
  CHECK_FALSE(fs::exists(c.train.out_dir + "/best.h5"));

  ::kill(holder, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(holder, &status, 0) == holder);
  // The holder died without unlocking: the lock went with it (the directory holds its run's log,
  // which --overwrite replaces).
  const train::TrainSummary s = train::run_training(c, {.overwrite = true, .progress = false});
  CHECK(s.step == 10);
  CHECK(fs::exists(s.checkpoint));
  CHECK(read_file(c.train.out_dir + "/" + train::kRunLockFile) == std::to_string(::getpid()) + "\n");
  // Released when the run returned: a second run in this process starts.
  CHECK(train::run_training(c, {.overwrite = true, .progress = false}).step == 10);
}

TEST_CASE("two qkv train processes on one out_dir: the second exits 2 naming the first's pid", "[faults][cli][train]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("lock_cli");
  Config c = tiny_config(dir);
  c.train.max_steps = 1000000;  // runs until killed
  const std::string cfg = write_config(dir, c);
  const pid_t first = ::fork();
  REQUIRE(first >= 0);
  if (first == 0) {
    const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(qkv.c_str(), qkv.c_str(), "train", "--config", cfg.c_str(), "--quiet", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait until the first run holds the lock (its pid is in the file) and has logged a step.
  const std::string lock = c.train.out_dir + "/" + train::kRunLockFile;
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    started = read_file(lock) == std::to_string(first) + "\n" && fs::exists(c.train.out_dir + "/metrics.jsonl") &&
              fs::file_size(c.train.out_dir + "/metrics.jsonl") > 0;
    if (!started) ::usleep(100000);
  }
  CHECK(started);
  const CliResult second = run_cli("train --config " + cfg + " --quiet --json --set train.max_steps=5");
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  INFO(second.err);
  CHECK(second.rc == 2);
  CHECK(second.err.find("pid " + std::to_string(first)) != std::string::npos);
  const nlohmann::json j = second.last_json();
  CHECK(j.value("exit", 0) == 2);
  CHECK(j.value("error", "").find("pid " + std::to_string(first)) != std::string::npos);
  CHECK_FALSE(fs::exists(c.train.out_dir + "/ckpt_000005.h5"));  // the refused run wrote nothing

  // After kill -9 the directory is free at once (for a run that replaces the killed one's files).
  const CliResult third = run_cli("train --config " + cfg + " --quiet --json --overwrite --set train.max_steps=5");
  INFO(third.err);
  CHECK(third.rc == 0);
  CHECK(third.last_json().value("step", 0) == 5);
}

TEST_CASE("sample options out of range are refused by name (CLI, exit 2, error JSON)", "[faults][cli][sample]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("sample_opts");
  Config c = tiny_config(dir);
  c.train.max_steps = 2;
  const std::string ckpt = train::run_training(c, {.progress = false}).checkpoint;
  const std::pair<const char*, const char*> bad[] = {{"--temperature -1", "--temperature"},
                                                     {"--temperature nan", "--temperature"},
                                                     {"--temperature inf", "--temperature"},
                                                     {"--top-p -0.5", "--top-p"},
                                                     {"--top-p 1.5", "--top-p"},
                                                     {"--top-p nan", "--top-p"},
                                                     {"--top-p 0", "--top-p"},
                                                     {"--top-k -1", "--top-k"},
                                                     {"--max-new-tokens -5", "--max-new-tokens"},
                                                     {"--seed -1", "--seed"}};
  for (const auto& [opt, name] : bad) {
    const CliResult r = run_cli("sample --checkpoint " + ckpt + " --json " + opt);
    INFO(opt << ": rc " << r.rc << ", stderr " << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find(name) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
    const nlohmann::json j = r.last_json();
    CHECK(j.value("exit", 0) == 2);
    CHECK(j.value("error", "").find(name) != std::string::npos);
  }
  // In range, each explicitly given (0 included, which -1 sentinels used to confuse with unset).
  const CliResult ok = run_cli("sample --checkpoint " + ckpt +
                               " --json --temperature 0 --top-k 0 --top-p 1 --max-new-tokens 0 --seed 0");
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK(ok.last_json()["tokens"].empty());
}

TEST_CASE("generate refuses an infinite or NaN temperature and negative max_new_tokens", "[faults][sample]") {
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 1;
  c.model.n_embd = 8;
  c.model.block_size = 8;
  auto model = train::build_model(c.resolved(), 10);
  model->init_weights(1);
  model->eval();
  train::SampleOptions o;
  o.max_new_tokens = 3;
  o.temperature = INFINITY;
  CHECK_THROWS_WITH(train::generate(*model, {1}, o), Catch::Contains("temperature"));
  o.temperature = NAN;
  CHECK_THROWS_WITH(train::generate(*model, {1}, o), Catch::Contains("temperature"));
  o.temperature = 1.0;
  o.top_p = NAN;
  CHECK_THROWS_WITH(train::generate(*model, {1}, o), Catch::Contains("top_p"));
  o.top_p = 1.0;
  o.max_new_tokens = -5;
  CHECK_THROWS_WITH(train::generate(*model, {1}, o), Catch::Contains("max_new_tokens"));
  o.max_new_tokens = 3;
  CHECK(train::generate(*model, {1}, o).size() == 3);
}

TEST_CASE("[sample] settings out of range in a config are refused naming the key", "[faults][config][sample]") {
  const std::pair<const char*, const char*> bad[] = {{"temperature = -1.0", "sample.temperature"},
                                                     {"temperature = nan", "sample.temperature"},
                                                     {"temperature = inf", "sample.temperature"},
                                                     {"top_p = -0.5", "sample.top_p"},
                                                     {"top_p = 1.5", "sample.top_p"},
                                                     {"top_p = nan", "sample.top_p"},
                                                     {"top_k = -1", "sample.top_k"},
                                                     {"max_new_tokens = -5", "sample.max_new_tokens"}};
  for (const auto& [line, key] : bad) {
    INFO(line);
    CHECK_THROWS_WITH(parse_config_text(std::string("[sample]\n") + line + "\n", "x.toml"),
                      Catch::Contains("x.toml") && Catch::Contains(key));
  }
}

TEST_CASE("sample --json on generated bytes that are not UTF-8: U+FFFD in the text, exact token ids, exit 0",
          "[faults][cli][sample]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("sample_utf8");
  // A byte-tokenizer model that always predicts byte 0xFF (never valid UTF-8): ln_f outputs the
  // constant e_0 and the tied embedding has a 1 in column 0 only for token 255.
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 1;
  c.model.n_embd = 8;
  c.model.block_size = 8;
  c.data.tokenizer = TokenizerKind::byte;
  const ByteTokenizer tok;
  auto model = train::build_model(c.resolved(), tok.vocab_size());
  model->init_weights(1);
  {
    autograd::NoGradGuard no_grad;
    for (const nn::NamedParameter& p : model->named_parameters()) {
      float* v = p.tensor.data<float>();
      const int64_t n = p.tensor.numel();
      auto ends = [&](const char* s) {
        return p.name.size() >= std::strlen(s) && p.name.rfind(s) == p.name.size() - std::strlen(s);
      };
      if (ends("ln_f.weight")) std::fill(v, v + n, 0.0f);
      if (ends("ln_f.bias")) std::fill(v, v + n, 0.0f), v[0] = 1.0f;
      if (ends("wte.weight"))
        for (int64_t t = 0; t < 256; ++t) v[t * 8] = t == 255 ? 10.0f : 0.0f;
    }
  }
  const std::string ckpt = dir + "/ff.h5";
  train::TrainState state;
  train::save_checkpoint(ckpt, c, *model, nullptr, state, tok);

  const CliResult r = run_cli("sample --checkpoint " + ckpt + " --prompt a --max-new-tokens 3 --temperature 0 --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const nlohmann::json j = r.last_json();
  REQUIRE(j.is_object());
  CHECK(j["tokens"] == nlohmann::json({255, 255, 255}));
  CHECK(j["text"].get<std::string>() == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // one U+FFFD per byte
  CHECK(j["prompt"].get<std::string>() == "a");
  // A prompt that is itself not UTF-8 is replaced the same way.
  const CliResult p = run_cli("sample --checkpoint " + ckpt +
                              " --prompt \"$(printf '\\376')\" --max-new-tokens 1 --temperature 0 --json");
  CHECK(p.rc == 0);
  CHECK(p.last_json()["prompt"].get<std::string>() == "\xEF\xBF\xBD");
}

namespace {

// A 10-step run with its checkpoint at step 10; returns the checkpoint's path.
std::string trained_checkpoint(const Config& c) {
  const train::TrainSummary s = train::run_training(c, {.progress = false});
  REQUIRE(s.step == 10);
  return s.checkpoint;
}

}  // namespace

TEST_CASE("resume refuses a changed train.seq_len, data.val_fraction or corpus, naming it", "[faults][train][resume]") {
  const std::string dir = temp_dir("resume_refuse");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  Config r = c;
  r.train.max_steps = 20;
  r.train.out_dir = dir + "/resumed";

  Config seq = r;
  seq.train.seq_len = 8;
  CHECK_THROWS_WITH(train::run_training(seq, {.resume = ckpt, .progress = false}),
                    Catch::Contains("train.seq_len") && Catch::Contains(ckpt));
  Config val = r;
  val.data.val_fraction = 0.2;
  CHECK_THROWS_WITH(train::run_training(val, {.resume = ckpt, .progress = false}),
                    Catch::Contains("data.val_fraction") && Catch::Contains(ckpt));
  // The same lines in another order: the same characters, so the same char tokenizer.
  Config other = r;
  other.data.path = write_corpus(dir, "shuffled.txt", 1);
  REQUIRE(read_file(other.data.path) != read_file(c.data.path));
  CHECK_THROWS_WITH(train::run_training(other, {.resume = ckpt, .progress = false}),
                    Catch::Contains("not the corpus") && Catch::Contains("shuffled.txt"));
  // The same corpus under another name resumes.
  Config moved = r;
  moved.data.path = dir + "/copy.txt";
  fs::copy_file(c.data.path, moved.data.path);
  CHECK(train::run_training(moved, {.resume = ckpt, .progress = false}).step == 20);
}

TEST_CASE("resume from a checkpoint without a corpus fingerprint warns and continues", "[faults][cli][train][resume]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("resume_old");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  // Rewrite it as a checkpoint of an older qkv would be: everything but the fingerprint.
  train::CheckpointMeta meta = train::read_checkpoint_meta(ckpt);
  REQUIRE(meta.state.corpus.has_value());
  meta.state.corpus.reset();
  auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
  train::load_model_weights(ckpt, *model);
  std::vector<train::OptimParam> ps;
  for (const auto& p : model->named_parameters()) ps.push_back({p.name, p.tensor, p.decay && p.tensor.dim() >= 2});
  train::AdamW opt(ps, train::AdamWOptions::from(meta.config.train));
  train::load_optimizer_state(ckpt, opt);
  const std::string old = dir + "/old.h5";
  train::save_checkpoint(old, meta.config, *model, &opt, meta.state, *meta.tokenizer);
  REQUIRE_FALSE(train::read_checkpoint_meta(old).state.corpus.has_value());

  Config r = c;
  r.train.max_steps = 12;
  r.train.out_dir = dir + "/resumed";
  const CliResult res = run_cli("train --config " + write_config(dir, r) + " --quiet --json --resume " + old);
  INFO(res.err);
  CHECK(res.rc == 0);
  CHECK(res.err.find("no corpus fingerprint") != std::string::npos);
  CHECK(res.last_json().value("step", 0) == 12);
  // The checkpoints it writes carry one again.
  CHECK(train::read_checkpoint_meta(r.train.out_dir + "/ckpt_000012.h5").state.corpus.has_value());
}

TEST_CASE("resume with train.max_steps <= the checkpoint's step: nothing to do, exit 0, no NaN",
          "[faults][cli][train][resume]") {
  const std::string dir = temp_dir("resume_done");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  const std::string log = read_file(c.train.out_dir + "/metrics.jsonl");
  for (int64_t max_steps : {10, 4}) {
    Config r = c;
    r.train.max_steps = max_steps;
    const train::TrainSummary s = train::run_training(r, {.resume = ckpt, .progress = false});
    CHECK(s.nothing_to_do);
    CHECK(s.step == 10);
    CHECK(s.checkpoint == ckpt);
    CHECK(std::isfinite(s.best_val_loss));
    CHECK(read_file(c.train.out_dir + "/metrics.jsonl") == log);  // the run directory is untouched
  }
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  Config r = c;
  r.train.max_steps = 5;
  const std::string cfg = write_config(dir, r);
  const CliResult res = run_cli("train --config " + cfg + " --quiet --json --resume " + ckpt);
  INFO(res.err);
  CHECK(res.rc == 0);
  CHECK(res.err.find("nothing to do: checkpoint is at step 10 >= train.max_steps 5") != std::string::npos);
  CHECK(res.out.find("NaN") == std::string::npos);
  CHECK(res.out.find("nan") == std::string::npos);
  const nlohmann::json j = res.last_json();
  CHECK(j.value("step", 0) == 10);
  CHECK(j.value("checkpoint", "") == ckpt);
  const CliResult plain = run_cli("train --config " + cfg + " --quiet --resume " + ckpt);
  CHECK(plain.rc == 0);
  CHECK(plain.out == "nothing to do: checkpoint is at step 10 >= train.max_steps 5\n");
}

TEST_CASE("a failing write to metrics.jsonl stops the run naming the file", "[faults][cli][train]") {
  if (!fs::exists("/dev/full")) {
    WARN("no /dev/full: not checked");
    return;
  }
  const std::string dir = temp_dir("metrics_full");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  const std::string metrics = c.train.out_dir + "/metrics.jsonl";
  fs::remove(metrics);
  fs::create_symlink("/dev/full", metrics);  // the disk fills up under the resumed run
  Config r = c;
  r.train.max_steps = 12;
  CHECK_THROWS_WITH(train::run_training(r, {.resume = ckpt, .progress = false}),
                    Catch::Contains(metrics) && Catch::Contains("cannot write"));
  if (!have_cli()) return;
  const CliResult res = run_cli("train --config " + write_config(dir, r) + " --quiet --json --resume " + ckpt);
  CHECK(res.rc == 2);
  CHECK(res.last_json().value("error", "").find("metrics.jsonl") != std::string::npos);
}

TEST_CASE("a metrics.jsonl over its cap is refused on resume, not read whole", "[faults][cli][train]") {
  const std::string dir = temp_dir("metrics_big");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  const std::string metrics = c.train.out_dir + "/metrics.jsonl";
  fs::resize_file(metrics, kMetricsLogCap + 1);  // sparse: no disk space taken
  Config r = c;
  r.train.max_steps = 12;
  CHECK_THROWS_MATCHES(train::run_training(r, {.resume = ckpt, .progress = false}), Error,
                       Catch::Message(metrics + ": is 1073741825 bytes, over the 1073741824-byte limit for a run's "
                                                "metrics log"));
}

TEST_CASE("train.out_dir belongs to one run: a second run is refused unless --resume from it or --overwrite",
          "[faults][cli][train]") {
  const std::string dir = temp_dir("out_dir_owner");
  const Config c = tiny_config(dir);
  const std::string ckpt = trained_checkpoint(c);
  const std::string metrics = c.train.out_dir + "/metrics.jsonl";
  const std::string log = read_file(metrics), best = read_file(c.train.out_dir + "/best.h5");
  for (const int64_t steps : {10, 4, 20}) {  // the same run, a shorter one, a longer one
    Config again = c;
    again.train.max_steps = steps;
    CHECK_THROWS_WITH(
        train::run_training(again, {.progress = false}),
        Catch::Contains(c.train.out_dir + ": train.out_dir already holds a run") && Catch::Contains("--overwrite"));
  }
  CHECK(read_file(metrics) == log);  // nothing of the finished run was touched
  CHECK(read_file(c.train.out_dir + "/best.h5") == best);
  // A --resume from another run's checkpoint into this directory is refused too.
  Config other = c;
  other.train.out_dir = dir + "/other";
  const std::string other_ckpt = trained_checkpoint(other);
  Config into = c;
  into.train.max_steps = 20;
  CHECK_THROWS_WITH(train::run_training(into, {.resume = other_ckpt, .progress = false}),
                    Catch::Contains("already holds a run"));
  // --overwrite replaces the run: the log holds the new run's rows alone, the old checkpoints go.
  Config shorter = c;
  shorter.train.max_steps = 4;
  shorter.train.eval_interval = 2;
  CHECK(train::run_training(shorter, {.overwrite = true, .progress = false}).step == 4);
  CHECK_FALSE(fs::exists(ckpt));
  std::vector<int64_t> steps;
  std::istringstream rows(read_file(metrics));
  for (std::string line; std::getline(rows, line);) steps.push_back(nlohmann::json::parse(line)["step"]);
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4});
  if (!have_cli()) return;
  const CliResult r = run_cli("train --config " + write_config(dir, c) + " --quiet --json");
  CHECK(r.rc == 2);
  CHECK(r.last_json().value("error", "").find("already holds a run") != std::string::npos);
  CHECK(run_cli("train --config " + write_config(dir, c) + " --quiet --overwrite").rc == 0);
}

TEST_CASE("resume after kill -9: stale temporaries go, metrics.jsonl ends as an uninterrupted run's",
          "[faults][train][resume]") {
  const std::string dir = temp_dir("resume_clean");
  Config c = tiny_config(dir);
  c.train.checkpoint_interval = 5;
  c.train.keep_last = 5;
  // The uninterrupted run.
  Config whole = c;
  whole.train.out_dir = dir + "/whole";
  train::run_training(whole, {.progress = false});
  // The interrupted one: killed after step 10 was logged, while writing a checkpoint, with the
  // newest checkpoint it finished at step 5.
  train::run_training(c, {.progress = false});
  const std::string out = c.train.out_dir;
  fs::remove(out + "/ckpt_000010.h5");
  std::ofstream(out + "/ckpt_000010.h5.tmp.4242.0.17") << "half a checkpoint";
  std::ofstream(out + "/metrics.jsonl", std::ios::app) << R"({"step": 11, "loss": 1.0)";  // a torn last row
  train::run_training(c, {.resume = out + "/ckpt_000005.h5", .progress = false});
  for (const auto& e : fs::directory_iterator(out))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  auto rows = [](const std::string& path) {
    std::vector<std::pair<int64_t, double>> out;  // (step, loss): timings differ between runs
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    }
    return out;
  };
  CHECK(rows(out + "/metrics.jsonl") == rows(whole.train.out_dir + "/metrics.jsonl"));
  CHECK(rows(out + "/metrics.jsonl").size() == 10);
}

TEST_CASE("with --json every failing command ends stdout with {error, exit: 2}", "[faults][cli]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("error_json");
  const std::string missing = dir + "/missing.h5";
  std::ofstream(dir + "/bad.toml") << "[model]\nn_layers = 2\n";
  const std::string cases[] = {
      "train --config " + dir + "/bad.toml",         // bad config key
      "train --config " + dir + "/none.toml",        // no such file
      "sample --checkpoint " + missing,              // no such checkpoint
      "eval --checkpoint " + missing + " --data x",  // no such checkpoint
      "eval",                                        // parse error: required option missing
      "inspect " + missing,
      "leakcheck --checkpoint " + missing,
      "attention-map --checkpoint " + missing + " --text a --layer 0 --head 0 --out " + dir + "/m.png",
      "plot --metrics " + dir + "/none.jsonl --out " + dir + "/l.svg",
      "prepare --input " + dir + "/none.txt --tokenizer char --out " + dir + "/d.h5",
      "bench --config " + dir + "/none.toml",
      "bench --what attention --pattern full --versus-full",    // --versus-full needs a sparse pattern
      "bench --what attention --pattern strided --rounds -1",   // negative rounds
      "gradcheck --no-such-flag",                               // parse error: unknown option
      "sample --checkpoint " + missing + " --temperature abc",  // parse error: not a number
  };
  for (const std::string& args : cases) {
    const CliResult r = run_cli(args + " --json");
    INFO(args << ": rc " << r.rc << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.rc == 2);
    const nlohmann::json j = r.last_json();
    REQUIRE(j.is_object());
    // inspect's verdict on a file it refuses adds "valid": false and the file to the two keys.
    const bool inspect = args.rfind("inspect ", 0) == 0;
    CHECK(j.size() == (inspect ? 4u : 2u));
    if (inspect) CHECK((j.value("valid", true) == false && j.value("checkpoint", "") == missing));
    CHECK(j.value("exit", 0) == 2);
    CHECK_FALSE(j.value("error", "").empty());
    // Without --json no JSON is printed.
    const CliResult plain = run_cli(args);
    CHECK(plain.rc == 2);
    CHECK(plain.out.find("\"error\"") == std::string::npos);
  }
}

TEST_CASE("a command line the parser refuses gets one line naming the word at fault, in argv's order",
          "[faults][cli]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string help = "; `qkv train --help` lists the options";
  const std::pair<std::string, std::string> cases[] = {
      // The misspelt option is named, with its nearest spelling, although --config is then missing.
      {"train --confg a.toml", "unknown option --confg for `qkv train` (did you mean --config?)" + help},
      {"train --config a.toml --overwrit=1",
       "unknown option --overwrit for `qkv train` (did you mean --overwrite?)" + help},
      {"train --confg=a.toml -q --bogus 3", "unknown options --confg, -q, --bogus for `qkv train`" + help},
      // A negative number is a value, not an option.
      {"train --config a.toml extra1 -3 extra2", "unexpected arguments extra1 -3 extra2 for `qkv train`" + help},
      {"train", "--config is required for `qkv train`" + help},
  };
  for (const auto& [args, line] : cases) {
    for (const bool json : {false, true}) {
      const CliResult r = run_cli(args + (json ? " --json" : ""));
      INFO(args << (json ? " --json" : "") << ": rc " << r.rc << "\nstdout: " << r.out << "\nstderr: " << r.err);
      CHECK(r.rc == 2);
      CHECK(r.err == "qkv: " + line + "\n");
      if (json) CHECK(r.last_json() == nlohmann::json{{"error", line}, {"exit", 2}});
      else CHECK(r.out.empty());
    }
  }
  // --help is not an error.
  const CliResult help_run = run_cli("train --help");
  CHECK(help_run.rc == 0);
  CHECK(help_run.out.find("--config") != std::string::npos);
  // Neither is --version: the version pyproject.toml declares, read here from the file.
  std::string version;
  std::istringstream pyproject(read_file(std::string(QKV_SOURCE_DIR) + "/pyproject.toml"));
  for (std::string line; std::getline(pyproject, line);)
    if (version.empty() && line.rfind("version = \"", 0) == 0) version = line.substr(11, line.size() - 12);
  REQUIRE(!version.empty());
  const CliResult version_run = run_cli("--version");
  CHECK(version_run.rc == 0);
  CHECK(version_run.out == "qkv " + version + "\n");
  // No command at all: one line saying so.
  const CliResult bare = run_cli("");
  CHECK(bare.rc == 2);
  CHECK(bare.err == "qkv: a command is required; `qkv --help` lists the commands\n");
  // Options before the command: the line shows the order qkv reads, whatever the options.
  const CliResult early = run_cli("--bogus train --config x.toml");
  CHECK(early.rc == 2);
  CHECK(early.err ==
        "qkv: the command goes first, its options after it: `qkv train --bogus --config x.toml`; `qkv --help` lists "
        "the commands\n");
  CHECK(run_cli("--json sample").err ==
        "qkv: the command goes first, its options after it: `qkv sample --json`; `qkv --help` lists the commands\n");
}

TEST_CASE("qkv prepare --tokenizer reads through kTokenizerKinds: a wrong spelling is exit 2, one line listing them",
          "[faults][cli][prepare]") {
  if (!have_cli()) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  const std::string dir = temp_dir("prepare_kind");
  const std::string corpus = write_corpus(dir);
  const std::string args = "prepare --input " + corpus + " --tokenizer words --out " + dir + "/d.h5";
  const std::string message = "--tokenizer must be char, byte, bpe or gpt2_bpe; got \"words\"";
  const CliResult plain = run_cli(args);
  CHECK(plain.rc == 2);
  CHECK(plain.out.empty());
  CHECK(plain.err == "qkv: " + message + "\n");
  const CliResult json = run_cli(args + " --json");
  CHECK(json.rc == 2);
  CHECK(json.last_json() == nlohmann::json{{"error", message}, {"exit", 2}});
  CHECK_FALSE(fs::exists(dir + "/d.h5"));
  // A spelling from the table prepares, and the file says the same spelling.
  const CliResult ok =
      run_cli("prepare --input " + corpus + " --tokenizer bpe --bpe-vocab-size 300 --out " + dir + "/d.h5 --json");
  REQUIRE(ok.rc == 0);
  CHECK(ok.last_json()["tokenizer"] == "bpe");
  CHECK(h5::File::open(dir + "/d.h5").attr_string("/", "tokenizer") == "bpe");
}

TEST_CASE("output that cannot be written to stdout is exit 2, not success", "[faults][cli]") {
  if (!have_cli() || !fs::exists("/dev/full")) {
    WARN("no qkv binary or no /dev/full: not checked");
    return;
  }
  const std::string dir = temp_dir("stdout_full");
  Config c = tiny_config(dir);
  c.train.max_steps = 2;
  const std::string ckpt = train::run_training(c, {.progress = false}).checkpoint;
  const std::string qkv = std::string(QKV_BINARY_DIR) + "/qkv";
  for (const std::string args :
       {"inspect " + ckpt + " --json", "sample --checkpoint " + ckpt + " --max-new-tokens 3"}) {
    INFO(args);
    const int rc = std::system((qkv + " " + args + " >/dev/full 2>/dev/null").c_str());
    CHECK(WEXITSTATUS(rc) == 2);
    CHECK(WEXITSTATUS(std::system((qkv + " " + args + " >/dev/null 2>/dev/null").c_str())) == 0);
  }
}

TEST_CASE("qkv runs with a short OpenMP barrier spin unless the user chose a wait policy", "[faults][cli]") {
  if (!have_cli()) {
    WARN("no qkv binary: not checked");
    return;
  }
  // `bench --json` reports the environment it measured in, GOMP_SPINCOUNT included (app/main.cpp
  // re-executes qkv once with GOMP_SPINCOUNT=1000 when neither variable is set).
  const std::string bench = "bench --what attention --n 64 --threads 1 --json";
  const auto spin_of = [&](const std::string& env) {
    const std::string base = fs::temp_directory_path() / ("qkv_spin_" + std::to_string(::getpid()));
    const std::string cmd = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + env + " " + std::string(QKV_BINARY_DIR) +
                            "/qkv " + bench + " >" + base + ".out 2>/dev/null";
    REQUIRE(WEXITSTATUS(std::system(cmd.c_str())) == 0);
    CliResult out;
    out.out = read_file(base + ".out");
    const nlohmann::json j = out.last_json();
    REQUIRE(j.contains("environment"));
    return std::make_pair(j["environment"].value("gomp_spincount", "?"),
                          j["environment"].value("omp_wait_policy", "?"));
  };
  CHECK(spin_of("") == std::make_pair(std::string("1000"), std::string("")));
  CHECK(spin_of("GOMP_SPINCOUNT=50") == std::make_pair(std::string("50"), std::string("")));
  CHECK(spin_of("OMP_WAIT_POLICY=active") == std::make_pair(std::string(""), std::string("active")));
}
