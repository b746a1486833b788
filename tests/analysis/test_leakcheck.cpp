// Leakage and consistency evaluation (analysis/leakcheck.h): every check passes on clean tiny models
// and fails under at least one planted fault; the self-test catches every fault with no false
// alarm; the naive float64 reference reproduces the 2x2 worked example; attention maps are the
// model's real attention and show the causal triangle; PNG and HTML outputs; CLI input errors.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compare_util.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "analysis/attention_map.h"
#include "analysis/leakcheck.h"
#include "analysis/leakcheck_internal.h"
#include "analysis/png.h"
#include "build_dir.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

// gpt2 preset, GQA 4:2, learned positions; init std 0.2 so attention is far from uniform.
std::unique_ptr<nn::DecoderModel> tiny_gpt2() {
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
  auto m = std::make_unique<nn::DecoderModel>(c);
  m->init_weights(11);
  m->eval();
  return m;
}

// The self-test's probe model: llama, RoPE, GQA 4:2, window 6.
std::unique_ptr<nn::DecoderModel> tiny_llama() {
  auto models = analysis::self_test_models(*tiny_gpt2());
  return std::move(models[1].model);
}

const analysis::LeakCheck& find(const std::vector<analysis::LeakCheck>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return c;
  FAIL("no check named " << name);
  return v.front();
}

std::string temp_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("qkv_leakcheck_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace

TEST_CASE("naive reference attention reproduces the 2x2 worked example", "[leakcheck]") {
  // The 2x2 worked example of test_attention_semantics.cpp: Q = K = I (d_k = 2), V = diag(10, 20).
  analysis::leak::NaiveSpec s;
  s.Nq = s.Nk = 2;
  s.D = s.Dv = 2;
  const std::vector<double> q{1, 0, 0, 1}, k{1, 0, 0, 1}, v{10, 0, 0, 20};
  std::vector<double> out, w;
  s.causal = false;
  CHECK(analysis::leak::naive_attention(s, q, k, v, out, &w) == 0);
  CHECK(w[0] == Approx(0.6698).margin(1e-4));
  CHECK(w[1] == Approx(0.3302).margin(1e-4));
  CHECK(out[0] == Approx(6.698).margin(1e-3));
  CHECK(out[1] == Approx(6.604).margin(1e-3));
  CHECK(out[2] == Approx(3.302).margin(1e-3));
  CHECK(out[3] == Approx(13.396).margin(1e-3));
  s.causal = true;  // causal: A = [[1, 0], [0.3302, 0.6698]], O = [[10, 0], [3.302, 13.396]]
  analysis::leak::naive_attention(s, q, k, v, out, &w);
  CHECK(w[0] == 1.0);
  CHECK(w[1] == 0.0);
  CHECK(out[0] == Approx(10.0).epsilon(1e-12));
  CHECK(out[1] == 0.0);
  CHECK(out[3] == Approx(13.396).margin(1e-3));
  // A row whose keys are all masked gives zero weights and a zero output, never NaN.
  s.key_valid = {0, 0};
  CHECK(analysis::leak::naive_attention(s, q, k, v, out, &w) == 2);
  for (double x : out) CHECK(x == 0.0);
}

namespace {

// Every check passes on the clean tiny models, run on `dev`; the exact-zero properties are
// exactly zero, not merely small.
void expect_clean_models_pass(Device dev) {
  analysis::LeakCheckOptions o;
  for (const auto& model : {tiny_gpt2(), tiny_llama()}) {
    model->to(dev);
    const auto checks = analysis::run_model_checks(*model, o);
    CHECK(checks.size() == 21);
    for (const auto& c : checks) {
      INFO(nn::family_name(model->config().family)
           << " " << c.name << " = " << c.value << " (threshold " << c.threshold << "): " << c.detail);
      CHECK(c.pass);
    }
    CHECK(find(checks, "future_token_perturbation").value == 0.0);
    CHECK(find(checks, "mask.masked_weights_zero").value == 0.0);
    CHECK(find(checks, "greedy_generation").value == 0.0);
    CHECK(find(checks, "dropout_discipline").value == 0.0);
    CHECK(static_cast<int64_t>(find(checks, "kv_decode").per_position.size()) == model->config().block_size);
    // Generated tokens compared, one per position: the rows did decode together.
    CHECK(static_cast<int64_t>(find(checks, "batched_generation").per_position.size()) ==
          model->config().block_size / 2);
  }
}

// Each check fails, well outside its threshold, under a planted fault it is meant to catch.
void expect_planted_faults_caught(Device dev) {
  struct Expect {
    const char* check;
    analysis::Fault fault;
    bool llama;
  };
  using F = analysis::Fault;
  const Expect cases[] = {
      {"future_token_perturbation", F::causal_reversed, false},
      {"kv_decode", F::top_left_causal, false},
      {"chunked_prefill", F::top_left_causal, false},
      {"greedy_generation", F::top_left_causal, false},
      {"trainer_vs_sampler", F::top_left_causal, false},
      {"trainer_vs_sampler", F::rope_cache_relative, true},
      {"kv_decode", F::rope_cache_relative, true},
      {"chunked_prefill", F::rope_cache_relative, true},
      {"padding_invariance", F::ignore_key_padding, false},
      {"padding_target_loss", F::ignore_key_padding, false},
      {"packing_invariance", F::mask_after_softmax, false},
      {"mask.masked_weights_zero", F::causal_reversed, false},
      {"mask.rows_sum_to_one", F::softmax_over_queries, false},
      {"mask.rows_sum_to_one", F::mask_after_softmax, false},
      {"mask.fully_masked_rows", F::ignore_key_padding, false},
      {"mask.bottom_right_causal", F::top_left_causal, false},
      {"mask.window_boundary", F::window_off_by_one, true},
      {"mask.kernels_vs_naive", F::gqa_modulo, false},
      {"reference_attention", F::scale_d_model, false},
      {"reference_attention", F::gqa_modulo, true},
      {"reference_attention", F::causal_reversed, false},
      {"reference_attention", F::window_off_by_one, true},
      {"reference_attention_backward", F::gqa_modulo, true},
      {"reference_attention_backward", F::causal_reversed, false},
      {"reference_attention_backward", F::ignore_key_padding, false},
      {"reference_attention_backward", F::window_off_by_one, true},
      {"dropout_discipline", F::dropout_in_eval, false},
      {"batched_generation", F::cross_row_cache, false},
      {"batched_generation", F::cross_row_cache, true},
  };
  const auto gpt2 = tiny_gpt2(), llama = tiny_llama();
  gpt2->to(dev);
  llama->to(dev);
  analysis::LeakCheckOptions o;
  for (const Expect& e : cases) {
    nn::DecoderModel& model = e.llama ? *llama : *gpt2;
    const analysis::PlantedFault planted(model, e.fault);
    const auto checks = analysis::run_model_checks(model, o);
    const auto& c = find(checks, e.check);
    INFO(e.check << " under " << analysis::fault_name(e.fault) << ": value " << c.value << " threshold " << c.threshold
                 << " (" << c.detail << ")");
    CHECK_FALSE(c.pass);
    CHECK(c.value > 10 * std::max(c.threshold, 1e-7));  // well outside, not a rounding accident
  }
  // The guards restored the library's attention.
  CHECK(gpt2->attention_ops() == nn::AttentionOps::library());
  CHECK(llama->attention_ops() == nn::AttentionOps::library());
}

}  // namespace

TEST_CASE("every leak check passes on clean tiny models", "[leakcheck][exact]") {
  expect_clean_models_pass(Device::cpu);
  // The caller's model is untouched: still in the mode it was in.
  analysis::LeakCheckOptions o;
  auto m = tiny_gpt2();
  m->train();
  analysis::check_dropout(*m, o);
  CHECK(m->is_training());
}

TEST_CASE("each leak check fails under a planted fault it is meant to catch", "[leakcheck][exact][long]") {
  expect_planted_faults_caught(Device::cpu);
}

TEST_CASE("on the GPU, every leak check passes on clean models and catches each planted fault",
          "[leakcheck][cuda][device-only]") {
  if (!test::cuda_device_present()) return;
  expect_clean_models_pass(Device::cuda);
  expect_planted_faults_caught(Device::cuda);
  // The checks really ran on the device: a training-mode device model's eval copy stays there.
  auto m = tiny_gpt2();
  m->to(Device::cuda);
  m->train();
  const analysis::leak::EvalModel copy(*m);
  CHECK(copy->device() == Device::cuda);
}

TEST_CASE("batched_generation: every row is its batch-1 decode; a row reading another's cache fails it alone",
          "[leakcheck][exact]") {
  // The user's gpt2, and the self-test's linear-attention probe (its rows step recurrent states).
  auto models = analysis::self_test_models(*tiny_gpt2());
  for (size_t at : {size_t{0}, size_t{2}}) {
    nn::DecoderModel& model = *models[at].model;
    INFO(models[at].name);
    for (Numerics mode : {Numerics::invariant, Numerics::standard}) {
      const NumericsGuard guard(mode);
      const analysis::LeakCheck clean = analysis::check_batched_generation(model, {});
      INFO(clean.detail);
      CHECK(clean.pass);
      const int64_t L = model.config().block_size;                      // 12 and 16: the probe is the whole block
      CHECK(static_cast<int64_t>(clean.per_position.size()) == L / 2);  // one position per generated token
      if (mode == Numerics::invariant) CHECK(clean.value == 0.0);       // bitwise, not merely close
      const std::string lens = std::to_string(L / 2) + ", 1, " + std::to_string(L / 4 + 1) + ", 3 tokens";
      CHECK(clean.detail.find("prompts of " + lens) != std::string::npos);
    }
    const analysis::PlantedFault planted(model, analysis::Fault::cross_row_cache);
    const auto checks = analysis::run_model_checks(model, {});
    for (const auto& c : checks) {
      INFO(c.name << " = " << c.value << " (threshold " << c.threshold << "): " << c.detail);
      if (c.name == "batched_generation") {
        CHECK_FALSE(c.pass);
        CHECK(c.value > 10 * std::max(c.threshold, 1e-7));
        CHECK(c.per_position[0] == 0.0);  // token 0 comes from each prompt's prefill alone
      } else {
        CHECK(c.pass);  // no other check runs rows together: without this one the fault passes
      }
    }
  }
}

TEST_CASE("a planted fault lives in its model and its copies and never in other models or the library", "[leakcheck]") {
  const auto a = tiny_gpt2(), b = tiny_gpt2();  // the same weights
  const Tensor ids = analysis::leak::ids_tensor(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6});
  const Tensor clean = analysis::leak::forward(*b, ids);
  CHECK(max_abs_diff(analysis::leak::forward(*a, ids), clean) == 0.0);
  {
    const analysis::PlantedFault planted(*a, analysis::Fault::causal_reversed);
    CHECK(a->attention_ops() != nn::AttentionOps::library());
    const auto copy = analysis::copy_model(*a, a->config());
    CHECK(copy->attention_ops() == a->attention_ops());
    const Tensor faulty = analysis::leak::forward(*a, ids);
    CHECK(max_abs_diff(faulty, clean) > 1e-3);                                // the bug shows in this model
    CHECK(max_abs_diff(analysis::leak::forward(*copy, ids), faulty) == 0.0);  // and in its copy
    CHECK(max_abs_diff(analysis::leak::forward(*b, ids), clean) == 0.0);      // not in another model
  }
  CHECK(a->attention_ops() == nn::AttentionOps::library());
  CHECK(max_abs_diff(analysis::leak::forward(*a, ids), clean) == 0.0);  // and gone with the guard
}

TEST_CASE("the self-test catches every planted fault without false alarms", "[leakcheck][slow]") {
  const auto model = tiny_gpt2();
  std::vector<std::string> lines;
  const analysis::SelfTestResult st =
      analysis::run_self_test(*model, {}, [&](const std::string& l) { lines.push_back(l); });
  CHECK(st.planted() == 16);
  CHECK(st.detected() == 16);
  CHECK(st.false_alarms.empty());
  CHECK(st.pass());
  CHECK(lines.size() == 5 * 17);  // five models (user, llama probe, linear probe, two sparse probes), clean + 16 faults
  for (const auto& f : st.faults) {
    INFO(analysis::fault_name(f.fault));
    CHECK(f.detected);
    CHECK_FALSE(f.caught_by.empty());
  }
  // The faults the user's gpt2 model cannot show (no RoPE, no window) are caught on the probe.
  for (const auto& f : st.faults)
    if (f.fault == analysis::Fault::rope_cache_relative)
      for (const auto& c : f.caught_by) CHECK(c.model != "model");  // the RoPE probes (llama, linear, sparse)
  for (const auto& f : st.faults)
    if (f.fault == analysis::Fault::linear_chunk_future)
      for (const auto& c : f.caught_by) CHECK(c.model == "probe-linear");
  // A row reading another row's cache shows only where rows decode together, on every model.
  for (const auto& f : st.faults)
    if (f.fault == analysis::Fault::cross_row_cache) {
      std::set<std::string> models;
      for (const auto& c : f.caught_by) {
        CHECK(c.check == "batched_generation");
        models.insert(c.model);
      }
      CHECK(models.size() == 5);
    }
  // The sparse faults are caught by the model's own checks only on their sparse probes (the other
  // models have no pattern); kernel_probes runs every pattern on every softmax model.
  for (const auto& f : st.faults)
    if (f.fault == analysis::Fault::strided_offset_off_by_one || f.fault == analysis::Fault::global_reads_future)
      for (const auto& c : f.caught_by)
        if (c.check != "kernel_probes")
          CHECK(c.model == (f.fault == analysis::Fault::global_reads_future ? "probe-global" : "probe-strided"));
  // The online-softmax faults are caught by kernel_probes on the user's model too, whose block of 12
  // fits one key tile and whose logits are O(1).
  for (const auto& f : st.faults)
    if (f.fault == analysis::Fault::softmax_no_max_shift || f.fault == analysis::Fault::softmax_no_rescale) {
      bool on_user_model = false;
      for (const auto& c : f.caught_by)
        on_user_model = on_user_model || (c.model == "model" && c.check == "kernel_probes");
      CHECK(on_user_model);
    }
  const nlohmann::json j = analysis::leakcheck_json({}, &st);
  CHECK(j["self_test"]["planted"] == 16);
  CHECK(j["self_test"]["detected"] == 16);
  CHECK(j["self_test"]["false_alarms"] == 0);
  CHECK(j["self_test"]["faults"].size() == 16);
  CHECK(analysis::self_test_table(st).find("16/16 planted faults detected, PASS") != std::string::npos);
}

TEST_CASE("the naive float64 attention backward is the gradient of the naive forward", "[leakcheck]") {
  // Central differences of L = Σ dO ∘ O(q, k, v) on a small case with every feature the leak checks
  // use: GQA 4:2, causal, window, key padding that empties a row, segments, ALiBi.
  analysis::leak::NaiveSpec s;
  s.B = 2, s.Hq = 4, s.Hkv = 2, s.Nq = 5, s.Nk = 7, s.D = 3, s.Dv = 3;
  s.window = 5;
  s.key_valid.assign(14, 1);
  for (int j = 0; j < 3; ++j) s.key_valid[7 + j] = 0;  // batch 1: query 0 (position 2) sees nothing
  s.segment = {0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  s.alibi = analysis::leak::naive_alibi_slopes(4);
  auto draw = [](size_t n, uint64_t seed) {
    return randn({static_cast<int64_t>(n)}, seed, 0, 0.0, 1.0, DType::f64).to_vector();
  };
  std::vector<double> q = draw(2 * 4 * 5 * 3, 1), k = draw(2 * 2 * 7 * 3, 2), v = draw(2 * 2 * 7 * 3, 3),
                      dout = draw(2 * 4 * 5 * 3, 4), dq, dk, dv, out;
  for (double& x : q) x *= 3;  // weights far from uniform
  analysis::leak::naive_attention_backward(s, q, k, v, dout, dq, dk, dv);
  auto loss = [&] {
    analysis::leak::naive_attention(s, q, k, v, out, nullptr);
    double l = 0;
    for (size_t e = 0; e < out.size(); ++e) l += dout[e] * out[e];
    return l;
  };
  double worst = 0, largest = 0;
  int nonzero = 0;
  for (auto [x, g] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}})
    for (size_t e = 0; e < x->size(); ++e) {
      const double keep = (*x)[e], h = 1e-6;
      (*x)[e] = keep + h;
      const double up = loss();
      (*x)[e] = keep - h;
      const double down = loss();
      (*x)[e] = keep;
      worst = std::max(worst, std::fabs((up - down) / (2 * h) - (*g)[e]));
      largest = std::max(largest, std::fabs((*g)[e]));
      nonzero += (*g)[e] != 0;
    }
  INFO("worst |finite difference - vjp| " << worst << ", largest gradient " << largest);
  CHECK(worst < 1e-7);
  CHECK(largest > 0.1);
  CHECK(nonzero > 100);
  // The emptied row (batch 1, every head, query 0) gets exactly zero dq.
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t d = 0; d < 3; ++d) CHECK(dq[static_cast<size_t>(((4 + h) * 5) * 3 + d)] == 0.0);
}

TEST_CASE("the backward reference check fails on an attention whose gradient is wrong", "[leakcheck]") {
  // The planted faults (analysis::Fault) are forward bugs only, so the wrong gradient comes from
  // the check's test seam: an attention whose output is exactly right (q - copy(q) is 0) but whose
  // dq carries an extra 0.1·dO, or whose dv is scaled by 1.001 (the output again exact).
  const analysis::leak::AttentionFn right = [](const Tensor& q, const Tensor& k, const Tensor& v,
                                               const attn::AttentionOptions& o) { return attn::attention(q, k, v, o); };
  const analysis::leak::AttentionFn leaks_into_dq = [](const Tensor& q, const Tensor& k, const Tensor& v,
                                                       const attn::AttentionOptions& o) {
    return ag::add(attn::attention(q, k, v, o), ag::mul(ag::sub(q, q.clone()), 0.1));
  };
  const analysis::leak::AttentionFn scales_dv = [](const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const attn::AttentionOptions& o) {
    // v + 0.001·(v − copy(v)): the value of v, the gradient 1.001·dV.
    return attn::attention(q, k, ag::add(v, ag::mul(ag::sub(v, v.clone()), 0.001)), o);
  };
  analysis::LeakCheckOptions o;
  for (const auto& model : {tiny_gpt2(), tiny_llama()}) {
    const std::string family = nn::family_name(model->config().family);
    const analysis::LeakCheck clean = analysis::leak::reference_attention_backward(*model, o, right);
    INFO(family << ": clean " << clean.value << " (" << clean.detail << ")");
    CHECK(clean.name == "reference_attention_backward");
    CHECK(clean.pass);
    CHECK(clean.value == analysis::check_reference_attention_backward(*model, o).value);
    const analysis::LeakCheck bad_dq = analysis::leak::reference_attention_backward(*model, o, leaks_into_dq);
    INFO(family << ": extra dq " << bad_dq.value << " (" << bad_dq.detail << ")");
    CHECK_FALSE(bad_dq.pass);
    CHECK(bad_dq.value > 100 * bad_dq.threshold);
    CHECK(bad_dq.detail.find(" dq (attention)") != std::string::npos);
    const analysis::LeakCheck bad_dv = analysis::leak::reference_attention_backward(*model, o, scales_dv);
    INFO(family << ": dv x1.001 " << bad_dv.value << " (" << bad_dv.detail << ")");
    CHECK_FALSE(bad_dv.pass);
    CHECK(bad_dv.value == Approx(1e-3).epsilon(0.05));
    CHECK(bad_dv.detail.find(" dv (attention)") != std::string::npos);
  }
}

TEST_CASE("run_model_checks runs only the families asked for, and refuses an unknown one", "[leakcheck]") {
  auto model = tiny_gpt2();
  analysis::LeakCheckOptions o;
  o.families = {"train_vs_inference", "thread_count"};
  std::vector<std::string> names;
  for (const auto& c : analysis::run_model_checks(*model, o)) names.push_back(c.name);
  CHECK(names == std::vector<std::string>{"kv_decode", "chunked_prefill", "greedy_generation", "thread_count"});
  // Every family the table lists is one run_model_checks runs: all of them give the full run.
  o.families = analysis::model_check_families();
  std::vector<std::string> all_names, listed_names;
  for (const auto& c : analysis::run_model_checks(*model, o)) listed_names.push_back(c.name);
  for (const auto& c : analysis::run_model_checks(*model, {})) all_names.push_back(c.name);
  CHECK(listed_names == all_names);
  o.families = {"kv_decode"};  // a check, not a family
  CHECK_THROWS_WITH(analysis::run_model_checks(*model, o), Catch::Contains("unknown check family 'kv_decode'"));
}

TEST_CASE("data leakage checks flag validation text copied from train", "[leakcheck]") {
  auto split = [](const std::vector<std::vector<int32_t>>& docs) {
    TokenSplit s;
    s.name = "test";
    s.doc_offsets = {0};
    for (const auto& d : docs) {
      s.tokens.insert(s.tokens.end(), d.begin(), d.end());
      s.doc_offsets.push_back(static_cast<int64_t>(s.tokens.size()));
    }
    return s;
  };
  auto doc = [](uint64_t seed) {
    std::vector<int32_t> d(100);
    uint64_t x = seed;
    for (auto& t : d) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int32_t>((x >> 33) % 1000);
    }
    return d;
  };
  const TokenSplit train = split({doc(1), doc(2), doc(3)});
  analysis::LeakCheckOptions o;  // n = 32: each 100-token document has 69 windows
  const auto clean = analysis::check_data_leakage(train, split({doc(4), doc(5)}), o).checks;
  CHECK(find(clean, "data.val_ngram_share").value == 0.0);
  CHECK(find(clean, "data.duplicated_docs").value == 0.0);
  CHECK(find(clean, "data.val_ngram_share").pass);
  const auto leaky = analysis::check_data_leakage(train, split({doc(4), doc(2)}), o).checks;
  CHECK(find(leaky, "data.val_ngram_share").value == Approx(0.5));
  CHECK(find(leaky, "data.duplicated_docs").value == 1.0);
  CHECK_FALSE(find(leaky, "data.val_ngram_share").pass);
  CHECK_FALSE(find(leaky, "data.duplicated_docs").pass);

  // Windows longer than every val document: nothing to compare, so the share is skipped with the
  // reason, not passed at 0 of 0; the duplicate check still runs (doc(2) is in train).
  o.ngram_n = 101;
  const auto too_long = analysis::check_data_leakage(train, split({doc(4), doc(2)}), o);
  REQUIRE(too_long.checks.size() == 1);
  CHECK(too_long.checks[0].name == "data.duplicated_docs");
  CHECK_FALSE(too_long.checks[0].pass);
  REQUIRE(too_long.skipped.size() == 1);
  CHECK(too_long.skipped[0].first == "data.val_ngram_share");
  CHECK_THAT(too_long.skipped[0].second, Catch::Contains("101-token window"));
  o.ngram_n = 100;  // each document is exactly one window: the check runs (doc(2)'s window is shared)
  CHECK(find(analysis::check_data_leakage(train, split({doc(4), doc(2)}), o).checks, "data.val_ngram_share").value ==
        Approx(0.5));
}

TEST_CASE("attention maps are the model's own attention and show the causal triangle", "[leakcheck][attention_map]") {
  for (const auto& model : {tiny_gpt2(), tiny_llama()}) {
    const nn::ModelConfig& c = model->config();
    const int64_t T = c.block_size, G = c.n_head / c.n_kv_head, hd = c.head_dim();
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<int32_t>((t * 7 + 3) % c.vocab_size));
    const analysis::AttentionMaps maps = analysis::compute_attention_maps(*model, ids, nullptr);
    REQUIRE(maps.weights.size() == static_cast<size_t>(c.n_layer));
    // The model's own attention outputs for the same text.
    std::vector<nn::AttentionCapture> caps;
    nn::ForwardArgs a;
    std::vector<int64_t> ids64(ids.begin(), ids.end());
    a.ids = from_vector_i64(ids64, {1, T});
    a.attention = &caps;
    {
      autograd::NoGradGuard ng;
      model->forward(a);
    }
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const auto W = maps.weights[static_cast<size_t>(l)].to_vector();
      const auto V = caps[static_cast<size_t>(l)].v.to_vector(), O = caps[static_cast<size_t>(l)].out.to_vector();
      double err = 0, scale = 0;
      for (int64_t h = 0; h < c.n_head; ++h)
        for (int64_t i = 0; i < T; ++i) {
          double sum = 0;
          for (int64_t j = 0; j < T; ++j) {
            const double w = W[static_cast<size_t>((h * T + i) * T + j)];
            sum += w;
            if (!maps.visible(i, j)) CHECK(w == 0.0);
          }
          CHECK(sum == Approx(1.0).margin(1e-6));
          for (int64_t d = 0; d < hd; ++d) {  // O = W·V with query head h reading kv head h / G
            double o = 0;
            for (int64_t j = 0; j < T; ++j)
              o += W[static_cast<size_t>((h * T + i) * T + j)] * V[static_cast<size_t>(((h / G) * T + j) * hd + d)];
            const double ref = O[static_cast<size_t>((h * T + i) * hd + d)];
            err = std::max(err, std::abs(o - ref));
            scale = std::max(scale, std::abs(ref));
          }
        }
      CHECK(err / scale < 1e-5);
    }
    // The heatmap: masked cells grey above the diagonal, coloured on and below it.
    analysis::HeatmapLayout lay;
    const analysis::Image img = analysis::render_attention_map(maps, c.n_layer - 1, 1, &lay);
    REQUIRE(lay.cell > 0);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const analysis::Rgb px = img.get(lay.x0 + static_cast<int>(j) * lay.cell + lay.cell / 2,
                                         lay.y0 + static_cast<int>(i) * lay.cell + lay.cell / 2);
        INFO("cell " << i << "," << j);
        CHECK((px == analysis::kMaskedColour) == !maps.visible(i, j));
      }
    // The first query sees only itself: weight 1, the darkest colour.
    CHECK(img.get(lay.x0 + lay.cell / 2, lay.y0 + lay.cell / 2) == analysis::weight_colour(1.0));
  }
}

TEST_CASE("PNG images round-trip through libpng with the bitmap font", "[leakcheck][png]") {
  analysis::Image img(40, 20, {255, 255, 255});
  img.fill_rect(30, 5, 5, 5, {200, 10, 20});
  const int w = img.draw_text(1, 1, "A", {0, 0, 0});
  CHECK(w == 6);
  // 'A' (drawn from y = 1): glyph row 0 is .###., row 4 is #####.
  CHECK(img.get(1, 1) == analysis::Rgb{255, 255, 255});
  CHECK(img.get(2, 1) == analysis::Rgb{0, 0, 0});
  CHECK(img.get(4, 1) == analysis::Rgb{0, 0, 0});
  CHECK(img.get(5, 1) == analysis::Rgb{255, 255, 255});
  for (int x = 1; x <= 5; ++x) CHECK(img.get(x, 5) == analysis::Rgb{0, 0, 0});
  CHECK(img.get(3, 4) == analysis::Rgb{255, 255, 255});  // row 3 is #...#
  const std::string dir = temp_dir("png");
  analysis::write_png(dir + "/a.png", img);
  const std::string bytes = analysis::encode_png(img);
  REQUIRE(bytes.size() > 8);
  CHECK(bytes.substr(1, 3) == "PNG");
  const analysis::Image back = analysis::read_png(dir + "/a.png");
  REQUIRE(back.width() == 40);
  REQUIRE(back.height() == 20);
  CHECK(back.pixels() == img.pixels());
  CHECK_THROWS_WITH(analysis::read_png(dir + "/missing.png"), Catch::Contains("[png]"));
  fs::remove_all(dir);
}

TEST_CASE("the HTML report holds the tables and both heatmaps", "[leakcheck]") {
  const auto model = tiny_gpt2();
  analysis::LeakCheckReport r;
  r.subject = "tiny <model>";
  r.checks = analysis::run_model_checks(*model, {});
  r.checks.back().pass = false;  // one failing row, to see it marked
  const std::string dir = temp_dir("report");
  std::vector<int32_t> ids{1, 2, 3, 4, 5, 6, 7, 8};
  analysis::write_leakcheck_report(dir, r, nullptr, *model, ids, nullptr);
  std::ifstream in(dir + "/index.html");
  const std::string html((std::istreambuf_iterator<char>(in)), {});
  CHECK(html.find("future_token_perturbation") != std::string::npos);
  CHECK(html.find("tiny &lt;model&gt;") != std::string::npos);
  CHECK(html.find("FAIL") != std::string::npos);
  CHECK(html.find("attention_map.png") != std::string::npos);
  CHECK(html.find("attention_grid.png") != std::string::npos);
  CHECK(analysis::read_png(dir + "/attention_map.png").width() > 8 * 8);
  CHECK(analysis::read_png(dir + "/attention_grid.png").height() > 2 * 8);
  for (const auto& e : fs::directory_iterator(dir))  // no temporary files left behind
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  const nlohmann::json j = analysis::leakcheck_json(r, nullptr);
  CHECK(j["checks"].size() == r.checks.size());
  CHECK(j["failed"] == 1);
  CHECK(j["passed"] == static_cast<int>(r.checks.size()) - 1);
  CHECK(j["checks"][0].contains("name"));
  CHECK(j["checks"][0].contains("threshold"));
  CHECK_FALSE(j.contains("self_test"));
  fs::remove_all(dir);
}

namespace {
// Runs the qkv binary from the source root; returns its exit status, stdout and stderr.
int run_qkv(const std::string& args, std::string* out, std::string* err) {
  const std::string base = fs::temp_directory_path() / ("qkv_leakcheck_cli_" + std::to_string(::getpid()));
  const std::string cmd = std::string("cd ") + QKV_SOURCE_DIR + " && " + QKV_BINARY_DIR + "/qkv " + args + " >" + base +
                          ".out 2>" + base + ".err";
  const int rc = std::system(cmd.c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  if (out) *out = slurp(base + ".out");
  if (err) *err = slurp(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return WEXITSTATUS(rc);
}
}  // namespace

TEST_CASE("qkv leakcheck refuses neither or both of --checkpoint and --config", "[leakcheck][cli][long]") {
  if (!fs::exists(std::string(QKV_BINARY_DIR) + "/qkv")) {
    WARN("the qkv binary is not built in " << QKV_BINARY_DIR << ": CLI not checked");
    return;
  }
  std::string out, err;
  CHECK(run_qkv("leakcheck", &out, &err) == 2);
  CHECK(err.find("exactly one of --checkpoint CKPT or --config FILE") != std::string::npos);
  CHECK(run_qkv("leakcheck --checkpoint a.h5 --config b.toml", &out, &err) == 2);
  CHECK(err.find("both were given") != std::string::npos);
  CHECK(run_qkv("leakcheck --checkpoint /nonexistent/ckpt.h5", &out, &err) == 2);
  CHECK(run_qkv("attention-map --checkpoint /nonexistent/ckpt.h5 --text hi --out /tmp/x.png", &out, &err) == 2);
  // The tiny config passes (its corpus ships in data/corpus/).
  {
    REQUIRE(run_qkv("leakcheck --config configs/tiny.toml --json", &out, &err) == 0);
    const nlohmann::json j = nlohmann::json::parse(out);  // --json: stdout is the one JSON line
    CHECK(j["failed"] == 0);
    CHECK(j["passed"] == 23);  // 21 model checks + 2 data checks
    // --json also runs the consistency checks under both numerics modes.
    REQUIRE(j["consistency"].size() == analysis::consistency_check_names().size());
    for (const auto& c : j["consistency"]) {
      INFO(c.dump());
      CHECK(c["standard"]["threshold"].get<double>() > 0);
      CHECK(c["invariant"]["threshold"] == 0.0);
    }
  }
  // --numerics invariant reaches the checks: each is held to exactly 0, and measures 0.
  {
    run_qkv("leakcheck --config configs/tiny.toml --numerics invariant --json", &out, &err);
    const nlohmann::json j = nlohmann::json::parse(out);
    for (const auto& c : j["checks"])
      for (const auto& name : analysis::consistency_check_names())
        if (c["name"] == name) {
          INFO(c.dump());
          CHECK(c["threshold"] == 0.0);
          CHECK(c["value"] == 0.0);
        }
  }
}
