// Whole-model gradient check (analysis/model_gradcheck.h, `qkv gradcheck --config`): it passes on
// every shipped config shrunk with --set and on every model option (family, positions, GQA, window,
// dropout, norms, activations, kernels, batching), it fails — naming the tensor — on a model whose
// attention backward is 1% wrong in dK, and on a loss that is not a deterministic function, and the
// command keeps the op mode's JSON shape and exit statuses.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "analysis/model_gradcheck.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

std::string source_path(const std::string& rel) { return std::string(QKV_SOURCE_DIR) + "/" + rel; }

// --set overrides that shrink a shipped config to a model checked in about a second: `layers`
// blocks, 4 channels per head (an even head size, for RoPE), 16 positions, the batch's sequence at
// the block size, and a 64-token vocabulary where the config fixes one (else the tokenizer's stand-in).
std::vector<std::string> shrink(const std::string& path, int layers) {
  const Config c = parse_config(path);
  std::vector<std::string> sets = {"model.n_layer=" + std::to_string(layers),
                                   "model.n_embd=" + std::to_string(4 * c.model.n_head), "model.block_size=16",
                                   "train.seq_len=0"};
  if (c.model.vocab_size > 0) sets.push_back("model.vocab_size=64");
  return sets;
}

analysis::ConfigGradcheck check_config(const std::string& path, std::vector<std::string> sets,
                                       const analysis::ModelGradcheckOptions& opt = {},
                                       std::shared_ptr<const nn::AttentionOps> ops = nullptr) {
  return analysis::run_config_gradcheck(parse_config(path, sets), opt, std::move(ops));
}

double worst_rel(const analysis::ModelGradcheckReport& r) {
  double w = 0;
  for (const auto& d : r.directions) w = std::max(w, d.rel_err);
  for (const auto& p : r.params) w = std::max(w, p.max_rel_err);
  return w;
}
double worst_abs(const analysis::ModelGradcheckReport& r) {
  double w = 0;
  for (const auto& d : r.directions) w = std::max(w, d.abs_err);
  for (const auto& p : r.params) w = std::max(w, p.max_abs_err);
  return w;
}

// What every passing run must show besides `pass`: a deterministic loss near log V (a fresh
// model), every parameter tensor checked, gradients that are not trivially zero, and errors at
// the float64 finite-difference level (the tolerance is 1e-8 + 1e-5 |numeric|; a correct
// backward measures ~1e-9 absolute at worst).
void require_clean(const analysis::ConfigGradcheck& c, const std::string& what) {
  INFO(what << ": loss " << c.report.loss << ", worst abs " << worst_abs(c.report) << ", worst rel "
            << worst_rel(c.report) << ", retried " << c.report.retried);
  for (const auto& p : c.report.params) {
    INFO(p.name << ": max_abs_err " << p.max_abs_err << " max_rel_err " << p.max_rel_err);
    CHECK(p.pass);
  }
  for (const auto& d : c.report.directions) {
    INFO("direction: analytic " << d.analytic << " numeric " << d.numeric);
    CHECK(d.pass);
  }
  CHECK(c.report.pass);
  CHECK(c.report.deterministic);
  CHECK(c.report.loss == c.report.loss_again);
  CHECK(std::fabs(c.report.loss - std::log(static_cast<double>(c.model.vocab_size))) < 0.5);
  CHECK(static_cast<int64_t>(c.report.params.size()) == c.parameter_tensors);
  CHECK(c.report.directions.size() == 4);
  CHECK(worst_abs(c.report) < 5e-9);
  int64_t nonzero = 0, elements = 0;
  for (const auto& p : c.report.params)
    for (const auto& e : p.elements) {
      ++elements;
      nonzero += std::fabs(e.analytic) > 1e-7;
    }
  CHECK(nonzero * 2 > elements);
  for (const auto& d : c.report.directions) CHECK(std::fabs(d.analytic) > 1e-5);
}

std::vector<std::string> shipped_configs() {
  std::vector<std::string> out;
  for (const char* dir : {"configs", "configs/bench"})
    for (const auto& e : fs::directory_iterator(source_path(dir)))
      if (e.path().extension() == ".toml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Identity forward, gradient times `s` backward: a backward that is wrong by a known factor.
struct ScaleGradBackward : autograd::Node {
  double s = 1;
  const char* name() const override { return "ScaleGradBackward"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {mul(g, s)}; }
};
Tensor scale_grad(const Tensor& x, double s) {
  auto node = std::make_shared<ScaleGradBackward>();
  node->s = s;
  return autograd::record(x.detach(), node, {x});
}

// The library's attention with a correct forward and dK scaled by 1.01 (both layouts: separate
// q, k, v and gpt2's packed projection).
class WrongKeyGradient : public nn::AttentionOps {
 public:
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& o) const override {
    return nn::AttentionOps::attention(q, scale_grad(k, 1.01), v, o);
  }
  Tensor attention_packed(const Tensor& qkv, int64_t hq, int64_t hkv, const attn::AttentionOptions& o) const override {
    auto heads = [&](int64_t start, int64_t len) { return ag::transpose(ag::narrow(qkv, 2, start, len), 1, 2); };
    const Tensor y = attention(heads(0, hq), heads(hq, hkv), heads(hq + hkv, hkv), o);
    return ag::contiguous(ag::transpose(y, 1, 2));
  }
};

// Attention dropout with a new mask on every call: the loss is no function of θ.
class FreshDropoutMasks : public nn::AttentionOps {
 public:
  attn::AttentionOptions options(attn::AttentionOptions o, const nn::ModelConfig&, bool,
                                 nn::RngContext&) const override {
    o.dropout_p = 0.1;
    o.dropout_seed = 7;
    o.dropout_offset = static_cast<uint64_t>(++calls_) << 40;
    return o;
  }

 private:
  mutable std::atomic<int> calls_{0};
};

std::set<std::string> failing(const analysis::ModelGradcheckReport& r) {
  std::set<std::string> out;
  for (const auto& p : r.params)
    if (!p.pass) out.insert(p.name);
  return out;
}

}  // namespace

TEST_CASE("model gradcheck passes on shipped configs shrunk with --set", "[gradcheck][model]") {
  for (const char* rel : {"configs/tiny.toml", "configs/llama_tiny.toml"}) {
    const std::string path = source_path(rel);
    const auto c = check_config(path, shrink(path, 1));
    require_clean(c, rel);
    CHECK(c.model.n_layer == 1);
    CHECK(c.attention_kernel.rfind("fused", 0) == 0);  // the fused kernel has float64 tiles
    CHECK(c.batch.x.size(0) == 2);
    CHECK(c.batch.x.size(1) == 16);
  }
}

TEST_CASE("model gradcheck passes on every shipped config shrunk with --set", "[gradcheck][model][slow]") {
  const auto configs = shipped_configs();
  REQUIRE(configs.size() >= 9);
  for (const auto& path : configs) {
    const auto c = check_config(path, shrink(path, 2));
    std::printf("model gradcheck %-40s loss %.4f worst abs %.2e worst rel %.2e retried %lld\n",
                fs::path(path).lexically_relative(source_path("")).string().c_str(), c.report.loss, worst_abs(c.report),
                worst_rel(c.report), static_cast<long long>(c.report.retried));
    require_clean(c, path);
  }
}

namespace {
// Model options over configs/tiny.toml (gpt2, GQA 4:2), one or two blocks, small sizes.
const std::vector<std::vector<std::string>> kVariants = {
    {"model.position=rope", "model.window=5", "model.dropout=0.1", "model.attn_dropout=0.1"},
    {"model.position=alibi", "data.batching=padded_docs", "data.padding_side=left"},
    {"model.position=sinusoidal", "data.batching=packed_docs", "model.attn_kernel=reference", "train.recompute=true",
     "model.dropout=0.2"},
    {"model.family=llama", "model.n_head=4", "model.n_kv_head=1", "model.attn_dropout=0.2", "model.window=3"},
    {"model.position=none", "model.n_kv_head=1", "model.activation=gelu"},
    {"model.activation=swiglu", "model.norm=rmsnorm", "model.bias=false", "model.tie_embeddings=false"},
    {"model.activation=relu", "data.batching=padded_docs"},
    {"model.family=llama", "model.position=learned", "data.batching=packed_docs", "model.norm=layernorm",
     "model.bias=true"},
    {"model.family=llama", "model.position=alibi", "model.activation=gelu_tanh", "model.tie_embeddings=true",
     "model.attn_kernel=reference", "model.attn_dropout=0.1"},
    {"model.family=llama", "model.position=sinusoidal", "train.recompute=true", "data.batching=padded_docs"},
};
}  // namespace

TEST_CASE(
    "model gradcheck passes for every position scheme, GQA, window, dropout, norm, activation, kernel and batching",
    "[gradcheck][model]") {
  const std::string path = source_path("configs/tiny.toml");
  for (size_t i = 0; i < kVariants.size(); ++i) {
    std::vector<std::string> sets = {"model.n_layer=1", "model.n_embd=16", "model.block_size=12",
                                     "model.vocab_size=40"};
    sets.insert(sets.end(), kVariants[i].begin(), kVariants[i].end());
    std::string what;
    for (const auto& s : kVariants[i]) what += s + " ";
    const auto c = check_config(path, sets, {});
    require_clean(c, what);
    // the kernel named is the kernel whose backward was checked (recomputed blocks hide their graph)
    if (c.model.attn_kernel == attn::Kernel::reference) {
      CHECK(c.attention_kernel.rfind("reference", 0) == 0);
      CHECK(c.report.attention_nodes.empty());
    } else if (!c.model.recompute) {
      CHECK(c.attention_kernel.rfind("fused", 0) == 0);
      const bool packed = c.model.family == nn::Family::gpt2 && c.model.position != nn::Position::rope;
      CHECK(c.report.attention_nodes ==
            std::vector<std::string>{packed ? "PackedAttentionBackward" : "FusedAttentionBackward"});
    }
    if (c.model.dropout > 0 || c.model.attn_dropout > 0) CHECK(c.report.deterministic);
  }
}

TEST_CASE("model gradcheck builds float64 end to end and restores the parameters bit for bit", "[gradcheck][model]") {
  const Config cfg = parse_config(
      source_path("configs/tiny.toml"),
      {"model.n_layer=1", "model.n_embd=16", "model.vocab_size=40", "model.position=sinusoidal", "model.dropout=0.1"});
  const auto model = analysis::build_float64_model(train::model_config(cfg, 1), 3);
  std::vector<std::vector<double>> before;
  for (const auto& p : model->named_parameters()) {
    CHECK(p.tensor.dtype() == DType::f64);
    before.push_back(p.tensor.to_vector());
  }
  const Batch b = analysis::gradcheck_batch(BatchMode::random_windows, Padding::right, 2, 8, 40, 5);
  nn::ForwardArgs args;
  args.ids = b.x;
  CHECK(model->forward(args).dtype() == DType::f64);
  const auto rep = analysis::run_model_gradcheck(*model, b, nn::RngContext{5, 0, 0}, {});
  CHECK(rep.pass);
  const auto params = model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    CHECK(params[i].tensor.to_vector() == before[i]);
    CHECK(params[i].tensor.grad().dtype() == DType::f64);
  }
  // 1 recorded + 1 repeat + 2 per direction + 2 per element (no retries on this smooth model)
  int64_t elements = 0;
  for (const auto& p : rep.params) elements += static_cast<int64_t>(p.elements.size());
  CHECK(rep.retried == 0);
  CHECK(rep.evaluations == 2 + 2 * 4 + 2 * elements);
}

TEST_CASE("model gradcheck fails on a 1% wrong dK and names the tensors it reaches", "[gradcheck][model]") {
  const std::string path = source_path("configs/llama_tiny.toml");
  // (the same model with the library's ops passes: "model gradcheck passes on shipped configs ...")
  const auto c = check_config(path, shrink(path, 1), {}, std::make_shared<WrongKeyGradient>());
  CHECK_FALSE(c.report.pass);
  CHECK(c.report.deterministic);  // the forward is the library's
  const std::set<std::string> fails = failing(c.report);
  // dK reaches the key projection and, upstream of it, the first norm and the embedding; the query,
  // value and output projections, the MLP, the final norm and the head never see it.
  CHECK(fails.count("model.layers.0.self_attn.k_proj.weight") == 1);
  const std::set<std::string> reachable = {"model.layers.0.self_attn.k_proj.weight",
                                           "model.layers.0.input_layernorm.weight", "model.embed_tokens.weight"};
  for (const auto& f : fails) {
    INFO(f);
    CHECK(reachable.count(f) == 1);
  }
  for (const auto& p : c.report.params) {
    if (p.name != "model.layers.0.self_attn.k_proj.weight") continue;
    // every element of W_k reaches the loss through K only: analytic = 1.01 numeric exactly, so
    // the relative error is 0.01 / 1.01 up to the finite-difference noise (~1e-10 absolute)
    CHECK(p.max_rel_err == Approx(0.01 / 1.01).epsilon(1e-3));
    for (const auto& e : p.elements) {
      CHECK(e.step == 1e-5);  // a failing comparison reports its error at eps
      CHECK(e.analytic == Approx(1.01 * e.numeric).margin(1e-9));
    }
  }

  // gpt2: the packed path (q, k, v read from one c_attn projection); the key rows of c_attn fail.
  const std::string tiny = source_path("configs/tiny.toml");
  analysis::ModelGradcheckOptions opt;
  opt.elements = 16;
  const auto g = check_config(tiny, shrink(tiny, 1), opt, std::make_shared<WrongKeyGradient>());
  CHECK_FALSE(g.report.pass);
  CHECK(failing(g.report).count("transformer.h.0.attn.c_attn.weight") == 1);
  CHECK(failing(g.report).count("transformer.h.0.attn.c_proj.weight") == 0);
  CHECK(failing(g.report).count("transformer.h.0.mlp.c_fc.weight") == 0);
}

TEST_CASE("model gradcheck fails when the loss is not a deterministic function of the parameters",
          "[gradcheck][model]") {
  const std::string path = source_path("configs/tiny.toml");
  const auto c = check_config(path, shrink(path, 1), {}, std::make_shared<FreshDropoutMasks>());
  CHECK_FALSE(c.report.deterministic);
  CHECK(c.report.loss != c.report.loss_again);
  CHECK_FALSE(c.report.pass);
}

TEST_CASE("model gradcheck batches carry the masks of their batching mode", "[gradcheck][model]") {
  const Batch r = analysis::gradcheck_batch(BatchMode::padded_docs, Padding::right, 3, 6, 10, 1);
  const Batch l = analysis::gradcheck_batch(BatchMode::padded_docs, Padding::left, 3, 6, 10, 1);
  // row 0 full, row 1 two real tokens: right padding keeps them first, left padding last
  for (int64_t t = 0; t < 6; ++t) {
    CHECK(r.key_padding.at({0, t}) == 1);
    CHECK(r.key_padding.at({1, t}) == (t < 2 ? 1 : 0));
    CHECK(l.key_padding.at({1, t}) == (t >= 4 ? 1 : 0));
    CHECK((r.y.at({1, t}) == kIgnoreIndex) == (t >= 2));
    CHECK((l.y.at({1, t}) == kIgnoreIndex) == (t < 4));
  }
  CHECK(l.positions.at({1, 4}) == 0);
  CHECK(l.positions.at({1, 5}) == 1);
  CHECK(r.positions.at({0, 5}) == 5);

  const Batch p = analysis::gradcheck_batch(BatchMode::packed_docs, Padding::right, 2, 12, 10, 1);
  int64_t pieces = 0;
  for (int64_t row = 0; row < 2; ++row)
    for (int64_t t = 0; t < 12; ++t) {
      const bool starts = t == 0 || p.segment_ids.at({row, t}) != p.segment_ids.at({row, t - 1});
      CHECK((p.positions.at({row, t}) == 0) == starts);
      if (t > 0) CHECK((p.y.at({row, t - 1}) == kIgnoreIndex) == starts);
      pieces += starts;
    }
  CHECK(pieces > 2);  // some row was cut
  for (const Batch* b : {&r, &l, &p})
    for (double id : b->x.to_vector()) CHECK((id >= 0 && id < 10));
}

namespace {
struct Cli {
  int rc = -1;
  std::string out, err;
  nlohmann::json last_json() const {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    return nlohmann::json::parse(last, nullptr, false);
  }
};
Cli run_qkv(const std::string& args) {
  const std::string base = (fs::temp_directory_path() / ("qkv_model_gradcheck_" + std::to_string(::getpid()))).string();
  const std::string cmd = std::string(QKV_BINARY_DIR) + "/qkv " + args + " >" + base + ".out 2>" + base + ".err";
  const int rc = std::system(cmd.c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  Cli r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}
bool have_cli() {
  if (fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) return true;
  WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
  return false;
}
}  // namespace

TEST_CASE("qkv gradcheck --config checks a shipped config and keeps the JSON shape", "[gradcheck][model][cli]") {
  if (!have_cli()) return;
  const std::string cfg = source_path("configs/llama_tiny.toml");
  const std::string shrunk = " --set model.n_layer=1 --set model.n_embd=32 --set model.block_size=16";
  Cli r = run_qkv("gradcheck --config " + cfg + shrunk);
  INFO(r.out << r.err);
  CHECK(r.rc == 0);
  CHECK(r.out.find("model.layers.0.self_attn.k_proj.weight") != std::string::npos);
  CHECK(r.out.find("0 failed") != std::string::npos);
  CHECK(r.out.find("attention: fused") != std::string::npos);

  r = run_qkv("gradcheck --json --config " + cfg + shrunk + " --directions 2 --elements 3 --seed 9");
  CHECK(r.rc == 0);
  const nlohmann::json j = r.last_json();
  REQUIRE(j.is_object());
  // the op mode's shape: checks [{op, case, max_abs_err, max_rel_err, pass}], passed, failed
  REQUIRE(j["checks"].is_array());
  CHECK(j["failed"] == 0);
  CHECK(j["passed"] == j["checks"].size());
  for (const auto& c : j["checks"]) {
    CHECK(c["op"] == "model");
    CHECK(c["case"].is_string());
    CHECK(c["max_abs_err"].is_number());
    CHECK(c["max_rel_err"].is_number());
    CHECK(c["pass"] == true);
    CHECK(c["kind"].is_string());
  }
  // 1 determinism + 2 directions + one per parameter tensor (llama, 1 layer, untied head: 12)
  CHECK(j["checks"].size() == 1 + 2 + 12);
  CHECK(j["checks"][0]["kind"] == "determinism");
  CHECK(j["checks"][1]["kind"] == "direction");
  const auto& k = j["checks"][3 + 3];  // after embed_tokens, input_layernorm, q_proj
  CHECK(k["case"] == "model.layers.0.self_attn.k_proj.weight");
  CHECK(k["elements"] == 3);
  CHECK(k["shape"] == nlohmann::json::array({8, 32}));  // GQA 8:2, head size 4
  CHECK(k["worst"]["index"].size() == 2);
  CHECK(j["model"]["family"] == "llama");
  CHECK(j["model"]["vocab_size"] == 512);  // data.bpe_vocab_size stands in for the tokenizer's
  CHECK(j["model"]["vocab_stand_in"] == true);
  CHECK(j["dtype"] == "float64");
  CHECK(j["directions"] == 2);
  CHECK(j["elements"] == 3);
  CHECK(j["seed"] == 9);
  CHECK(j["deterministic"] == true);
  CHECK(j["batch"]["rows"] == 2);
  CHECK(j["batch"]["tokens"] == 16);
  CHECK(j["attention_kernel"].get<std::string>().rfind("fused", 0) == 0);
  CHECK(j["eps"] == 1e-5);
}

TEST_CASE("qkv gradcheck --config refuses bad input with one line and status 2", "[gradcheck][model][cli]") {
  if (!have_cli()) return;
  const std::string cfg = source_path("configs/tiny.toml");
  struct Bad {
    std::string args, says;
  };
  const Bad cases[] = {
      {"--config " + cfg + " --set model.n_layers=1", "model.n_layers"},
      {"--config " + cfg + " --set model.n_head=5", "model.n_head"},
      {"--config /nonexistent/gc.toml", "/nonexistent/gc.toml"},
      {"--config " + cfg + " --directions -1", "--directions"},
      {"--config " + cfg + " --directions 0 --elements 0", "check nothing"},
      {"--config " + cfg + " --only no_such_tensor", "matches no parameter tensor"},
      {"--set model.n_layer=1", "--set only acts with --config"},
      {"--elements 3", "--elements only acts with --config"},
  };
  for (const auto& b : cases) {
    const Cli r = run_qkv("gradcheck --json " + b.args);
    INFO(b.args << "\nstdout: " << r.out << "\nstderr: " << r.err);
    CHECK(r.rc == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(b.says) != std::string::npos);
    CHECK(r.last_json()["exit"] == 2);
  }
}

TEST_CASE("qkv gradcheck --config exits 1 when a check fails", "[gradcheck][model][cli]") {
  if (!have_cli()) return;
  // Zero tolerance: a finite difference never equals the analytic gradient exactly, so the checks
  // fail on a correct model, which exercises the command's failing path (the planted wrong backward
  // is checked through the engine above, where a test can install it).
  const Cli r = run_qkv("gradcheck --json --config " + source_path("configs/tiny.toml") +
                        " --set model.n_layer=1 --atol 0 --rtol 0 --directions 1 --elements 1");
  INFO(r.out << r.err);
  CHECK(r.rc == 1);
  const nlohmann::json j = r.last_json();
  CHECK(j["failed"].get<int>() >= 1);
  CHECK(r.out.find("FAIL") == std::string::npos);  // the table goes to stderr under --json
  CHECK(r.err.find("FAIL") != std::string::npos);
}
