// The checkers themselves (`qkv leakcheck`, `qkv gradcheck`) at the edges they used to miss:
// correct models whose pattern parameters sit at their edges (1, block_size; global g = 0) pass
// every leak check and the whole-model gradcheck (a row that sees a single key has dQ = dK = 0
// exactly, and the backward check once divided rounding by that zero); and the kernel probes
// catch the online-softmax and chunk bugs on a model too small to reach those regimes itself.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "compare_util.h"
#include "analysis/leakcheck.h"
#include "analysis/leakcheck_internal.h"
#include "analysis/model_gradcheck.h"
#include "app/registry.h"
#include "attention/mask.h"

using namespace qkv;

namespace {

// gpt2 preset, GQA 4:2, block 12 (inside one 32-key tile), init std 0.2.
nn::ModelConfig tiny_config() {
  nn::ModelConfig c;
  c.family = nn::Family::gpt2;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.block_size = 12;
  c.vocab_size = 29;
  c.ffn_hidden = 64;
  c.init_std = 0.2;
  return c;
}

std::unique_ptr<nn::DecoderModel> build(const nn::ModelConfig& c, Device dev = Device::cpu) {
  auto m = std::make_unique<nn::DecoderModel>(c);
  m->init_weights(11);
  m->eval();
  m->to(dev);
  return m;
}

struct Edge {
  std::string name;
  attn::SparsePattern pattern;
};

// Each pattern at the edges of its parameters for block_size n: 1 and n (global also g = 0, no
// global position: every row sees only itself).
std::vector<Edge> pattern_edges(int64_t n) {
  using P = attn::Pattern;
  std::vector<Edge> out;
  auto add = [&](const std::string& name, P kind, auto&& set) {
    attn::SparsePattern p;
    p.kind = kind;
    set(p);
    out.push_back({name, p});
  };
  for (int64_t e : {int64_t{1}, n}) {
    const std::string at = "=" + std::to_string(e);
    add("window local" + at, P::window, [&](auto& p) { p.local = e; });
    add("strided stride" + at + " local=1", P::strided, [&](auto& p) {
      p.stride = e;
      p.local = 1;
    });
    add("strided stride=2 local" + at, P::strided, [&](auto& p) {
      p.stride = 2;
      p.local = e;
    });
    add("global local" + at, P::global, [&](auto& p) { p.local = e; });
    add("bigbird block_size" + at, P::bigbird, [&](auto& p) {
      p.block_size = e;
      p.random_blocks = 1;
    });
    add("block_sparse block_size" + at, P::block_sparse, [&](auto& p) { p.block_size = e; });
  }
  for (int64_t g : {int64_t{0}, int64_t{1}, n})
    add("global global=" + std::to_string(g), P::global, [&](auto& p) { p.global = g; });
  return out;
}

// Every leak check passes on `c`'s model on `dev`; returns the backward check's value.
double expect_leakcheck_passes(const nn::ModelConfig& c, const std::string& what, Device dev) {
  const auto model = build(c, dev);
  const auto checks = analysis::run_model_checks(*model, {});
  double backward = NAN;
  for (const auto& ch : checks) {
    INFO(what << ": " << ch.name << " = " << ch.value << " (threshold " << ch.threshold << "): " << ch.detail);
    CHECK(ch.pass);
    if (ch.name == "reference_attention_backward") backward = ch.value;
  }
  return backward;
}

void expect_gradcheck_passes(const nn::ModelConfig& c, const std::string& what) {
  const auto model = analysis::build_float64_model(c, 3);
  const Batch b = analysis::gradcheck_batch(BatchMode::packed_docs, Padding::right, 2, c.block_size, c.vocab_size, 5);
  analysis::ModelGradcheckOptions opt;
  opt.directions = 2;
  opt.elements = 2;
  const auto rep = analysis::run_model_gradcheck(*model, b, nn::RngContext{5, 0, 0}, opt);
  double worst = 0;
  for (const auto& p : rep.params) worst = std::max(worst, p.max_rel_err);
  INFO(what << ": gradcheck worst element rel err " << worst);
  CHECK(rep.pass);
}

}  // namespace

TEST_CASE("leakcheck passes correct models whose rows see a single key", "[leakcheck][checkers]") {
  // model.pattern_local = 1 (window) and model.pattern_global = 0 (global): every row sees only
  // itself, so the exact dQ and dK are 0 and the backward check measures rounding against the
  // inputs' scale (it reported 8.5e21 when it divided by max|dK| = 0).
  nn::ModelConfig window = tiny_config(), global = tiny_config();
  window.pattern.kind = attn::Pattern::window;
  window.pattern.local = 1;
  global.pattern.kind = attn::Pattern::global;
  global.pattern.global = 0;
  for (const auto& [name, c] : {std::pair{"window local=1", window}, std::pair{"global global=0", global}}) {
    c.validate();
    const double backward = expect_leakcheck_passes(c, name, Device::cpu);
    INFO(name << ": reference_attention_backward " << backward);
    CHECK(backward < 1e-5);
    expect_gradcheck_passes(c, name);
  }
}

TEST_CASE("leakcheck and gradcheck pass correct models at every pattern parameter's edge",
          "[leakcheck][checkers][long]") {
  const int64_t n = tiny_config().block_size;
  for (const Edge& e : pattern_edges(n)) {
    nn::ModelConfig c = tiny_config();
    c.pattern = e.pattern;
    c.validate();
    expect_leakcheck_passes(c, e.name, Device::cpu);
    expect_gradcheck_passes(c, e.name);
  }
  // Past block_size the parameters are refused at load, naming the key.
  for (auto kind : {attn::Pattern::window, attn::Pattern::strided, attn::Pattern::global}) {
    attn::SparsePattern p;
    p.kind = kind;
    (kind == attn::Pattern::global ? p.global : kind == attn::Pattern::strided ? p.stride : p.local) = n + 1;
    CHECK_THROWS_WITH(p.validate_for(n), Catch::Contains("exceeds model.block_size"));
  }
}

TEST_CASE("on the GPU, leakcheck passes correct models at every pattern parameter's edge",
          "[leakcheck][checkers][cuda][device-only]") {
  if (!test::cuda_device_present()) return;
  for (const Edge& e : pattern_edges(tiny_config().block_size)) {
    nn::ModelConfig c = tiny_config();
    c.pattern = e.pattern;
    expect_leakcheck_passes(c, e.name, Device::cuda);
  }
}

namespace {

// On a model whose block fits one key tile, the planted online-softmax faults pass every check but
// kernel_probes, which fails far outside its threshold; on a linear model whose chunk covers its
// block, kernel_probes (several chunks of its own) catches the chunk that sees its later keys too.
// With no fault the probes pass.
void expect_kernel_probes_see(Device dev) {
  nn::ModelConfig linear = tiny_config();
  linear.attention_pattern = nn::AttentionPattern::linear;
  linear.linear_chunk = 16;  // >= block_size 12: the model's own probes see one chunk
  linear.linear_features = linear.head_dim();
  linear.validate();
  REQUIRE(tiny_config().block_size <= attn::kTileK);
  struct Planted {
    analysis::Fault fault;
    bool linear;
  };
  const Planted planted[] = {{analysis::Fault::softmax_no_max_shift, false},
                             {analysis::Fault::softmax_no_rescale, false},
                             {analysis::Fault::linear_chunk_future, true}};
  for (const Planted& p : planted) {
    const auto model = build(p.linear ? linear : tiny_config(), dev);
    const auto clean = analysis::check_kernel_probes(*model, {});
    INFO("clean: " << clean.value << " (" << clean.detail << ")");
    CHECK(clean.pass);
    CHECK(clean.value < 1e-4);
    const analysis::PlantedFault guard(*model, p.fault);
    const auto checks = analysis::run_model_checks(*model, {});
    for (const auto& c : checks) {
      INFO(analysis::fault_name(p.fault) << ": " << c.name << " = " << c.value << " (threshold " << c.threshold
                                         << "): " << c.detail);
      if (c.name == "kernel_probes") {
        WARN(analysis::fault_name(p.fault) << ": kernel_probes = " << c.value << ", clean " << clean.value);
        CHECK_FALSE(c.pass);
        CHECK(c.value > 100 * c.threshold);
      } else if (!p.linear) {
        CHECK(c.pass);  // a block inside one key tile with O(1) logits cannot show this fault
      }
    }
  }
}

}  // namespace

TEST_CASE("the kernel probes catch online-softmax and chunk bugs on a model too small to show them",
          "[leakcheck][checkers][long]") {
  expect_kernel_probes_see(Device::cpu);
}

TEST_CASE("on the GPU, the kernel probes catch online-softmax and chunk bugs",
          "[leakcheck][checkers][cuda][device-only]") {
  if (!test::cuda_device_present()) return;
  expect_kernel_probes_see(Device::cuda);
}

TEST_CASE("the gradcheck registry's attention probes reach past a key tile and exp's overflow",
          "[gradcheck][checkers][long]") {
  int probes = 0;
  for (const auto& c : app::full_gradcheck_registry().cases()) {
    if (c.op != "attention_probe") continue;
    ++probes;
    const std::vector<Tensor> x = c.make_inputs();
    REQUIRE(x.size() == 3);
    const int64_t nk = x[1].size(2), D = x[0].size(3);
    CHECK(nk > 2 * attn::kTileK);
    // the largest logit s·q·k of the first query head's last row
    const std::vector<double> q = x[0].to_vector(), k = x[1].to_vector();
    double top = -INFINITY;
    const size_t last = static_cast<size_t>((nk - 1) * D);
    for (int64_t j = 0; j < nk; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[last + static_cast<size_t>(d)] * k[static_cast<size_t>(j * D + d)];
      top = std::max(top, dot / std::sqrt(static_cast<double>(D)));
    }
    CHECK(top > 709.8);  // past float64's exp overflow
    const autograd::GradcheckResult r = autograd::run_gradcheck(c);
    INFO(c.name << ": max abs err " << r.max_abs_err << " " << r.error);
    CHECK(r.pass);
  }
  CHECK(probes == 12);
}
