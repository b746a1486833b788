#include "train/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/grad_mode.h"
#include "tensor/cpu/invariant_matmul.h"
#include "tensor/ops.h"
#include "tensor/philox.h"

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

std::vector<int32_t> generate(const nn::DecoderModel& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& opts, const std::function<void(int32_t)>& on_token) {
  QKV_CHECK(!prompt.empty(),
            "[sample] the prompt encodes to no tokens (give --prompt, or a tokenizer with a token for it)");
  QKV_CHECK(opts.top_p > 0 && opts.top_p <= 1, "[sample] top_p must be in (0, 1], got ", opts.top_p);
  QKV_CHECK(opts.top_k >= 0, "[sample] top_k must be >= 0 (0 = off), got ", opts.top_k);
  // An infinite temperature would flatten every row to uniform draws; NaN would fall to argmax.
  QKV_CHECK(std::isfinite(opts.temperature) && opts.temperature >= 0,
            "[sample] temperature must be a finite number >= 0 (0 = greedy), got ", opts.temperature);
  QKV_CHECK(opts.max_new_tokens >= 0, "[sample] max_new_tokens must be >= 0, got ", opts.max_new_tokens);
  autograd::NoGradGuard no_grad;
  // numerics = invariant: the Linear weights packed once for the whole generation (the model is
  // const here); the same bits as unpacked, read faster by the decode steps.
  const cpu::PackedWeightScope packed_weights;
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  QKV_CHECK(opts.token_count >= 0 && opts.token_count <= V, "[sample] the tokenizer's ", opts.token_count,
            " tokens must be at most the model's vocabulary of ", V);
  const int64_t drawable = opts.token_count > 0 ? opts.token_count : V;  // ids past the tokenizer's have no text
  for (int32_t id : prompt)
    QKV_CHECK(id >= 0 && id < V, "[sample] prompt token ", id, " is outside the vocabulary of ", V);
  std::vector<int32_t> ctx = prompt, out;
  nn::ModelCache cache;
  bool cache_live = false;  // the cache holds exactly ctx (positions 0..)
  if (opts.kv_cache) cache = model.make_cache(1, T);

  auto ids_tensor = [](const std::vector<int32_t>& ids, size_t from) {
    std::vector<int64_t> v(ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
    return from_vector_i64(v, {1, static_cast<int64_t>(v.size())});
  };
  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    Tensor logits;
    const bool fits = static_cast<int64_t>(ctx.size()) <= T;
    nn::ForwardArgs args;
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
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(n), static_cast<uint32_t>(n >> 32), 0x5a3f1e00u, 0,
                                    static_cast<uint32_t>(opts.seed), static_cast<uint32_t>(opts.seed >> 32));
    const int32_t next = pick_token(row.data<float>(), drawable, opts, uniform53_from_bits(r.v[0], r.v[1]));
    ctx.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

}  // namespace qkv::train
