#include "train/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "tensor/cpu/invariant_matmul.h"
#include "tensor/ops.h"
#include "tensor/philox.h"
#include "train/evaluate.h"

namespace qkv::train {

int32_t pick_token(const float* logits, int64_t V, const SampleOptions& opts, double u) {
  if (opts.temperature <= 0) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  // p_i ∝ exp((l_i - max) / T), restricted to the top-k, then to the nucleus of mass top_p.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  // Ties broken by token id, so the order (and the draw) is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = V;
  if (opts.top_k > 0) keep = std::min<int64_t>(keep, opts.top_k);
  const double mx = logits[order[0]];
  std::vector<double> p(static_cast<size_t>(keep));
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i] = std::exp((logits[order[i]] - mx) / opts.temperature);
  if (opts.top_p < 1.0) {
    double mass = 0;
    int64_t n = 0;
    while (n < keep && mass < opts.top_p * total) mass += p[n++];
    keep = std::max<int64_t>(n, 1);
    total = 0;
    for (int64_t i = 0; i < keep; ++i) total += p[i];
  }
  double acc = 0;
  const double target = u * total;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
}

namespace {

// The checks generate and generate_batch share; returns the count of drawable ids.
int64_t check_options(const nn::DecoderModel& model, const SampleOptions& opts) {
  QKV_CHECK(opts.top_p > 0 && opts.top_p <= 1, "[sample] top_p must be in (0, 1], got ", opts.top_p);
  QKV_CHECK(opts.top_k >= 0, "[sample] top_k must be >= 0 (0 = off), got ", opts.top_k);
  // An infinite temperature would flatten every row to uniform draws; NaN would fall to argmax.
  QKV_CHECK(std::isfinite(opts.temperature) && opts.temperature >= 0,
            "[sample] temperature must be a finite number >= 0 (0 = greedy), got ", opts.temperature);
  QKV_CHECK(opts.max_new_tokens >= 0, "[sample] max_new_tokens must be >= 0, got ", opts.max_new_tokens);
  const int64_t V = model.config().vocab_size;
  QKV_CHECK(opts.token_count >= 0 && opts.token_count <= V, "[sample] the tokenizer's ", opts.token_count,
            " tokens must be at most the model's vocabulary of ", V);
  return opts.token_count > 0 ? opts.token_count : V;  // ids past the tokenizer's have no text
}

void check_prompt_ids(const std::vector<int32_t>& prompt, int64_t V) {
  for (int32_t id : prompt)
    QKV_CHECK(id >= 0 && id < V, "[sample] prompt token ", id, " is outside the vocabulary of ", V);
}

// Token n of a completion: the pick from `row` (V floats) with the uniform at counter (n, stream).
int32_t draw(const float* row, int64_t drawable, const SampleOptions& opts, int64_t n, uint32_t stream) {
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), 0x5a3f1e00u, stream,
                                  static_cast<uint32_t>(opts.seed), static_cast<uint32_t>(opts.seed >> 32));
  return pick_token(row, drawable, opts, uniform53_from_bits(r.v[0], r.v[1]));
}

Tensor ids_tensor(const std::vector<int32_t>& ids, size_t from) {
  std::vector<int64_t> v(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
  return from_vector_i64(v, {1, static_cast<int64_t>(v.size())});
}

}  // namespace

std::vector<int32_t> generate(const nn::DecoderModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opts, const std::function<void(int32_t)>& on_token,
                              std::vector<double>* logprobs) {
  QKV_CHECK(!prompt.empty(),
            "[sample] the prompt encodes to no tokens (give --prompt, or a tokenizer with a token for it)");
  const int64_t drawable = check_options(model, opts);
  autograd::NoGradGuard no_grad;
  // numerics = invariant: each Linear weight packed once for the whole generation (the model is
  // const here); the same bits as unpacked, read faster by the decode steps.
  const cpu::PackedWeightScope packed_weights;
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  check_prompt_ids(prompt, V);
  std::vector<int32_t> ctx = prompt, out;
  if (logprobs) logprobs->clear();
  nn::ModelCache cache;
  bool cache_live = false;  // the cache holds exactly ctx (positions 0..)
  if (opts.kv_cache) cache = model.make_cache(1, T);

  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    Tensor logits;
    const bool fits = static_cast<int64_t>(ctx.size()) <= T;
    nn::ForwardArgs args;
    args.last_logits_only = true;
    if (opts.kv_cache && fits) {
      // Feed what the cache has not seen: the whole prompt first (prefill), then one token.
      const size_t seen = cache_live ? static_cast<size_t>(cache.length()) : 0;
      if (!cache_live) {
        cache.clear();
        cache_live = true;
      }
      args.ids = ids_tensor(ctx, seen);
      args.cache = &cache;
      logits = model.forward(args);
    } else {
      // Recompute over the last T tokens (nanoGPT's crop).
      const size_t from = ctx.size() > static_cast<size_t>(T) ? ctx.size() - static_cast<size_t>(T) : 0;
      args.ids = ids_tensor(ctx, from);
      logits = model.forward(args);
    }
    const int64_t last = logits.size(1) - 1;
    Tensor row = logits.select(0, 0).select(0, last).contiguous().to(Device::cpu);  // pick on the host
    const int32_t next = draw(row.data<float>(), drawable, opts, n, opts.stream);
    if (logprobs) logprobs->push_back(token_logprobs(row.reshape({1, V}), {next})[0]);
    ctx.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

std::vector<Completion> generate_batch(const nn::DecoderModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                       const SampleOptions& opts, int64_t batch_size, bool logprobs,
                                       const std::function<void(size_t, const Completion&)>& on_done,
                                       const LogitsObserver& on_logits) {
  const int64_t drawable = check_options(model, opts);
  QKV_CHECK(batch_size >= 1, "[sample] the batch size must be >= 1, got ", batch_size);
  QKV_CHECK(opts.kv_cache,
            "[sample] batched generation decodes through per-row KV caches (kv_cache = false is "
            "for single-prompt generation)");
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    QKV_CHECK(!prompts[i].empty(), "[sample] prompt ", i, " encodes to no tokens");
    check_prompt_ids(prompts[i], V);
    const auto need = static_cast<int64_t>(prompts[i].size()) + opts.max_new_tokens - 1;
    QKV_CHECK(need <= T, "[sample] prompt ", i, ": ", prompts[i].size(), " tokens + max_new_tokens ",
              opts.max_new_tokens, " needs a context of ", need, " tokens, past model.block_size ", T,
              "; batched generation keeps every context in its KV cache (shorten the prompt or max_new_tokens)");
  }
  autograd::NoGradGuard no_grad;
  // numerics = invariant: each Linear weight packed once for the whole generation (the model is
  // const here); the same bits as unpacked, read faster by the decode steps.
  const cpu::PackedWeightScope packed_weights;
  std::vector<Completion> done(prompts.size());
  std::vector<bool> finished(prompts.size(), false);
  size_t next_prompt = 0, next_report = 0;
  struct Row {
    size_t index;
    nn::ModelCache cache;
  };
  std::vector<Row> active;

  // Token n of prompt i from its logits row (V floats on the host); true once the prompt is complete.
  auto take = [&](size_t i, const Tensor& row) {
    Completion& c = done[i];
    const auto n = static_cast<int64_t>(c.tokens.size());
    if (on_logits) on_logits(i, n, row.data<float>());
    const int32_t next = draw(row.data<float>(), drawable, opts, n, static_cast<uint32_t>(i));
    if (logprobs) c.logprobs.push_back(token_logprobs(row.reshape({1, V}), {next})[0]);
    c.tokens.push_back(next);
    return static_cast<int64_t>(c.tokens.size()) >= opts.max_new_tokens;
  };
  auto finish = [&](size_t i) {
    finished[i] = true;
    for (; next_report < prompts.size() && finished[next_report]; ++next_report)
      if (on_done) on_done(next_report, done[next_report]);
  };
  while (next_prompt < prompts.size() || !active.empty()) {
    // Refill: prefill each new prompt alone, draw its first token, then let it join the batch.
    while (static_cast<int64_t>(active.size()) < batch_size && next_prompt < prompts.size()) {
      const size_t i = next_prompt++;
      if (opts.max_new_tokens == 0) {
        finish(i);
        continue;
      }
      const auto P = static_cast<int64_t>(prompts[i].size());
      Row r{i, model.make_cache(1, P + opts.max_new_tokens - 1)};
      nn::ForwardArgs args;
      args.ids = ids_tensor(prompts[i], 0);
      args.cache = &r.cache;
      args.last_logits_only = true;
      const Tensor logits = model.forward(args);
      if (take(i, logits.select(0, 0).select(0, 0).contiguous().to(Device::cpu))) finish(i);
      else active.push_back(std::move(r));
    }
    if (active.empty()) continue;
    // One decoding step for every active row: its last token, against its own cache.
    const auto B = static_cast<int64_t>(active.size());
    std::vector<int64_t> ids;
    nn::ForwardArgs args;
    for (Row& r : active) {
      ids.push_back(done[r.index].tokens.back());
      args.row_caches.push_back(&r.cache);
    }
    args.ids = from_vector_i64(ids, {B, 1});
    const Tensor logits = model.forward(args).reshape({B, V}).contiguous().to(Device::cpu);
    std::vector<Row> still;
    for (int64_t b = 0; b < B; ++b) {
      Row& r = active[static_cast<size_t>(b)];
      if (take(r.index, logits.select(0, b))) finish(r.index);
      else still.push_back(std::move(r));
    }
    active = std::move(still);
  }
  return done;
}

}  // namespace qkv::train
