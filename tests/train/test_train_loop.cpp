// End-to-end training behaviour through the library (train/trainer.h) and the CLI binary.
#include <catch2/catch.hpp>
#include <cctype>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "compare_util.h"
#include "data/dataset.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/model_factory.h"
#include "train/sampler.h"
#include "train/trainer.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qkv_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// A small corpus written next to the run, so tests do not depend on shared/.
std::string write_corpus(const std::string& dir) {
  std::string text;
  const char* lines[] = {"the quick brown fox jumps over the lazy dog\n", "pack my box with five dozen liquor jugs\n",
                         "how vexingly quick daft zebras jump\n", "sphinx of black quartz, judge my vow\n"};
  for (int i = 0; i < 200; ++i) text += lines[(i * 7) % 4];
  const std::string path = dir + "/corpus.txt";
  std::ofstream(path) << text;
  return path;
}

Config tiny_config(const std::string& dir) {
  Config c;
  c.model.family = nn::Family::gpt2;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.block_size = 16;
  c.data.path = write_corpus(dir);
  c.data.tokenizer = TokenizerKind::character;
  c.data.separator = DocSeparator::none;
  c.train.batch_size = 4;
  c.train.max_steps = 20;
  c.train.lr = 3e-3;
  c.train.eval_interval = 10;
  c.train.eval_batches = 2;
  c.train.log_interval = 1;
  c.train.out_dir = dir + "/run";
  c.train.keep_last = 5;
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

int run_cli(const std::string& args, std::string* err = nullptr) {
  const std::string errfile = fs::temp_directory_path() / ("qkv_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv " + args + " >/dev/null 2>" + errfile;
  const int rc = std::system(cmd.c_str());
  if (err) {
    std::ifstream in(errfile);
    *err = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return WEXITSTATUS(rc);
}

}  // namespace

TEST_CASE("training reduces the loss on a tiny corpus", "[train][loop]") {
  const std::string dir = temp_dir("loss");
  Config c = tiny_config(dir);
  c.train.max_steps = 150;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  const auto s = train::run_training(c, {.progress = false});
  const auto m = read_metrics(c.train.out_dir + "/metrics.jsonl");
  REQUIRE(m.size() >= 10);
  const double first = m.front()["loss"].get<double>();
  INFO("first loss " << first << ", last " << s.loss << ", val " << s.val_loss);
  CHECK(first > 2.5);           // ~ln(vocab) at init
  CHECK(s.loss < first - 0.8);  // it learned the character statistics
  CHECK(std::isfinite(s.val_loss));
  CHECK(fs::exists(s.checkpoint));
  CHECK(fs::exists(c.train.out_dir + "/best.h5"));
}

TEST_CASE("train --init-from a checkpoint refuses a model that computes another function", "[train][loop]") {
  const std::string dir = temp_dir("init_from");
  Config c = tiny_config(dir);
  c.train.max_steps = 2;
  c.train.out_dir = dir + "/base";
  const std::string ckpt = train::run_training(c, {.progress = false}).checkpoint;
  // Each setting keeps every tensor's shape, so the weights alone would load.
  const std::pair<const char*, const char*> changes[] = {
      {"model.norm_eps=1e-3", "model.norm_eps is 0.00001 there but 0.001 in this run's config"},
      {"model.activation=gelu", "model.activation is \"gelu_tanh\" there but \"gelu\" in this run's config"},
      {"model.window=4", "model.window is 0 there but 4 in this run's config"},
      {"model.n_head=4", "model.n_head is 2 there but 4 in this run's config"}};
  int i = 0;
  for (const auto& [assignment, message] : changes) {
    Config f = c;
    apply_override(f, assignment);
    f.train.out_dir = dir + "/ft" + std::to_string(i++);
    CHECK_THROWS_MATCHES(train::run_training(f, {.init_from = ckpt, .progress = false}), Error,
                         Catch::Message(ckpt + ": " + message));
  }
  // The same network over other token ids: the corpus upper-cased has as many distinct characters
  // (so the same vocab_size) but its char tokenizer maps them to other ids.
  {
    std::ifstream in(c.data.path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char& ch : text) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    Config u = c;
    u.data.path = dir + "/upper.txt";
    std::ofstream(u.data.path) << text;
    u.train.out_dir = dir + "/upper";
    CHECK_THROWS_MATCHES(train::run_training(u, {.init_from = ckpt, .progress = false}), Error,
                         Catch::Message(ckpt +
                                        ": its tokenizer (char, 29 tokens) is not the one of data.path (char, 29 "
                                        "tokens); tokenize the text with `qkv prepare --tokenizer-from " +
                                        ckpt + "`"));
  }
  // Dropout changes how the model is trained, not its function.
  Config f = c;
  f.model.dropout = 0.1;
  f.train.out_dir = dir + "/dropout";
  CHECK(train::run_training(f, {.init_from = ckpt, .progress = false}).step == 2);
}

namespace {

// 20 steps straight vs 10 steps, a checkpoint, and 10 resumed steps, with dropout on, on `device`:
// the same losses, gradient norms, learning rates, final parameters and AdamW moments, bitwise.
void expect_bitwise_resume(const std::string& device) {
  const std::string dir = temp_dir("resume_" + device);
  Config c = tiny_config(dir);
  apply_override(c, "train.device=" + device);
  c.model.dropout = 0.1;
  c.model.attn_dropout = 0.1;
  c.train.checkpoint_interval = 10;
  c.train.out_dir = dir + "/full";
  train::run_training(c, {.progress = false});
  Config r = c;
  r.train.out_dir = dir + "/resumed";
  train::run_training(r, {.resume = dir + "/full/ckpt_000010.h5", .progress = false});

  const auto full = read_metrics(dir + "/full/metrics.jsonl");
  const auto resumed = read_metrics(dir + "/resumed/metrics.jsonl");
  REQUIRE(full.size() == 20);
  REQUIRE(resumed.size() == 10);
  for (size_t i = 0; i < resumed.size(); ++i) {
    CHECK(resumed[i]["step"] == full[10 + i]["step"]);
    CHECK(resumed[i]["loss"].get<double>() == full[10 + i]["loss"].get<double>());
    CHECK(resumed[i]["grad_norm"].get<double>() == full[10 + i]["grad_norm"].get<double>());
    CHECK(resumed[i]["lr"].get<double>() == full[10 + i]["lr"].get<double>());
  }
  // Final weights and moments bitwise equal.
  auto meta = train::read_checkpoint_meta(dir + "/full/ckpt_000020.h5");
  auto a = train::build_model(meta.config, meta.tokenizer->vocab_size());
  auto b = train::build_model(meta.config, meta.tokenizer->vocab_size());
  train::load_model_weights(dir + "/full/ckpt_000020.h5", *a);
  train::load_model_weights(dir + "/resumed/ckpt_000020.h5", *b);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].tensor.to_vector() == pb[i].tensor.to_vector());
  std::vector<train::OptimParam> oa, ob;
  for (auto& p : pa) oa.push_back({p.name, p.tensor, p.decay});
  for (auto& p : pb) ob.push_back({p.name, p.tensor, p.decay});
  train::AdamW opt_a(oa, {}), opt_b(ob, {});
  train::load_optimizer_state(dir + "/full/ckpt_000020.h5", opt_a);
  train::load_optimizer_state(dir + "/resumed/ckpt_000020.h5", opt_b);
  CHECK(opt_a.step_count() == 20);
  CHECK(opt_b.step_count() == 20);
  for (size_t i = 0; i < pa.size(); ++i) {
    CHECK(opt_a.states()[i].exp_avg.to_vector() == opt_b.states()[i].exp_avg.to_vector());
    CHECK(opt_a.states()[i].exp_avg_sq.to_vector() == opt_b.states()[i].exp_avg_sq.to_vector());
  }
}

}  // namespace

TEST_CASE("resume continues bitwise: same losses, parameters and optimizer state", "[train][resume][exact]") {
  expect_bitwise_resume("cpu");
}

TEST_CASE("on the GPU, resume continues bitwise", "[train][resume][cuda]") {
  if (!test::cuda_device_present()) return;
  expect_bitwise_resume("cuda");
}

namespace {

// A run's final parameters and both AdamW moments, in one vector.
std::vector<double> final_state(const std::string& ckpt) {
  auto meta = train::read_checkpoint_meta(ckpt);
  auto model = train::build_model(meta.config, meta.tokenizer->vocab_size());
  train::load_model_weights(ckpt, *model);
  std::vector<train::OptimParam> op;
  for (auto& p : model->named_parameters()) op.push_back({p.name, p.tensor, p.decay});
  train::AdamW opt(op, {});
  train::load_optimizer_state(ckpt, opt);
  std::vector<double> out;
  for (size_t i = 0; i < op.size(); ++i)
    for (const Tensor& t : {op[i].param, opt.states()[i].exp_avg, opt.states()[i].exp_avg_sq}) {
      const std::vector<double> v = t.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

}  // namespace

TEST_CASE("on the GPU, invariant training gives the same bits for every split of its global batch",
          "[train][split][cuda]") {
  if (!test::cuda_device_present()) return;
  // G = 4 rows as 4 x 1, 2 x 2 and 1 x 4 (batch_size x grad_accum), dropout on, clipping that
  // bites: the row tree sums the rows' gradients on the device.
  const std::string dir = temp_dir("split_cuda");
  Config c = tiny_config(dir);
  apply_override(c, "train.device=cuda");
  c.model.dropout = 0.1;
  c.model.attn_dropout = 0.1;
  c.train.grad_clip = 0.3;
  c.train.max_steps = 3;
  c.train.eval_interval = 3;
  c.train.eval_batches = 1;
  const auto run = [&](int64_t batch, int64_t accum, const std::string& numerics) {
    Config r = c;
    apply_override(r, "train.numerics=" + numerics);
    r.train.batch_size = batch;
    r.train.grad_accum = accum;
    r.train.out_dir = dir + "/" + numerics + std::to_string(batch) + "x" + std::to_string(accum);
    train::run_training(r, {.progress = false});
    return r.train.out_dir;
  };
  const std::string ref = run(4, 1, "invariant");
  const std::vector<double> want = final_state(ref + "/ckpt_000003.h5");
  const auto logged = [](const std::string& out) {
    std::vector<std::string> lines;
    for (auto row : read_metrics(out + "/metrics.jsonl")) {
      for (const char* timing : {"ms_per_step", "tokens_per_s", "comm_ms_per_step"}) row.erase(timing);
      lines.push_back(row.dump());
    }
    return lines;
  };
  for (const auto& [batch, accum] : {std::pair{2, 2}, std::pair{1, 4}}) {
    CAPTURE(batch, accum);
    const std::string out = run(batch, accum, "invariant");
    CHECK(final_state(out + "/ckpt_000003.h5") == want);
    CHECK(logged(out) == logged(ref));
  }
  // The check can fail: the standard mode's batched step differs between splits.
  CHECK(final_state(run(4, 1, "standard") + "/ckpt_000003.h5") !=
        final_state(run(2, 2, "standard") + "/ckpt_000003.h5"));
}

TEST_CASE("sampling with and without the KV cache draws the same tokens", "[train][sample]") {
  const std::string dir = temp_dir("sample");
  Config c = tiny_config(dir);
  const auto s = train::run_training(c, {.progress = false});
  auto meta = train::read_checkpoint_meta(s.checkpoint);
  auto model = train::build_model(meta.config, meta.tokenizer->vocab_size());
  train::load_model_weights(s.checkpoint, *model);
  model->eval();
  const std::vector<int32_t> prompt = meta.tokenizer->encode("the ");
  for (double temperature : {0.0, 1.0}) {
    train::SampleOptions o;
    o.max_new_tokens = 30;  // prompt + 30 > block_size 16: also covers the cropped-context path
    o.temperature = temperature;
    o.top_k = 10;
    o.seed = 7;
    o.kv_cache = true;
    const auto cached = train::generate(*model, prompt, o);
    o.kv_cache = false;
    const auto full = train::generate(*model, prompt, o);
    CHECK(cached == full);
    CHECK(cached.size() == 30);
  }
}

TEST_CASE("top-k and top-p restrict the draw to the most likely tokens", "[train][sample]") {
  const float logits[5] = {0.0f, 3.0f, 1.0f, 2.0f, -1.0f};
  train::SampleOptions o;
  o.temperature = 1.0;
  o.top_k = 2;  // only tokens 1 and 3 may be drawn
  for (double u = 0.0; u < 1.0; u += 0.01) {
    const int32_t t = train::pick_token(logits, 5, o, u);
    CHECK((t == 1 || t == 3));
  }
  o.top_k = 0;
  o.top_p = 0.5;  // p(token 1) = e^3/sum ≈ 0.64 > 0.5: the nucleus is token 1 alone
  for (double u = 0.0; u < 1.0; u += 0.05) CHECK(train::pick_token(logits, 5, o, u) == 1);
  o.temperature = 0;
  CHECK(train::pick_token(logits, 5, o, 0.99) == 1);
}

TEST_CASE("on_log sees every metrics line and stops the run after the step it returns false on", "[train][loop]") {
  const std::string dir = temp_dir("on_log");
  Config c = tiny_config(dir);
  c.train.max_steps = 8;
  c.train.checkpoint_interval = 100;  // only the stop writes one
  std::vector<nlohmann::json> seen;
  train::TrainOptions o{.progress = false};
  o.on_log = [&](const nlohmann::json& m) {
    seen.push_back(m);
    return m["step"].get<int64_t>() < 3;
  };
  const auto s = train::run_training(c, o);
  CHECK(s.stopped);
  CHECK(s.step == 3);
  CHECK(s.checkpoint == c.train.out_dir + "/ckpt_000003.h5");
  CHECK(fs::exists(s.checkpoint));
  CHECK(seen == read_metrics(c.train.out_dir + "/metrics.jsonl"));  // the lines as written
  REQUIRE(seen.size() == 3);
  CHECK(s.loss == seen.back()["loss"].get<double>());
  CHECK(train::read_checkpoint_meta(s.checkpoint).state.step == 3);

  // Returning true throughout changes nothing: the run ends at max_steps, not stopped.
  const std::string dir2 = temp_dir("on_log_all");
  Config c2 = tiny_config(dir2);
  c2.train.max_steps = 4;
  int64_t calls = 0;
  train::TrainOptions all{.progress = false};
  all.on_log = [&](const nlohmann::json&) { return ++calls > 0; };
  const auto s2 = train::run_training(c2, all);
  CHECK_FALSE(s2.stopped);
  CHECK(s2.step == 4);
  CHECK(calls == 4);
}

TEST_CASE("non-finite gradients skip steps and stop the run after max_bad_steps", "[train][loop]") {
  const std::string dir = temp_dir("nan");
  Config c = tiny_config(dir);
  c.train.lr = 1e30;  // the first update overflows the weights: every later loss is non-finite
  c.train.lr_schedule = train::LrScheduleKind::constant;
  c.train.grad_clip = 0;
  c.train.max_bad_steps = 3;
  CHECK_THROWS_WITH(train::run_training(c, {.progress = false}), Catch::Contains("non-finite steps in a row"));
}

TEST_CASE("the CLI rejects bad input with one line and exit status 2", "[train][cli]") {
  const std::string dir = temp_dir("cli");
  const std::string corpus = write_corpus(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string p = dir + "/" + name;
    std::ofstream(p) << text;
    return p;
  };
  const std::string base = "[data]\npath = \"" + corpus + "\"\n[train]\nmax_steps = 2\nout_dir = \"" + dir + "/r\"\n";
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"train --config " + write("unknown.toml", "[model]\nn_layers = 2\n" + base), "unknown key model.n_layers"},
      {"train --config " + write("type.toml", "[model]\nn_head = \"four\"\n" + base),
       "model.n_head must be an integer"},
      {"train --config " + write("div.toml", "[model]\nn_embd = 30\nn_head = 4\n" + base), "n_embd"},
      {"train --config " + write("gqa.toml", "[model]\nn_head = 4\nn_kv_head = 3\n" + base), "n_kv_head"},
      {"train --config " + dir + "/missing.toml", "missing.toml"},
      {"train --config " + write("nodata.toml", "[data]\npath = \"" + dir + "/nope.txt\"\n"), "nope.txt"},
      {"train --config " +
           write("short.toml", "[model]\nblock_size = 64\n[data]\npath = \"" + write("short.txt", "abc") + "\"\n"),
       "short.txt"},
      {"sample --checkpoint " + dir + "/none.h5", "none.h5"},
      {"sample --checkpoint " + dir + "/none.h5 --device tpu", "--device must be cpu or cuda; got \"tpu\""},
      {"eval --checkpoint " + write("notckpt.h5", "garbage") + " --data " + corpus, "notckpt.h5"},
  };
  std::vector<Case> all = cases;
  // Only where no GPU is visible (CI): asking for one is refused before any work.
  if (cuda::device_count() == 0)
    all.push_back(
        {"train --config " + write("gpu.toml", base) + " --set train.device=cuda", "no CUDA device is visible"});
  for (const auto& c : all) {
    std::string err;
    const int rc = run_cli(c.args, &err);
    INFO(c.args << "\n-> " << err);
    CHECK(rc == 2);
    CHECK(err.find(c.expect) != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);  // one line
  }
}

TEST_CASE("eval scores consecutive windows and prints the pinned JSON", "[train][cli]") {
  const std::string dir = temp_dir("eval");
  Config c = tiny_config(dir);
  c.train.max_steps = 5;
  const auto s = train::run_training(c, {.progress = false});
  const std::string out = dir + "/eval.json";
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv eval --checkpoint " + s.checkpoint + " --data " +
                          c.data.path + " --json 2>/dev/null | tail -n 1 > " + out;
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  // 200 lines of the corpus; windows of block_size + 1 = 17 tokens, targets 16 per window.
  const int64_t n_tokens = static_cast<int64_t>(read_text_file(c.data.path).size());
  CHECK(j["tokens"].get<int64_t>() == n_tokens / 17 * 16);
  CHECK(std::fabs(j["perplexity"].get<double>() - std::exp(j["loss"].get<double>())) < 1e-9);

  // --per-token on ids: one entry per target, the loss their negated mean, the same bits as
  // train::score_tokens on the checkpoint's model.
  const std::string per = dir + "/per.json";
  const std::string cmd2 = std::string(QKV_BINARY_DIR) + "/qkv eval --checkpoint " + s.checkpoint +
                           " --ids 3,1,4,1,5,9,2,6 --per-token --numerics invariant --json 2>/dev/null | tail -n 1 > " +
                           per;
  REQUIRE(std::system(cmd2.c_str()) == 0);
  std::ifstream in2(per);
  const auto p = nlohmann::json::parse(in2);
  const auto lp = p["per_token"]["logprob"].get<std::vector<double>>();
  CHECK(p["per_token"]["index"].get<std::vector<int64_t>>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
  CHECK(p["per_token"]["token"].get<std::vector<int32_t>>() == std::vector<int32_t>{1, 4, 1, 5, 9, 2, 6});
  double sum = 0;
  for (double v : lp) sum -= v;
  CHECK(p["loss"].get<double>() == Approx(sum / 7).epsilon(1e-12));
  const auto meta = train::read_checkpoint_meta(s.checkpoint);
  auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
  train::load_model_weights(s.checkpoint, *model);
  model->eval();
  const NumericsGuard inv(Numerics::invariant);
  CHECK(train::score_tokens(*model, std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6}, "ids").logprob == lp);
}

TEST_CASE("resume refuses a changed model setting or seed, naming the key and both values", "[train][resume]") {
  const std::string dir = temp_dir("resume_names_key");
  Config c = tiny_config(dir);
  c.train.max_steps = 2;
  const train::TrainSummary s = train::run_training(c, {.progress = false});
  REQUIRE(s.step == 2);
  Config r = c;
  r.train.max_steps = 4;
  r.train.out_dir = dir + "/resumed";
  // Used to be "[model] settings differ from the run being resumed", naming no key.
  Config drop = r;
  drop.model.dropout = 0.25;
  CHECK_THROWS_WITH(train::run_training(drop, {.resume = s.checkpoint, .progress = false}),
                    Catch::Contains(s.checkpoint + ": model.dropout is 0.0 in the run being resumed but 0.25 now"));
  Config seed = r;
  seed.train.seed = 7;
  CHECK_THROWS_WITH(train::run_training(seed, {.resume = s.checkpoint, .progress = false}),
                    Catch::Contains("train.seed is 1337 in the run being resumed but 7 now"));
  // Settings outside the list (lr) may change; the resumed run continues.
  Config lr = r;
  lr.train.lr = 1e-3;
  CHECK(train::run_training(lr, {.resume = s.checkpoint, .progress = false}).step == 4);
}
