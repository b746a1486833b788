// The toy transduction that shows nn::EncoderDecoder (and so nn::CrossAttention) trains: reverse a
// random string. Shared by examples/reverse_strings.cpp and tests/attention/test_cross_attention.cpp.
//
// Vocabulary: 0 PAD, 1 BOS, 2 EOS, 3.. the alphabet. A string s of length n in [min_len, max_len]:
//   source  [s_1 .. s_n, PAD ..]              S = max_len tokens, padding mask true on s
//   decoder [BOS, s_n .. s_1, PAD ..]         T = max_len + 1 tokens (input)
//   target  [s_n .. s_1, EOS, -100 ..]        (ignored by the loss past EOS)
// Held out: the strings whose hash is 0 mod 10 are never drawn for training and are the only ones
// evaluated, so accuracy is measured on strings the model has never seen (short strings too).
// Accuracy = exact-sequence match of greedy decoding (n reversed symbols, then EOS).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/encoder_decoder.h"
#include "tensor/ops.h"
#include "train/clip.h"
#include "train/optimizer.h"

namespace qkv::examples {

struct ReverseTask {
  int64_t alphabet = 10, min_len = 1, max_len = 8;
  static constexpr int64_t kPad = 0, kBos = 1, kEos = 2;
  int64_t vocab() const { return 3 + alphabet; }
};

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline bool held_out(const std::vector<int64_t>& s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the symbols
  for (int64_t c : s) h = (h ^ static_cast<uint64_t>(c)) * 1099511628211ULL;
  return h % 10 == 0;
}

// `n` strings from stream `seed`, all held out (heldout) or none (training).
inline std::vector<std::vector<int64_t>> draw_strings(const ReverseTask& t, int64_t n, uint64_t seed, bool heldout) {
  std::vector<std::vector<int64_t>> out;
  uint64_t s = seed * 0x2545f4914f6cdd1dULL + 12345;
  while (static_cast<int64_t>(out.size()) < n) {
    const int64_t len =
        t.min_len + static_cast<int64_t>(splitmix64(s) % static_cast<uint64_t>(t.max_len - t.min_len + 1));
    std::vector<int64_t> str;
    for (int64_t i = 0; i < len; ++i)
      str.push_back(3 + static_cast<int64_t>(splitmix64(s) % static_cast<uint64_t>(t.alphabet)));
    if (held_out(str) == heldout) out.push_back(std::move(str));
  }
  return out;
}

struct ReverseBatch {
  Tensor src, src_padding, dec_in, target;  // [B, S] i64, [B, S] bool, [B, T] i64, [B·T] i64
};

inline ReverseBatch make_batch(const ReverseTask& t, const std::vector<std::vector<int64_t>>& strings) {
  const int64_t B = static_cast<int64_t>(strings.size()), S = t.max_len, T = t.max_len + 1;
  std::vector<int64_t> src(B * S, ReverseTask::kPad), dec(B * T, ReverseTask::kPad), tgt(B * T, -100);
  ReverseBatch b;
  b.src_padding = Tensor::empty({B, S}, DType::boolean);
  for (int64_t r = 0; r < B; ++r) {
    const auto& s = strings[r];
    const int64_t n = static_cast<int64_t>(s.size());
    dec[r * T] = ReverseTask::kBos;
    for (int64_t i = 0; i < S; ++i) b.src_padding.data<bool>()[r * S + i] = i < n;
    for (int64_t i = 0; i < n; ++i) {
      src[r * S + i] = s[i];
      dec[r * T + 1 + i] = s[n - 1 - i];
      tgt[r * T + i] = s[n - 1 - i];
    }
    tgt[r * T + n] = ReverseTask::kEos;
  }
  b.src = from_vector_i64(src, {B, S});
  b.dec_in = from_vector_i64(dec, {B, T});
  b.target = from_vector_i64(tgt, {B * T});
  return b;
}

// Exact-sequence accuracy of greedy decoding over `strings`.
inline double exact_accuracy(const nn::EncoderDecoder& m, const ReverseTask& t,
                             const std::vector<std::vector<int64_t>>& strings) {
  int64_t right = 0;
  const int64_t chunk = 256;
  for (size_t at = 0; at < strings.size(); at += chunk) {
    const std::vector<std::vector<int64_t>> part(strings.begin() + at,
                                                 strings.begin() + std::min(strings.size(), at + chunk));
    const ReverseBatch b = make_batch(t, part);
    const auto out = m.greedy(b.src, b.src_padding, ReverseTask::kBos, ReverseTask::kEos, t.max_len + 1);
    for (size_t r = 0; r < part.size(); ++r) {
      std::vector<int64_t> want(part[r].rbegin(), part[r].rend());
      want.push_back(ReverseTask::kEos);
      right += std::vector<int64_t>(out[r].begin(), out[r].begin() + static_cast<int64_t>(want.size())) == want;
    }
  }
  return static_cast<double>(right) / static_cast<double>(strings.size());
}

struct ReverseTrainOptions {
  int64_t steps = 1500, batch = 64, warmup = 100, eval_every = 250, heldout = 1000;
  double lr = 3e-3, weight_decay = 0.01, clip = 1.0;
  uint64_t seed = 1;
  double target_accuracy = 0.99;  // stop at an evaluation reaching it (0: run every step)
};

struct ReverseTrainReport {
  int64_t steps = 0;
  double loss = 0, accuracy = 0, seconds = 0;
};

// AdamW with linear warmup then cosine decay to lr/10. `progress(step, loss, accuracy)` is called
// at every evaluation (accuracy on the held-out strings).
inline ReverseTrainReport train_reverse(nn::EncoderDecoder& m, const ReverseTask& t, const ReverseTrainOptions& o,
                                        const std::function<void(int64_t, double, double)>& progress = {}) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<autograd::OptimParam> params;
  std::vector<Tensor> tensors;
  for (const auto& p : m.named_parameters()) {
    params.push_back({p.name, p.tensor, p.decay && p.tensor.dim() >= 2});
    tensors.push_back(p.tensor);
  }
  train::AdamWOptions ao;
  ao.lr = o.lr;
  ao.weight_decay = o.weight_decay;
  train::AdamW opt(params, ao);
  const auto heldout = draw_strings(t, o.heldout, o.seed + 1000003, true);
  ReverseTrainReport rep;
  m.train();
  for (int64_t step = 1; step <= o.steps; ++step) {
    const ReverseBatch b =
        make_batch(t, draw_strings(t, o.batch, o.seed * 1000003 + static_cast<uint64_t>(step), false));
    autograd::zero_grad(tensors);
    const Tensor logits = m.forward(b.src, b.src_padding, b.dec_in);
    const Tensor loss = ag::cross_entropy(ag::reshape(logits, {-1, t.vocab()}), b.target);
    autograd::backward(loss);
    const double frac = static_cast<double>(step) / static_cast<double>(o.steps);
    const double lr = step <= o.warmup ? o.lr * static_cast<double>(step) / static_cast<double>(o.warmup)
                                       : o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * frac)));
    opt.step(lr, train::clip_scale(train::global_grad_norm(tensors), o.clip));
    rep.steps = step;
    rep.loss = loss.item();
    if (step % o.eval_every == 0 || step == o.steps) {
      m.eval();
      rep.accuracy = exact_accuracy(m, t, heldout);
      m.train();
      if (progress) progress(step, rep.loss, rep.accuracy);
      if (o.target_accuracy > 0 && rep.accuracy >= o.target_accuracy) break;
    }
  }
  m.eval();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return rep;
}

}  // namespace qkv::examples
