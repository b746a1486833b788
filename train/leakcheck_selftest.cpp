// The self-test (does the detector catch real bugs?) and the data-leakage checks.
//
// Self-test: every planted fault (attention/fault.h) is switched on in turn with ScopedFault and
// all model checks run on each self-test model; a fault is detected when at least one check fails,
// and with no fault planted every check must pass. Some faults only show under conditions the
// user's model may lack (a window, GQA, RoPE, several heads, attention dropout), so besides the
// user's model the self-test always builds a probe model that has them all: llama-style, RoPE,
// GQA 4:2 (two kv groups of two), a sliding window shorter than the probe, init std 0.2 so the
// attention is far from uniform and a changed scale or mask moves its output well above rounding.
#include <algorithm>

#include "data/leakage.h"
#include "train/leakcheck_internal.h"

namespace qkv::train {

std::vector<attn::Fault> planted_faults() {
  using F = attn::Fault;
  return {F::causal_reversed,   F::softmax_over_queries, F::ignore_key_padding, F::mask_after_softmax,
          F::top_left_causal,   F::window_off_by_one,    F::gqa_modulo,         F::scale_d_model,
          F::rope_cache_relative, F::dropout_in_eval};
}

const char* fault_condition(attn::Fault f) {
  switch (f) {
    case attn::Fault::causal_reversed: return "any causal model";
    case attn::Fault::softmax_over_queries: return "any model";
    case attn::Fault::ignore_key_padding: return "key padding (left-padded rows)";
    case attn::Fault::mask_after_softmax: return "any row with a masked key";
    case attn::Fault::top_left_causal: return "Nq < Nk (KV-cache decode, chunked prefill)";
    case attn::Fault::window_off_by_one: return "a sliding window (model.window > 0)";
    case attn::Fault::gqa_modulo: return "GQA with Hkv > 1 and Hq / Hkv > 1";
    case attn::Fault::scale_d_model: return "n_head > 1 (d_head != d_model)";
    case attn::Fault::rope_cache_relative: return "RoPE and a KV cache";
    case attn::Fault::dropout_in_eval: return "attention dropout > 0 (set on a copy)";
    case attn::Fault::none: break;
  }
  return "";
}

int SelfTestResult::detected() const {
  return static_cast<int>(std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) { return f.detected; }));
}

std::vector<SelfTestModel> self_test_models(const nn::DecoderModel& user_model) {
  std::vector<SelfTestModel> out;
  const nn::ModelConfig& u = user_model.config();
  SelfTestModel user;
  user.name = "model";
  user.description = std::string(nn::family_name(u.family)) + ", " + std::to_string(u.n_layer) + " layers, " +
                     std::to_string(u.n_head) + ":" + std::to_string(u.n_kv_head) + " heads, C " +
                     std::to_string(u.n_embd) + ", block " + std::to_string(u.block_size) +
                     (u.window > 0 ? ", window " + std::to_string(u.window) : std::string()) +
                     (u.position == nn::Position::rope ? ", RoPE" : "") + " (the model under test)";
  user.model = copy_model(user_model, u);
  out.push_back(std::move(user));

  nn::ModelConfig p;
  p.family = nn::Family::llama;
  p.n_layer = 2;
  p.n_head = 4;
  p.n_kv_head = 2;
  p.n_embd = 32;
  p.block_size = 16;
  p.vocab_size = 48;
  p.ffn_hidden = 64;
  p.position = nn::Position::rope;
  p.norm = nn::NormKind::rmsnorm;
  p.activation = nn::Activation::swiglu;
  p.bias = false;
  p.tie_embeddings = false;
  p.window = 6;
  p.init_std = 0.2;
  SelfTestModel probe;
  probe.name = "probe-llama";
  probe.description = "llama, 2 layers, RoPE, GQA 4:2, window 6, C 32, block 16, init std 0.2 "
                      "(built to expose every planted fault)";
  probe.model = std::make_unique<nn::DecoderModel>(p);
  probe.model->init_weights(0x5e1f7e57);
  probe.model->eval();
  probe.model->to(user_model.device());
  out.push_back(std::move(probe));
  return out;
}

SelfTestResult run_self_test(const nn::DecoderModel& user_model, const LeakCheckOptions& o,
                             const std::function<void(const std::string&)>& progress) {
  const std::vector<SelfTestModel> models = self_test_models(user_model);
  SelfTestResult r;
  for (const auto& m : models) r.models.emplace_back(m.name, m.description);
  auto failures = [&](const char* label) {
    std::vector<CaughtBy> out;
    for (const auto& m : models) {
      const std::vector<LeakCheck> checks = run_model_checks(*m.model, o);
      int failed = 0;
      for (const auto& c : checks)
        if (!c.pass) {
          out.push_back({c.name, m.name, c.value, c.threshold});
          ++failed;
        }
      if (progress) progress(std::string("self-test ") + label + " on " + m.name + ": " + std::to_string(failed) +
                             " of " + std::to_string(checks.size()) + " checks failed");
    }
    return out;
  };
  r.false_alarms = failures("clean");
  for (attn::Fault f : planted_faults()) {
    attn::ScopedFault planted(f);
    FaultOutcome fo;
    fo.fault = f;
    fo.exposed_by = fault_condition(f);
    fo.caught_by = failures(attn::fault_name(f));
    fo.detected = !fo.caught_by.empty();
    r.faults.push_back(std::move(fo));
  }
  return r;
}

std::vector<LeakCheck> check_data_leakage(const TokenSplit& train, const TokenSplit& val, const LeakCheckOptions& o) {
  const LeakageReport r = measure_leakage(train, val, o.ngram_n);
  std::vector<LeakCheck> out;
  out.push_back(leak::make_check("data.val_ngram_share", r.ngram_share, o.max_ngram_share,
                                 std::to_string(r.shared_ngrams) + " of " + std::to_string(r.val_ngrams) + " " +
                                     std::to_string(r.n) + "-token windows of val also occur in train"));
  out.push_back(leak::make_check("data.duplicated_docs", static_cast<double>(r.duplicated_docs),
                                 static_cast<double>(o.max_duplicated_docs),
                                 "val documents identical to a train document, of " + std::to_string(r.val_docs)));
  return out;
}

}  // namespace qkv::train
