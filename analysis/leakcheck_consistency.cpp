// The consistency checks that feed one sequence through a batch, a thread count, the training
// step or batched generation (batch_composition, thread_count, trainer_vs_sampler,
// batched_generation), and the side-by-side run of every consistency check under both numerics
// modes (leakcheck.h).
//
// Under numerics = invariant a token's logits are bitwise a function of its prefix and the weights
// (tensor/numerics.h), so each of these measures exactly 0 there; under standard the gap is the
// float32 rounding the BLAS's shape-dependent blocking puts between two groupings of one sum.
#include <algorithm>
#include <cmath>
#include <functional>

#include "analysis/leakcheck_internal.h"
#include "autograd/grad_mode.h"
#include "tensor/cpu/parallel.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"
#include "train/evaluate.h"
#include "train/sampler.h"

namespace qkv::analysis {

using leak::fmt;
using leak::max_abs;

namespace {

// Grad mode on for the guard's lifetime, as in a training step.
class GradOn {
 public:
  GradOn() : previous_(autograd::grad_enabled()) { autograd::set_grad_enabled(true); }
  ~GradOn() { autograd::set_grad_enabled(previous_); }
  GradOn(const GradOn&) = delete;
  GradOn& operator=(const GradOn&) = delete;

 private:
  bool previous_;
};

Tensor bool_tensor(const std::vector<uint8_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::boolean);
  bool* p = t.data<bool>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i] != 0;
  return t;
}

}  // namespace

LeakCheck check_batch_composition(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), B = 8, row = 5;
  const int64_t P = std::max<int64_t>(1, L - L / 4);  // the probe, shorter than the longest row
  // Every row another length (the longest sets the common length L), the probe at row 5.
  std::vector<int64_t> len{L, L / 2 + 1, 3, L - 1, L / 3 + 2, P, 1, L - 5};
  for (auto& n : len) n = std::clamp<int64_t>(n, 1, L);
  const auto rows = leak::probe_rows(c, o, B, L, 8), pads = leak::probe_rows(c, o, B, L, 9);
  std::vector<int64_t> ids(static_cast<size_t>(B * L));
  std::vector<uint8_t> valid(static_cast<size_t>(B * L), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t) {
      const size_t at = static_cast<size_t>(b * L + t);
      valid[at] = t < len[b];
      ids[at] = t < len[b] ? rows[b][t] : pads[b][t];  // pad content is arbitrary on purpose
    }
  const std::vector<int64_t> probe(rows[row].begin(), rows[row].begin() + P);
  const Tensor alone = leak::forward(*m, leak::ids_tensor(probe)).select(0, 0);
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {B, L});
  a.key_padding = bool_tensor(valid, {B, L});
  const Tensor batch = leak::forward(*m, a);
  std::vector<double> per;
  int64_t diverges = -1;
  leak::fold_gaps(per, diverges, 0, batch.select(0, row).narrow(0, 0, P), alone);
  std::string lens;
  for (int64_t n : len) lens += (lens.empty() ? "" : ", ") + std::to_string(n);
  return leak::make_consistency_check("batch_composition", per, diverges,
                                      leak::consistency_bound(c, L, max_abs(alone), false),
                                      "max |Δlogit|, the " + std::to_string(P) + "-token probe alone vs at row " +
                                          std::to_string(row) + " of " + std::to_string(B) + " rows right-padded to " +
                                          std::to_string(L) + " with key padding (row lengths " + lens + ")");
}

LeakCheck check_thread_count(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), B = 2;
  const Tensor ids = leak::ids_tensor(leak::probe_rows(c, o, B, L, 10));
  const auto logits_on = [&](int threads) {
    const cpu::OmpThreadsGuard guard(threads);
    return leak::forward(*m, ids);
  };
  const Tensor one = logits_on(1), two = logits_on(2);
  std::vector<double> per;
  int64_t diverges = -1;
  for (int64_t b = 0; b < B; ++b) leak::fold_gaps(per, diverges, 0, two.select(0, b), one.select(0, b));
  std::string detail = "max |Δlogit|, the parallel forward of " + std::to_string(B) + "x" + std::to_string(L) +
                       " tokens on 1 vs 2 OpenMP threads (omp_set_num_threads, restored after)";
  if (m->device() != Device::cpu) detail += "; the model runs on the GPU, where the host's threads only launch work";
  return leak::make_consistency_check("thread_count", per, diverges, leak::consistency_bound(c, L, max_abs(one), false),
                                      detail);
}

LeakCheck check_trainer_vs_sampler(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const nn::ModelConfig& c = model.config();
  const int64_t L = leak::probe_len(c, o), R = 4, row = 2;
  // Each row L + 1 tokens: inputs x = the first L, targets y = the next L (a training window).
  const auto windows = leak::probe_rows(c, o, R, L + 1, 11);
  std::vector<std::vector<int64_t>> xs;
  for (const auto& w : windows) xs.emplace_back(w.begin(), w.end() - 1);
  const std::vector<int32_t> targets(windows[row].begin() + 1, windows[row].end());

  // (a) The training step's forward: training mode, grad mode on, the batch of R rows with its
  // dropout stream, as train::batch_loss runs it. Dropout draws would make the two ways differ by
  // design, so a model with dropout runs as a copy with it zeroed.
  nn::ModelConfig tc = c;
  tc.dropout = 0;
  tc.attn_dropout = 0;
  const std::unique_ptr<nn::DecoderModel> trainer = copy_model(model, tc);
  trainer->train();
  Tensor trained;
  {
    const GradOn grad;
    nn::ForwardArgs a;
    a.ids = leak::ids_tensor(xs);
    a.rng = nn::RngContext{static_cast<uint64_t>(o.seed), 1};
    trained = trainer->forward(a).select(0, row).detach();
  }
  const std::vector<double> lp_train = train::token_logprobs(trained, targets);

  // (b) The sampler: the eval model decoding the same tokens one at a time through the KV cache,
  // each step's logits row scored alone.
  const leak::EvalModel m(model);
  nn::ModelCache cache = m->make_cache(1, L);
  std::vector<Tensor> steps;
  std::vector<double> per(static_cast<size_t>(L), 0.0);
  for (int64_t t = 0; t < L; ++t) {
    nn::ForwardArgs a;
    a.ids = leak::ids_tensor(std::vector<int64_t>{xs[row][t]});
    a.cache = &cache;
    steps.push_back(leak::forward(*m, a).select(0, 0));  // [1, V]
    const double lp = train::token_logprobs(steps.back(), {targets[t]})[0];
    const double d = std::abs(lp - lp_train[t]);
    per[t] = std::isnan(d) ? INFINITY : d;
  }
  const Tensor decoded = cat(steps, 0);
  const std::vector<double> logit_gap = leak::position_gaps(decoded, trained);
  const double scale = max_abs(trained);
  leak::ConsistencyBound bound = leak::consistency_bound(c, L, scale, leak::recurrent_decode(c));
  if (bound.threshold > 0) {
    // log p = z_t − lse(z): each term moves by at most max |Δz|.
    bound.threshold *= 2;
    bound.note += ", twice that for a log-prob z_t - lse(z)";
  }
  std::string detail = "max |Δ log-prob| (train::token_logprobs) of the probe's " + std::to_string(L) +
                       " next tokens: the training step's forward (training mode, grad mode on, row " +
                       std::to_string(row) + " of " + std::to_string(R) + ") vs decoding one token at a time " +
                       "through the KV cache in eval mode; max |Δlogit| " +
                       fmt(*std::max_element(logit_gap.begin(), logit_gap.end()));
  detail += c.dropout > 0 || c.attn_dropout > 0
                ? "; the training side runs a copy with dropout " + fmt(c.dropout) + " and attn_dropout " +
                      fmt(c.attn_dropout) + " set to 0 (dropout draws differ by design)"
                : "; the model has no dropout";
  return leak::make_consistency_check("trainer_vs_sampler", per, leak::first_argmax_divergence(decoded, trained), bound,
                                      detail);
}

LeakCheck check_batched_generation(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const nn::ModelConfig& c = m->config();
  const int64_t L = leak::probe_len(c, o), V = c.vocab_size;
  // Every context stays in its row's cache (P + N - 1 <= block_size), and N >= 2 so that at least
  // one step decodes the rows together (token 0 comes from each prompt's prefill alone).
  const int64_t N = std::min<int64_t>(std::max<int64_t>(2, L / 2), c.block_size);
  const int64_t longest = std::max<int64_t>(1, c.block_size - N + 1);
  // Four lengths, so the rows' caches, positions and RoPE angles all differ.
  std::vector<int64_t> len{L / 2, 1, L / 4 + 1, 3};
  for (auto& n : len) n = std::clamp<int64_t>(n, 1, std::min(L, longest));
  const auto rows = leak::probe_rows(c, o, static_cast<int64_t>(len.size()), L, 12);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < len.size(); ++i) prompts.emplace_back(rows[i].begin(), rows[i].begin() + len[i]);

  // (a) The rows together, through the sampler's own continuous batching; greedy, so the tokens are
  // a function of the logits alone. Each logits row is kept as the sampler draws from it.
  train::SampleOptions so;
  so.max_new_tokens = N;
  so.temperature = 0;
  std::vector<std::vector<float>> batched(prompts.size(), std::vector<float>(static_cast<size_t>(N * V)));
  const std::vector<train::Completion> done = train::generate_batch(
      *m, prompts, so, static_cast<int64_t>(prompts.size()), false, {},
      [&](size_t i, int64_t n, const float* logits) { std::copy(logits, logits + V, batched[i].begin() + n * V); });

  // (b) Each prompt alone: prefilled into a batch-1 KV cache, then fed the tokens the batch drew
  // one at a time, as train::generate decodes it.
  std::vector<double> per;
  int64_t diverges = -1;
  double scale = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    nn::ModelCache cache = m->make_cache(1, len[i] + N - 1);
    std::vector<Tensor> alone;
    for (int64_t n = 0; n < N; ++n) {
      nn::ForwardArgs a;
      if (n == 0) a.ids = leak::ids_tensor(std::vector<int64_t>(rows[i].begin(), rows[i].begin() + len[i]));
      else a.ids = leak::ids_tensor(std::vector<int64_t>{done[i].tokens[static_cast<size_t>(n - 1)]});
      a.cache = &cache;
      a.last_logits_only = true;
      alone.push_back(leak::forward(*m, a).reshape({1, V}).to(Device::cpu));
    }
    const Tensor want = cat(alone, 0).contiguous();
    Tensor got = Tensor::empty({N, V}, DType::f32);
    std::copy(batched[i].begin(), batched[i].end(), got.data<float>());
    scale = std::max(scale, max_abs(want));
    leak::fold_gaps(per, diverges, 0, got, want);
  }
  std::string lens;
  for (int64_t n : len) lens += (lens.empty() ? "" : ", ") + std::to_string(n);
  // Both ways decode a linear model through the same recurrent step, so no recurrent allowance.
  return leak::make_consistency_check(
      "batched_generation", per, diverges, leak::consistency_bound(c, L, scale, false),
      "max |Δlogit| over " + std::to_string(prompts.size()) + " prompts of " + lens + " tokens generating " +
          std::to_string(N) + " tokens each in one train::generate_batch (prefilled alone, then one forward per " +
          "step for every row, each row with its own KV cache) vs each prompt decoded alone through a batch-1 " +
          "KV cache on the same tokens; position = generated token");
}

const std::vector<std::string>& consistency_check_names() {
  static const std::vector<std::string> names{"kv_decode",          "chunked_prefill",   "padding_invariance",
                                              "packing_invariance", "batch_composition", "thread_count",
                                              "trainer_vs_sampler", "batched_generation"};
  return names;
}

std::vector<LeakCheck> run_consistency_checks(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  const auto skipped = not_applicable_checks(m->config());
  auto applies = [&](const std::string& name) {
    return std::none_of(skipped.begin(), skipped.end(), [&](const auto& s) { return s.first == name; });
  };
  // Each family once (kv_decode and chunked_prefill come together); a family that throws gives
  // its checks as failed with the error, so both modes list the same names.
  using V = std::vector<LeakCheck>;
  const std::vector<std::pair<std::vector<std::string>, std::function<V()>>> families{
      {{"kv_decode", "chunked_prefill"}, [&] { return check_train_vs_inference(*m, o); }},
      {{"padding_invariance"}, [&] { return check_padding(*m, o); }},
      {{"packing_invariance"}, [&] { return V{check_packing(*m, o)}; }},
      {{"batch_composition"}, [&] { return V{check_batch_composition(*m, o)}; }},
      {{"thread_count"}, [&] { return V{check_thread_count(*m, o)}; }},
      {{"trainer_vs_sampler"}, [&] { return V{check_trainer_vs_sampler(*m, o)}; }},
      {{"batched_generation"}, [&] { return V{check_batched_generation(*m, o)}; }},
  };
  std::vector<LeakCheck> out;
  for (const auto& [names, run] : families) {
    if (!applies(names.front())) continue;
    V got;
    std::string error;
    try {
      got = run();
    } catch (const std::exception& e) { error = e.what(); }
    for (const std::string& name : names) {
      const auto it = std::find_if(got.begin(), got.end(), [&](const LeakCheck& c) { return c.name == name; });
      out.push_back(it != got.end() ? *it : leak::make_check(name, INFINITY, 0, "error: " + error));
    }
  }
  return out;
}

NumericsComparison compare_numerics_modes(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  NumericsComparison r;
  {
    const NumericsGuard mode(Numerics::standard);
    r.standard = run_consistency_checks(model, o);
  }
  {
    const NumericsGuard mode(Numerics::invariant);
    r.invariant = run_consistency_checks(model, o);
  }
  return r;
}

}  // namespace qkv::analysis
