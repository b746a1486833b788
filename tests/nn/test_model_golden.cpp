// The whole model against an independent float64 PyTorch reference (as llm.c's test_gpt2.c does):
// tests/reference/make_model_fixture.py writes a tiny "gpt2" and a tiny "llama" in plain torch
// (golden_<family>.json: parameters, logits, loss, every gradient, a 10-step AdamW loss sequence).
// Here the float32 model is built from the same config through train::model_config, loaded with
// the fixture's parameters by name, and compared, once per attention kernel.
//
// Tolerances: logits and loss within 1e-5 relative (logits relative to max |logit|), each
// gradient within 1e-4 relative to that tensor's max |grad|, the loss sequence within 1e-4
// relative. The measured maxima are printed so they can be quoted.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compare_util.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "nn/transformer.h"
#include "tensor/cuda/cuda_backend.h"
#include "train/config.h"
#include "analysis/leakcheck.h"
#include "train/model_factory.h"
#include "train/optimizer.h"

using namespace qkv;

namespace {

nlohmann::json load_golden(const std::string& family) {
  std::ifstream f(std::string(QKV_SOURCE_DIR) + "/tests/reference/golden_" + family + ".json");
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

// The fixture's [model] keys as a qkv Config (ffn_hidden left 0: the family default must resolve
// to the fixture's value).
Config golden_config(const nlohmann::json& fx, const std::string& kernel) {
  const auto& c = fx["config"];
  Config cfg;
  apply_override(cfg, "model.family=" + c["family"].get<std::string>());
  cfg.model.vocab_size = c["vocab_size"];
  cfg.model.n_layer = c["n_layer"];
  cfg.model.n_head = c["n_head"];
  cfg.model.n_kv_head = c["n_kv_head"];
  cfg.model.n_embd = c["n_embd"];
  cfg.model.block_size = c["block_size"];
  cfg.model.norm_eps = c["norm_eps"];
  cfg.model.rope_theta = c["rope_theta"];
  if (c.contains("ffn_multiple_of")) cfg.model.ffn_multiple_of = c["ffn_multiple_of"];
  apply_override(cfg, "model.attn_kernel=" + kernel);
  return cfg;
}

Tensor ids_tensor(const nlohmann::json& rows) {
  std::vector<int64_t> v;
  for (const auto& r : rows)
    for (const auto& x : r) v.push_back(x.get<int64_t>());
  return from_vector_i64(v, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
}

// max |got - want| / max |want|
double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / std::max(scale, 1e-300);
}

Tensor lm_loss(nn::DecoderModel& model, const Tensor& ids, const Tensor& targets, Tensor* logits_out = nullptr) {
  nn::ForwardArgs args;
  args.ids = ids;
  Tensor logits = model.forward(args);
  if (logits_out) *logits_out = logits;
  const int64_t V = logits.size(2);
  return ag::cross_entropy(ag::reshape(logits, {-1, V}), targets.reshape({-1}).to(logits.device()));
}

struct Golden {
  nlohmann::json fx;
  std::unique_ptr<nn::DecoderModel> model;
  std::vector<nn::NamedParameter> params;
  Tensor ids, targets;
};

// The model of the fixture's config with the fixture's parameters (names, order, shapes and decay
// flags checked on the way).
Golden load_model(const std::string& family, const std::string& kernel) {
  Golden g;
  g.fx = load_golden(family);
  const nlohmann::json& fx = g.fx;
  const Config cfg = golden_config(fx, kernel);
  const nn::ModelConfig mc = train::model_config(cfg, fx["config"]["vocab_size"].get<int64_t>());
  REQUIRE(mc.ffn_hidden == fx["config"]["ffn_hidden"].get<int64_t>());
  g.model = train::build_model(cfg, mc.vocab_size);
  g.model->train();  // dropout is 0: train mode must compute the same as eval
  g.params = g.model->named_parameters();
  const auto& fparams = fx["params"];
  REQUIRE(g.params.size() == fparams.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const nn::NamedParameter& p = g.params[i];
    INFO("parameter " << i << ": ours " << p.name << ", fixture " << fparams[i]["name"]);
    REQUIRE(p.name == fparams[i]["name"].get<std::string>());
    REQUIRE(p.tensor.shape() == fparams[i]["shape"].get<Shape>());
    REQUIRE(p.decay == fparams[i]["decay"].get<bool>());
    copy_(p.tensor, from_vector(fparams[i]["value"].get<std::vector<double>>(), p.tensor.shape()));
  }
  g.ids = ids_tensor(fx["ids"]);
  g.targets = ids_tensor(fx["targets"]);
  return g;
}

void check_family(const std::string& family, const std::string& kernel, Device device = Device::cpu) {
  Golden g = load_model(family, kernel);
  if (device != Device::cpu) g.model->to(device);  // the fixture's weights, moved
  const nlohmann::json& fx = g.fx;
  const auto& params = g.params;
  const auto& fparams = fx["params"];
  auto& model = g.model;
  const Tensor ids = g.ids, targets = g.targets;

  // Forward: logits and loss.
  Tensor logits;
  Tensor loss = lm_loss(*model, ids, targets, &logits);
  REQUIRE(logits.shape() == fx["logits_shape"].get<Shape>());
  const double logit_err = rel_err(logits.to_vector(), fx["logits"].get<std::vector<double>>());
  const double want_loss = fx["loss"].get<double>();
  const double loss_err = std::abs(loss.item() - want_loss) / std::abs(want_loss);

  // Backward: every parameter's gradient.
  autograd::backward(loss);
  double grad_err = 0;
  std::string worst;
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].name);
    REQUIRE(params[i].tensor.grad().defined());
    const double e = rel_err(params[i].tensor.grad().to_vector(), fparams[i]["grad"].get<std::vector<double>>());
    if (e > grad_err) grad_err = e, worst = params[i].name;
    CHECK(e < 1e-4);
  }

  // Ten AdamW steps on the same batch (PyTorch's settings, two groups by `decay`, no clipping).
  const auto& ax = fx["adamw"];
  train::AdamWOptions opts;
  opts.lr = ax["lr"];
  opts.beta1 = ax["beta1"];
  opts.beta2 = ax["beta2"];
  opts.eps = ax["eps"];
  opts.weight_decay = ax["weight_decay"];
  std::vector<train::OptimParam> oparams;
  for (const auto& p : params) oparams.push_back({p.name, p.tensor, p.decay});
  train::AdamW opt(oparams, opts);
  const auto want_losses = ax["losses"].get<std::vector<double>>();
  const int steps = ax["steps"];
  REQUIRE(want_losses.size() == static_cast<size_t>(steps) + 1);
  std::vector<double> losses{loss.item()};
  for (int s = 0; s < steps; ++s) {
    opt.step();
    autograd::zero_grad(model->parameters());
    Tensor l = lm_loss(*model, ids, targets);
    autograd::backward(l);
    losses.push_back(l.item());
  }
  double seq_err = 0;
  for (size_t k = 0; k < losses.size(); ++k)
    seq_err = std::max(seq_err, std::abs(losses[k] - want_losses[k]) / std::abs(want_losses[k]));

  std::printf(
      "[golden] %-5s %-9s %s logits rel %.2e  loss rel %.2e  grad rel %.2e (worst %s)  adamw-10 loss rel %.2e "
      "(loss %.6f -> %.6f)\n",
      family.c_str(), kernel.c_str(), device_name(device), logit_err, loss_err, grad_err, worst.c_str(), seq_err,
      losses.front(), losses.back());
  CHECK(logit_err < 1e-5);
  CHECK(loss_err < 1e-5);
  CHECK(grad_err < 1e-4);
  CHECK(seq_err < 1e-4);
  // The training really moved: the sequence is not a constant the tolerance would forgive.
  CHECK(want_losses.back() < 0.5 * want_losses.front());
}

}  // namespace

TEST_CASE("gpt2 logits, loss, gradients and 10 AdamW steps match the float64 PyTorch fixture", "[golden][model]") {
  for (const char* kernel : {"reference", "fused"}) {
    SECTION(kernel) { check_family("gpt2", kernel); }
  }
}

TEST_CASE("llama logits, loss, gradients and 10 AdamW steps match the float64 PyTorch fixture", "[golden][model]") {
  for (const char* kernel : {"reference", "fused"}) {
    SECTION(kernel) { check_family("llama", kernel); }
  }
}

// The comparison above must be able to fail: a planted model bug moves the logits far past 1e-5.
TEST_CASE("the golden logits comparison detects planted attention bugs", "[golden][model]") {
  struct Case {
    const char* family;
    analysis::Fault fault;
  };
  for (const Case c :
       {Case{"gpt2", analysis::Fault::scale_d_model}, Case{"gpt2", analysis::Fault::gqa_modulo},
        Case{"llama", analysis::Fault::scale_d_model}, Case{"llama", analysis::Fault::causal_reversed}}) {
    Golden g = load_model(c.family, "reference");
    autograd::NoGradGuard no_grad;
    nn::ForwardArgs args;
    args.ids = g.ids;
    Tensor logits;
    {
      const analysis::PlantedFault planted(*g.model, c.fault);
      logits = g.model->forward(args);
    }
    const double err = rel_err(logits.to_vector(), g.fx["logits"].get<std::vector<double>>());
    std::printf("[golden] %-5s with fault %-16s logits rel %.2e\n", c.family, analysis::fault_name(c.fault), err);
    CHECK(err > 1e-3);
  }
}

TEST_CASE("on the GPU, gpt2 and llama match the same float64 PyTorch fixtures", "[golden][cuda]") {
  if (!test::cuda_device_present()) return;
  for (const char* family : {"gpt2", "llama"}) {
    SECTION(family) { check_family(family, "fused", Device::cuda); }
  }
}
