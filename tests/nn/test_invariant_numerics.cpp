// numerics = invariant (tensor/numerics.h): a token's logits are bitwise a function of its prefix
// and the weights, however the forward was batched, chunked, cached or threaded. Each case
// computes one sequence's logits several ways and compares them bit for bit (max |Δ| == 0).
// The last case shows the inputs reach the regime the mode guards: with the standard kernels the
// same comparisons differ.
#include <catch2/catch.hpp>
#include <array>
#include <cstring>

#include "autograd/grad_mode.h"
#include "compare_util.h"
#include "model_fixtures.h"
#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"

using namespace qkv;
using test::with_threads;

namespace {

// ffn_hidden 402, not a multiple of 8: elementwise kernels meet their vector tails mid-row.
nn::ModelConfig gpt2_like() { return test::ragged_gpt2(/*ffn_hidden=*/402, /*block_size=*/96); }
nn::ModelConfig llama_like() { return test::ragged_llama(/*ffn_hidden=*/256, /*block_size=*/96); }

std::vector<int64_t> tokens(int64_t n, uint64_t seed, int64_t vocab) { return test::tokens<int64_t>(n, seed, vocab); }

// Logits [T, V] of `seq` in one forward of batch 1.
Tensor whole(const nn::DecoderModel& m, const std::vector<int64_t>& seq) {
  autograd::NoGradGuard ng;
  nn::ForwardArgs a;
  a.ids = from_vector_i64(seq, {1, static_cast<int64_t>(seq.size())});
  return m.forward(a).select(0, 0);
}

// The last position's logits [1, V] alone (ForwardArgs::last_logits_only, a sampler's prefill)
// after a prefill of all but `tail` tokens through the cache.
Tensor last_only(const nn::DecoderModel& m, const std::vector<int64_t>& seq, int64_t tail) {
  autograd::NoGradGuard ng;
  nn::ModelCache cache = m.make_cache(1, static_cast<int64_t>(seq.size()));
  const auto split = seq.end() - tail;
  nn::ForwardArgs a;
  a.cache = &cache;
  a.ids = from_vector_i64(std::vector<int64_t>(seq.begin(), split), {1, static_cast<int64_t>(seq.size()) - tail});
  m.forward(a);
  nn::ForwardArgs b;
  b.cache = &cache;
  b.last_logits_only = true;
  b.ids = from_vector_i64(std::vector<int64_t>(split, seq.end()), {1, tail});
  return m.forward(b).select(0, 0);
}

// The same through the KV cache in chunks of `chunk` tokens (1: token-by-token decoding).
Tensor chunked(const nn::DecoderModel& m, const std::vector<int64_t>& seq, int64_t chunk) {
  autograd::NoGradGuard ng;
  nn::ModelCache cache = m.make_cache(1, static_cast<int64_t>(seq.size()));
  std::vector<Tensor> parts;
  for (size_t s = 0; s < seq.size(); s += static_cast<size_t>(chunk)) {
    const size_t e = std::min(seq.size(), s + static_cast<size_t>(chunk));
    nn::ForwardArgs a;
    a.cache = &cache;
    a.ids = from_vector_i64(std::vector<int64_t>(seq.begin() + s, seq.begin() + e), {1, static_cast<int64_t>(e - s)});
    parts.push_back(m.forward(a).select(0, 0));
  }
  return cat(parts, 0);
}

// Row `row` of a batch of `batch` rows of the same length whose other rows hold other tokens.
Tensor among_others(const nn::DecoderModel& m, const std::vector<int64_t>& seq, int64_t batch, int64_t row) {
  autograd::NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(seq.size());
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < batch; ++b) {
    const auto r = b == row ? seq : tokens(T, 100 + b, m.config().vocab_size);
    ids.insert(ids.end(), r.begin(), r.end());
  }
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {batch, T});
  return m.forward(a).select(0, row);
}

// `seq` right-padded to `len` with key padding (the padded keys masked): its first T rows.
Tensor padded(const nn::DecoderModel& m, const std::vector<int64_t>& seq, int64_t len) {
  autograd::NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(seq.size());
  std::vector<int64_t> ids = seq;
  ids.resize(static_cast<size_t>(len), 0);
  std::vector<int64_t> keep(static_cast<size_t>(len), 0);
  std::fill(keep.begin(), keep.begin() + T, 1);
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {1, len});
  a.key_padding = from_vector_i64(keep, {1, len}, DType::boolean);
  return m.forward(a).select(0, 0).narrow(0, 0, T);
}

// `seq` left-padded to `len` (positions counted from its first real token).
Tensor left_padded(const nn::DecoderModel& m, const std::vector<int64_t>& seq, int64_t len) {
  autograd::NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(seq.size()), P = len - T;
  std::vector<int64_t> ids(static_cast<size_t>(P), 0), keep(static_cast<size_t>(P), 0), pos(static_cast<size_t>(P), 0);
  ids.insert(ids.end(), seq.begin(), seq.end());
  keep.resize(static_cast<size_t>(len), 1);
  for (int64_t i = 0; i < T; ++i) pos.push_back(i);
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {1, len});
  a.key_padding = from_vector_i64(keep, {1, len}, DType::boolean);
  a.positions = from_vector_i64(pos, {1, len});
  return m.forward(a).select(0, 0).narrow(0, P, T);
}

// `seq` packed after another document in one row (segment ids, positions restarting at 0).
Tensor packed(const nn::DecoderModel& m, const std::vector<int64_t>& seq) {
  autograd::NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(seq.size()), P = 13;
  std::vector<int64_t> ids = tokens(P, 77, m.config().vocab_size), seg(static_cast<size_t>(P), 0), pos;
  ids.insert(ids.end(), seq.begin(), seq.end());
  seg.resize(static_cast<size_t>(P + T), 1);
  for (int64_t i = 0; i < P; ++i) pos.push_back(i);
  for (int64_t i = 0; i < T; ++i) pos.push_back(i);
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids, {1, P + T});
  a.segment_ids = from_vector_i64(seg, {1, P + T});
  a.positions = from_vector_i64(pos, {1, P + T});
  return m.forward(a).select(0, 0).narrow(0, P, T);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu).contiguous(), y = b.to(Device::cpu).contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data<float>(), y.data<float>(), x.numel() * sizeof(float)) == 0;
}

// A sliding window and the strided pattern: a row's keys start past key 0, where a block's first
// row and a row alone begin at different keys.
nn::ModelConfig windowed() {
  nn::ModelConfig c = llama_like();
  c.window = 9;
  return c;
}
nn::ModelConfig strided() {
  nn::ModelConfig c = gpt2_like();
  c.pattern.kind = attn::Pattern::strided;
  c.pattern.stride = 5;
  c.pattern.local = 3;
  return c;
}

}  // namespace

TEST_CASE("invariant numerics: a token's logits do not depend on batch, chunking, cache, padding or threads",
          "[invariant][exact][model]") {
  const NumericsGuard mode(Numerics::invariant);
  for (const nn::ModelConfig& mc : {gpt2_like(), llama_like(), windowed(), strided()}) {
    nn::DecoderModel m(mc);
    m.init_weights(5);
    m.eval();
    const auto seq = tokens(71, 1, mc.vocab_size);
    const Tensor ref = with_threads(2, [&] { return whole(m, seq); });
    INFO("family " << nn::family_name(mc.family) << ", window " << mc.window << ", pattern "
                   << attn::pattern_name(mc.pattern.kind));
    for (int64_t chunk : {1, 7, 64}) {
      INFO("chunk " << chunk);
      CHECK(bitwise_equal(chunked(m, seq, chunk), ref));
    }
    for (int64_t batch : {2, 8}) {
      INFO("batch " << batch);
      CHECK(bitwise_equal(among_others(m, seq, batch, batch - 1), ref));
    }
    CHECK(bitwise_equal(padded(m, seq, 96), ref));
    CHECK(bitwise_equal(left_padded(m, seq, 90), ref));
    CHECK(bitwise_equal(packed(m, seq), ref));
    for (int64_t tail : {1, 9}) {
      INFO("last position only, after " << tail << " tokens");
      CHECK(bitwise_equal(last_only(m, seq, tail), ref.narrow(0, 70, 1)));
    }
    CHECK(bitwise_equal(with_threads(1, [&] { return whole(m, seq); }), ref));
    CHECK(bitwise_equal(with_threads(1, [&] { return chunked(m, seq, 1); }), ref));
  }
}

TEST_CASE("standard numerics: the same comparisons differ (the checks above are not vacuous)", "[invariant][model]") {
  // Wide enough that OpenBLAS's GEMV (decoding) and GEMM (whole sequence) sum in other orders.
  nn::ModelConfig mc = gpt2_like();
  mc.n_embd = 256;
  mc.ffn_hidden = 1024;
  nn::DecoderModel m(mc);
  m.init_weights(5);
  m.eval();
  const auto seq = tokens(40, 2, mc.vocab_size);
  const NumericsGuard mode(Numerics::standard);
  const Tensor ref = whole(m, seq);
  const double gap = max_abs_diff(chunked(m, seq, 1), ref);
  CHECK(gap > 0);
  CHECK(gap < 1e-3);
  // The invariant mode's logits are a different rounding of the same function.
  const NumericsGuard inv(Numerics::invariant);
  CHECK(max_abs_diff(whole(m, seq), ref) < 1e-3);
  CHECK(max_abs_diff(chunked(m, seq, 1), whole(m, seq)) == 0.0);
}

TEST_CASE("invariant numerics on CUDA: the Linear kernel equals the CPU's bits; logits as on the CPU",
          "[invariant][cuda]") {
  if (!test::cuda_device_present()) return;
  const NumericsGuard mode(Numerics::invariant);
  // The CUDA invariant GEMM runs the CPU kernel's order: fma over k from +0, then + bias.
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{1, 37, 100}, {70, 33, 17}, {5, 300, 768}}) {
    const Tensor x = randn({m, k}, 31, 0, 0.0, 1.0, DType::f32), w = randn({n, k}, 32, 0, 0.0, 0.1, DType::f32);
    const Tensor b = randn({n}, 33, 0, 0.0, 0.1, DType::f32);
    const Tensor cpu_y = linear(x, w, b);
    const Tensor gpu_y = linear(x.to(Device::cuda), w.to(Device::cuda), b.to(Device::cuda)).to(Device::cpu);
    INFO("M " << m << " N " << n << " K " << k);
    CHECK(bitwise_equal(gpu_y, cpu_y));
    CHECK(bitwise_equal(linear(x.to(Device::cuda), w.to(Device::cuda), Tensor()).to(Device::cpu),
                        linear(x, w, Tensor())));
  }
  // The model on the device: its CUDA attention visits a row's visible keys one by one in key
  // order, so decoding, chunks, batches and padding give its whole-sequence logits bit for bit.
  nn::ModelConfig mc = llama_like();
  mc.n_layer = 1;
  nn::DecoderModel model(mc);
  model.init_weights(5);
  model.eval();
  model.to(Device::cuda);
  const auto seq = tokens(23, 1, mc.vocab_size);
  const Tensor ref = whole(model, seq).to(Device::cpu);
  CHECK(bitwise_equal(chunked(model, seq, 1).to(Device::cpu), ref));
  CHECK(bitwise_equal(chunked(model, seq, 7).to(Device::cpu), ref));
  CHECK(bitwise_equal(among_others(model, seq, 3, 2).to(Device::cpu), ref));
  CHECK(bitwise_equal(packed(model, seq).to(Device::cpu), ref));
}
