#include "train/evaluate.h"

#include "attention/attention.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"

namespace qkv::train {

Tensor batch_loss(const nn::DecoderModel& model, const Batch& batch, nn::RngContext rng, int64_t* masked_rows) {
  nn::ForwardArgs args;
  args.ids = batch.x;
  args.positions = batch.positions;
  args.key_padding = batch.key_padding;
  args.segment_ids = batch.segment_ids;
  args.rng = rng;
  if (masked_rows && batch.key_padding.defined()) {
    // Rows with no visible key (left padding makes them): counted, zero in the output, no loss.
    attn::AttentionOptions o;
    o.causal = true;
    o.key_padding = batch.key_padding;
    o.segment_ids = batch.segment_ids;
    *masked_rows += attn::count_fully_masked_rows({batch.x.size(0), 1, 1, batch.x.size(1), batch.x.size(1)}, o);
  }
  Tensor logits = model.forward(args);  // [B, T, V], on the model's device (inputs are moved there)
  const int64_t V = logits.size(2);
  return ag::cross_entropy(ag::reshape(logits, {-1, V}), batch.y.reshape({-1}).to(logits.device()), kIgnoreIndex);
}

std::vector<double> token_logprobs(const Tensor& logits, const std::vector<int32_t>& targets) {
  QKV_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(targets.size()), "[token_logprobs] logits ",
            shape_str(logits.shape()), " for ", targets.size(), " targets: need [N, V] with N = the target count");
  const Tensor z = logits.to(Device::cpu).to(DType::f32).contiguous();
  const int64_t V = z.size(1);
  std::vector<int64_t> t(targets.begin(), targets.end());
  for (size_t i = 0; i < t.size(); ++i)
    QKV_CHECK(t[i] >= 0 && t[i] < V, "[token_logprobs] target ", t[i], " at row ", i, " is outside [0, ", V, ")");
  const CrossEntropyResult ce = cross_entropy(z, from_vector_i64(t, {static_cast<int64_t>(t.size())}));
  const float* zp = z.data<float>();
  const float* lse = ce.lse.data<float>();
  std::vector<double> out(t.size());
  for (size_t i = 0; i < t.size(); ++i)
    out[i] = static_cast<double>(zp[static_cast<int64_t>(i) * V + t[i]]) - static_cast<double>(lse[i]);
  return out;
}

LossSum evaluate_split(const nn::DecoderModel& model, std::shared_ptr<const TokenSplit> split,
                       const BatcherOptions& opts, int64_t n_batches) {
  autograd::NoGradGuard no_grad;
  Batcher batcher(std::move(split), opts);
  LossSum s;
  for (int64_t i = 0; i < n_batches; ++i) {
    Batch b = batcher.next();
    if (b.n_targets == 0) continue;
    const double loss = batch_loss(model, b, {}).item();
    s.sum += loss * static_cast<double>(b.n_targets);
    s.tokens += b.n_targets;
  }
  return s;
}

std::vector<LossSum> evaluate_rows(const nn::DecoderModel& model, std::shared_ptr<const TokenSplit> split,
                                   const BatcherOptions& opts, int64_t n_batches) {
  autograd::NoGradGuard no_grad;
  Batcher batcher(std::move(split), opts);
  std::vector<LossSum> rows;
  for (int64_t i = 0; i < n_batches * opts.micro_batches; ++i) {
    const Batch b = batcher.next();
    nn::ForwardArgs args;
    args.ids = b.x;
    args.positions = b.positions;
    args.key_padding = b.key_padding;
    args.segment_ids = b.segment_ids;
    const Tensor logits = model.forward(args);  // [B, T, V]
    const Tensor y = b.y.to(logits.device());
    for (int64_t r = 0; r < b.x.size(0); ++r) {
      const CrossEntropyResult ce = cross_entropy(logits.select(0, r), y.select(0, r), kIgnoreIndex);
      rows.push_back({ce.loss.item() * static_cast<double>(ce.count), ce.count});
    }
  }
  return rows;
}

LossSum evaluate_windows(const nn::DecoderModel& model, std::span<const int32_t> tokens, const std::string& name,
                         int64_t rows_per_batch) {
  autograd::NoGradGuard no_grad;
  EvalWindows windows(tokens, model.config().block_size, name);
  QKV_CHECK(windows.n_windows() > 0, name, ": ", tokens.size(),
            " tokens is fewer than one window of block_size + 1 = ", model.config().block_size + 1);
  LossSum s;
  Batch b;
  while (windows.next(rows_per_batch, b)) {
    const double loss = batch_loss(model, b, {}).item();
    s.sum += loss * static_cast<double>(b.x.numel());
    s.tokens += b.x.numel();
  }
  return s;
}

TokenScores score_tokens(const nn::DecoderModel& model, std::span<const int32_t> tokens, const std::string& name,
                         int64_t rows_per_batch) {
  autograd::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size()), T = model.config().block_size;
  QKV_CHECK(n >= 2, name, ": ", n, " tokens: per-token scores need at least 2 (a context token and a target)");
  TokenScores out;
  // Window starts: full windows go rows_per_batch at a time, the partial one alone.
  std::vector<int64_t> starts;
  for (int64_t s = 0; n - s >= 2; s += T + 1) starts.push_back(s);
  for (size_t w = 0; w < starts.size();) {
    const int64_t len = std::min(T + 1, n - starts[w]);
    size_t end = w + 1;
    while (end < starts.size() && static_cast<int64_t>(end - w) < rows_per_batch &&
           std::min(T + 1, n - starts[end]) == len)
      ++end;
    const int64_t rows = static_cast<int64_t>(end - w);
    std::vector<int64_t> ids;
    for (size_t r = w; r < end; ++r)
      ids.insert(ids.end(), tokens.begin() + starts[r], tokens.begin() + starts[r] + len - 1);
    nn::ForwardArgs args;
    args.ids = from_vector_i64(ids, {rows, len - 1});
    const Tensor logits = model.forward(args);  // [rows, len - 1, V]
    for (size_t r = w; r < end; ++r) {
      std::vector<int32_t> targets(tokens.begin() + starts[r] + 1, tokens.begin() + starts[r] + len);
      const auto lp = token_logprobs(logits.select(0, static_cast<int64_t>(r - w)), targets);
      for (int64_t i = 0; i + 1 < len; ++i) {
        out.index.push_back(starts[r] + 1 + i);
        out.token.push_back(targets[static_cast<size_t>(i)]);
        out.logprob.push_back(lp[static_cast<size_t>(i)]);
      }
    }
    w = end;
  }
  return out;
}

}  // namespace qkv::train
