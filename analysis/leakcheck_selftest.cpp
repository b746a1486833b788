// The self-test (does the detector catch real bugs?) and the data-leakage checks.
//
// Self-test: every planted fault (Fault in leakcheck.h) is planted in turn in each self-test
// model (PlantedFault: the model's attention ops replaced by FaultyAttention below) and all model
// checks run on it; a fault is detected when at least one check fails,
// and with no fault planted every check must pass. Some faults only show under conditions the
// user's model may lack (a window, GQA, RoPE, several heads, attention dropout), so besides the
// user's model the self-test always builds a probe model that has them all: llama-style, RoPE,
// GQA 4:2 (two kv groups of two), a sliding window shorter than the probe, init std 0.2 so the
// attention is far from uniform and a changed scale or mask moves its output well above rounding.
#include <algorithm>
#include <cmath>

#include "attention/mask.h"
#include "attention/rope.h"
#include "autograd/grad_mode.h"
#include "autograd/functions.h"
#include "data/leakage.h"
#include "tensor/ops.h"
#include "analysis/leakcheck_internal.h"

namespace qkv::analysis {

namespace {

using attn::AttentionOptions;

bool wrong_rules_fault(Fault f) {
  return f == Fault::causal_reversed || f == Fault::top_left_causal || f == Fault::window_off_by_one ||
         f == Fault::gqa_modulo;
}
bool wrong_softmax_fault(Fault f) { return f == Fault::softmax_over_queries || f == Fault::mask_after_softmax; }
bool online_softmax_fault(Fault f) { return f == Fault::softmax_no_max_shift || f == Fault::softmax_no_rescale; }

attn::AttentionShape shape_of(const Tensor& q, const Tensor& k) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2)};
}

// `f`'s wrong mask rules, made from the right ones `r` for `s`.
attn::MaskRules wrong_rules(Fault f, attn::MaskRules r, const attn::AttentionShape& s) {
  switch (f) {
    case Fault::causal_reversed:  // keys j >= pos instead of j <= pos (a window then hides nothing more)
      if (r.has_hi) {
        r.has_hi = false;
        r.has_lo = true;
        r.lo = 0;
      }
      break;
    case Fault::top_left_causal:
      r.q_offset = 0;
      break;  // query i at position i
    case Fault::window_off_by_one:
      r.lo -= 1;
      break;                 // pos - w <= j: one key too many
    case Fault::gqa_modulo:  // query head h reads kv head h % Hkv
      for (size_t h = 0; h < r.kv_head.size(); ++h) r.kv_head[h] = static_cast<int64_t>(h) % s.kv_heads;
      break;
    default:
      break;
  }
  return r;
}

// Attention composed with one step of the softmax wrong: mask_after_softmax normalises over every
// key and multiplies by the mask afterwards (rows no longer sum to 1); softmax_over_queries
// normalises along the query axis. Shapes and options as attn::attention (no learned bias).
// The logits scale·q·kᵀ (+ bias, + ALiBi) [B, Hq, Nq, Nk] and v per query head [B, Hq, Nk, Dv],
// composed from differentiable ops.
struct Logits {
  Tensor logits, vh;
};
Logits composed_logits(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const attn::AttentionShape s = shape_of(q, k);
  const int64_t G = s.q_heads / s.kv_heads, D = q.size(3);
  const DType dt = q.dtype();
  const Device dev = q.device();
  std::vector<int64_t> map(static_cast<size_t>(s.q_heads));
  for (int64_t h = 0; h < s.q_heads; ++h) map[static_cast<size_t>(h)] = h / G;
  const Tensor index = from_vector_i64(map, {s.q_heads}).to(dev);
  const Tensor kh = ag::index_select(k, 1, index), vh = ag::index_select(v, 1, index);  // per query head
  const double scale = o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D));
  Tensor logits = ag::mul(ag::matmul(q, ag::transpose(kh, 2, 3)), scale);
  if (o.bias.defined()) logits = ag::add(logits, o.bias.dtype() == dt ? o.bias : o.bias.to(dt));
  if (!o.alibi_slopes.empty()) {
    std::vector<double> a(static_cast<size_t>(s.q_heads * s.nq * s.nk));
    for (int64_t h = 0; h < s.q_heads; ++h)
      for (int64_t i = 0; i < s.nq; ++i)
        for (int64_t j = 0; j < s.nk; ++j)
          a[static_cast<size_t>((h * s.nq + i) * s.nk + j)] =
              -static_cast<double>(o.alibi_slopes[static_cast<size_t>(h)]) * static_cast<double>(s.nk - s.nq + i - j);
    logits = ag::add(logits, from_vector(a, {1, s.q_heads, s.nq, s.nk}, dt).to(dev));
  }
  return {logits, vh};
}

attn::AttentionWeights wrong_softmax(Fault f, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionOptions& o) {
  const attn::AttentionShape s = shape_of(q, k);
  const DType dt = q.dtype();
  const Device dev = q.device();
  const auto [logits, vh] = composed_logits(q, k, v, o);
  const Tensor vis = attn::visibility_mask(s, o);
  const Tensor keep = vis.to(dt).to(dev);
  attn::AttentionWeights r;
  if (f == Fault::mask_after_softmax) {
    r.weights = ag::mul(ag::softmax(logits, -1), keep);
  } else {  // softmax_over_queries: a finite fill, so columns with no visible entry stay finite
    Tensor hidden = Tensor::empty(vis.shape(), DType::boolean);
    for (int64_t e = 0; e < vis.numel(); ++e) hidden.data<bool>()[e] = !vis.data<bool>()[e];
    r.weights = ag::mul(ag::softmax(ag::masked_fill(logits, hidden.to(dev), -1e30), -2), keep);
  }
  Tensor a = r.weights;
  if (o.dropout_p > 0) a = ag::mul(a, attn::dropout_scale_mask(s, o, dt).to(dev));
  r.out = ag::matmul(a, vh);
  r.fully_masked_rows = attn::count_fully_masked_rows(s, o);
  return r;
}

// Attention's output as a tiled online-softmax kernel forms it, with fault `f` in its running max:
// keys in tiles of attn::kTileK, per row a running max m, sum l and output O; on each tile
// m' = max(m, tile max), l = l·e^(m − m') + Σ e^(x − m'), O = O·e^(m − m') + Σ e^(x − m') v, and
// finally O / l, in float32 as the kernels do. softmax_no_max_shift keeps m' = 0 (e^x overflows
// past x = 88.7, and O / l turns NaN); softmax_no_rescale drops the e^(m − m') factor (rows whose
// max grows after their first tile are wrong). Returns the output gradient-free: the caller adds it
// as a constant offset to the library's output, so the planted bug lives in the forward only.
Tensor online_softmax_output(Fault f, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const autograd::NoGradGuard no_grad;
  const attn::AttentionShape s = shape_of(q, k);
  const auto parts = composed_logits(q, k, v, o);
  const std::vector<double> x = parts.logits.to(Device::cpu).to_vector(), vv = parts.vh.to(Device::cpu).to_vector();
  const Tensor vis = attn::visibility_mask(s, o).to(Device::cpu).contiguous();
  const bool* seen = vis.data<bool>();
  const int64_t rows = s.batch * s.q_heads * s.nq, Dv = v.size(3);
  std::vector<double> out(static_cast<size_t>(rows * Dv), 0.0);
  std::vector<float> acc(static_cast<size_t>(Dv));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bh = r / s.nq;  // (b, h): the row's slice of vh
    float m = f == Fault::softmax_no_max_shift ? 0.0f : -INFINITY, l = 0;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j0 = 0; j0 < s.nk; j0 += attn::kTileK) {
      const int64_t j1 = std::min(s.nk, j0 + attn::kTileK);
      float m_new = m;
      if (f != Fault::softmax_no_max_shift)
        for (int64_t j = j0; j < j1; ++j)
          if (seen[r * s.nk + j]) m_new = std::max(m_new, static_cast<float>(x[static_cast<size_t>(r * s.nk + j)]));
      if (m_new == -INFINITY) continue;  // nothing visible yet
      const float keep = f == Fault::softmax_no_rescale || m == -INFINITY ? 1.0f : std::exp(m - m_new);
      l *= keep;
      for (float& a : acc) a *= keep;
      for (int64_t j = j0; j < j1; ++j) {
        if (!seen[r * s.nk + j]) continue;
        const float p = std::exp(static_cast<float>(x[static_cast<size_t>(r * s.nk + j)]) - m_new);
        l += p;
        for (int64_t d = 0; d < Dv; ++d)
          acc[d] += p * static_cast<float>(vv[static_cast<size_t>((bh * s.nk + j) * Dv + d)]);
      }
      m = m_new;
    }
    if (l != 0)
      for (int64_t d = 0; d < Dv; ++d) out[static_cast<size_t>(r * Dv + d)] = acc[d] / l;
  }
  return from_vector(out, {s.batch, s.q_heads, s.nq, Dv}, q.dtype()).to(q.device());
}

// A model's attention with fault `f` planted; every other step is the library's.
class FaultyAttention : public nn::AttentionOps {
 public:
  explicit FaultyAttention(Fault f) : f_(f) {}

  Tensor rope(const Tensor& x, const Tensor& positions, double theta, int64_t cached) const override {
    if (f_ != Fault::rope_cache_relative || cached == 0) return nn::AttentionOps::rope(x, positions, theta, cached);
    // positions counted from the start of this chunk instead of absolute ones
    Tensor rel = positions.to(Device::cpu).to(DType::i64).clone();
    for (int64_t i = 0; i < rel.numel(); ++i) rel.data<int64_t>()[i] -= cached;
    return attn::apply_rope(x, rel.to(positions.device()), theta);
  }
  AttentionOptions options(AttentionOptions o, const nn::ModelConfig& cfg, bool training,
                           nn::RngContext& rng) const override {
    if (f_ == Fault::scale_d_model) o.scale = 1.0 / std::sqrt(static_cast<double>(cfg.n_embd));
    if (f_ == Fault::dropout_in_eval && !training && cfg.attn_dropout > 0) {
      o.dropout_p = cfg.attn_dropout;
      o.dropout_seed = rng.seed;
      o.dropout_offset = rng.next_offset();
    }
    return o;
  }
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) const override {
    if (wrong_softmax_fault(f_)) return wrong_softmax(f_, q, k, v, o).out;
    if (online_softmax_fault(f_)) {  // the library's output and gradient, offset to the faulty output
      const Tensor right = attn::attention(q, k, v, o);
      Tensor offset;
      {
        const autograd::NoGradGuard no_grad;
        offset = sub(online_softmax_output(f_, q, k, v, o), right.detach());
      }
      return ag::add(right, offset);
    }
    return attn::attention(q, k, v, wrong(o, shape_of(q, k)));
  }
  Tensor attention_packed(const Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                          const AttentionOptions& o) const override {
    if (wrong_softmax_fault(f_) || online_softmax_fault(f_)) {
      auto heads = [&](int64_t start, int64_t len) { return ag::transpose(ag::narrow(qkv, 2, start, len), 1, 2); };
      const Tensor y = attention(heads(0, q_heads), heads(q_heads, kv_heads), heads(q_heads + kv_heads, kv_heads), o);
      return ag::contiguous(ag::transpose(y, 1, 2));
    }
    const int64_t B = qkv.size(0), N = qkv.size(1);
    return attn::attention_packed(qkv, q_heads, kv_heads, wrong(o, {B, q_heads, kv_heads, N, N}));
  }
  Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const attn::LinearAttentionOptions& o) const override {
    attn::LinearAttentionOptions w = o;
    if (f_ == Fault::linear_chunk_future) w.chunk_key_hi = w.chunk;  // every key of the chunk
    return attn::linear_attention(q, k, v, w);
  }
  attn::AttentionWeights attention_with_weights(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const AttentionOptions& o) const override {
    if (wrong_softmax_fault(f_)) return wrong_softmax(f_, q, k, v, o);
    return attn::attention_with_weights(q, k, v, wrong(o, shape_of(q, k)));
  }
  // Rows decoding together each append to and read the next row's cache (every cache still grows
  // by one token a step, so none overflows: only the contents are another row's).
  nn::ModelCache& row_cache(const std::vector<nn::ModelCache*>& caches, size_t row) const override {
    if (f_ != Fault::cross_row_cache || caches.size() < 2) return nn::AttentionOps::row_cache(caches, row);
    return *caches[(row + 1) % caches.size()];
  }

 private:
  // The options with the fault's mask: wrong rules, or the key padding dropped.
  AttentionOptions wrong(AttentionOptions o, const attn::AttentionShape& s) const {
    const attn::Pattern kind = o.pattern ? o.pattern->kind : attn::Pattern::full;
    const bool strided = f_ == Fault::strided_offset_off_by_one && kind == attn::Pattern::strided;
    const bool global =
        f_ == Fault::global_reads_future && (kind == attn::Pattern::global || kind == attn::Pattern::bigbird);
    if (strided || global) {  // the pattern's mask rebuilt wrongly as an allow_mask [1, 1, Nq, Nk]
      const attn::SparsePattern& sp = *o.pattern;
      const attn::PatternPredicate pred(sp, s.nk, /*causal=*/true);
      auto is_global = [&](int64_t p) {
        return sp.global_tokens.empty()
                   ? p < sp.global
                   : std::find(sp.global_tokens.begin(), sp.global_tokens.end(), p) != sp.global_tokens.end();
      };
      Tensor allow = Tensor::empty({1, 1, s.nq, s.nk}, DType::boolean);
      for (int64_t i = 0; i < s.nq; ++i)
        for (int64_t j = 0; j < s.nk; ++j) {
          const int64_t p = s.nk - s.nq + i, d = p - j;
          allow.data<bool>()[i * s.nk + j] =
              strided ? std::abs(d) < pred.local() || (d + 1) % pred.stride() == 0
                      : (j <= p && pred.allows(p, j)) || is_global(p);  // the global row skips the causal rule
        }
      o.allow_mask = allow;
      o.pattern = nullptr;
      if (global) o.causal = false;
    }
    if (f_ == Fault::ignore_key_padding) {
      o.key_padding = Tensor();
      o.key_lengths.clear();
    }
    if (wrong_rules_fault(f_))
      o.rules = std::make_shared<const attn::MaskRules>(wrong_rules(f_, attn::mask_rules(s, o), s));
    return o;
  }

  Fault f_;
};

}  // namespace

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none:
      return "none";
    case Fault::causal_reversed:
      return "causal_reversed";
    case Fault::softmax_over_queries:
      return "softmax_over_queries";
    case Fault::ignore_key_padding:
      return "ignore_key_padding";
    case Fault::mask_after_softmax:
      return "mask_after_softmax";
    case Fault::top_left_causal:
      return "top_left_causal";
    case Fault::window_off_by_one:
      return "window_off_by_one";
    case Fault::gqa_modulo:
      return "gqa_modulo";
    case Fault::scale_d_model:
      return "scale_d_model";
    case Fault::rope_cache_relative:
      return "rope_cache_relative";
    case Fault::dropout_in_eval:
      return "dropout_in_eval";
    case Fault::linear_chunk_future:
      return "linear_chunk_future";
    case Fault::strided_offset_off_by_one:
      return "strided_offset_off_by_one";
    case Fault::global_reads_future:
      return "global_reads_future";
    case Fault::softmax_no_max_shift:
      return "softmax_no_max_shift";
    case Fault::softmax_no_rescale:
      return "softmax_no_rescale";
    case Fault::cross_row_cache:
      return "cross_row_cache";
  }
  return "?";
}

std::shared_ptr<const nn::AttentionOps> faulty_attention(Fault f) {
  if (f == Fault::none) return nn::AttentionOps::library();
  return std::make_shared<const FaultyAttention>(f);
}

PlantedFault::PlantedFault(nn::DecoderModel& model, Fault f) : model_(model), prev_(model.attention_ops()) {
  model_.set_attention_ops(faulty_attention(f));
}
PlantedFault::~PlantedFault() { model_.set_attention_ops(prev_); }

std::vector<Fault> planted_faults() {
  using F = Fault;
  return {F::causal_reversed,     F::softmax_over_queries, F::ignore_key_padding,  F::mask_after_softmax,
          F::top_left_causal,     F::window_off_by_one,    F::gqa_modulo,          F::scale_d_model,
          F::rope_cache_relative, F::dropout_in_eval,      F::linear_chunk_future, F::strided_offset_off_by_one,
          F::global_reads_future, F::softmax_no_max_shift, F::softmax_no_rescale,  F::cross_row_cache};
}

const char* fault_condition(Fault f) {
  switch (f) {
    case Fault::causal_reversed:
      return "any causal model";
    case Fault::softmax_over_queries:
      return "any model";
    case Fault::ignore_key_padding:
      return "key padding (left-padded rows)";
    case Fault::mask_after_softmax:
      return "any row with a masked key";
    case Fault::top_left_causal:
      return "Nq < Nk (KV-cache decode, chunked prefill)";
    case Fault::window_off_by_one:
      return "a sliding window (model.window > 0)";
    case Fault::gqa_modulo:
      return "GQA with Hkv > 1 and Hq / Hkv > 1";
    case Fault::scale_d_model:
      return "n_head > 1 (d_head != d_model)";
    case Fault::rope_cache_relative:
      return "RoPE and a KV cache";
    case Fault::dropout_in_eval:
      return "attention dropout > 0 (set on a copy)";
    case Fault::linear_chunk_future:
      return "linear attention over more than one chunk (the kernel probe's 4-key chunks, any linear model)";
    case Fault::strided_offset_off_by_one:
      return "model.attention_pattern = strided";
    case Fault::global_reads_future:
      return "model.attention_pattern = global or bigbird under a causal model";
    case Fault::softmax_no_max_shift:
      return "a logit past float32's exp overflow (the kernel probe's logits of 100, any softmax model)";
    case Fault::softmax_no_rescale:
      return "a row's max growing after its first key tile (the kernel probe's 320 keys, any softmax model)";
    case Fault::cross_row_cache:
      return "two or more rows decoding together (train::generate_batch's per-row KV caches, any model)";
    case Fault::none:
      break;
  }
  return "";
}

int SelfTestResult::detected() const {
  return static_cast<int>(
      std::count_if(faults.begin(), faults.end(), [](const FaultOutcome& f) { return f.detected; }));
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
  probe.description =
      "llama, 2 layers, RoPE, GQA 4:2, window 6, C 32, block 16, init std 0.2 "
      "(built to expose every planted fault)";
  probe.model = std::make_unique<nn::DecoderModel>(p);
  probe.model->init_weights(0x5e1f7e57);
  probe.model->eval();
  probe.model->to(user_model.device());
  out.push_back(std::move(probe));

  // Linear attention (model.attention_pattern = linear): the same llama probe, no window, chunks
  // of 4 so a probe spans several chunks and every chunk has later keys to leak.
  if (u.attention_pattern != nn::AttentionPattern::linear || u.linear_chunk < 2) {
    nn::ModelConfig l = p;
    l.window = 0;
    l.attention_pattern = nn::AttentionPattern::linear;
    l.linear_chunk = 4;
    l.linear_features = l.head_dim();
    SelfTestModel lin;
    lin.name = "probe-linear";
    lin.description = "llama, 2 layers, RoPE, GQA 4:2, linear attention (elu1, chunk 4), C 32, block 16";
    lin.model = std::make_unique<nn::DecoderModel>(l);
    lin.model->init_weights(0x5e1f7e58);
    lin.model->eval();
    lin.model->to(user_model.device());
    out.push_back(std::move(lin));
  }
  // Sparse probes: the llama probe without its window, one strided (s = 3, l = 2) and one with
  // global tokens {0, 5} and a local width 3 (Longformer-like), 1 layer each.
  auto sparse_probe = [&](const char* name, attn::Pattern kind, const char* what) {
    nn::ModelConfig sc = p;
    sc.n_layer = 1;
    sc.window = 0;
    sc.pattern.kind = kind;
    if (kind == attn::Pattern::strided) {
      sc.pattern.stride = 3;
      sc.pattern.local = 2;
    } else {
      sc.pattern.global_tokens = {0, 5};
      sc.pattern.local = 3;
    }
    SelfTestModel m;
    m.name = name;
    m.description = std::string("llama, 1 layer, RoPE, GQA 4:2, C 32, block 16, ") + what;
    m.model = std::make_unique<nn::DecoderModel>(sc);
    m.model->init_weights(0x5e1f7e58);
    m.model->eval();
    m.model->to(user_model.device());
    out.push_back(std::move(m));
  };
  sparse_probe("probe-strided", attn::Pattern::strided, "strided pattern s=3 l=2");
  sparse_probe("probe-global", attn::Pattern::global, "global pattern, tokens {0, 5}, l=3");
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
      if (progress)
        progress(std::string("self-test ") + label + " on " + m.name + ": " + std::to_string(failed) + " of " +
                 std::to_string(checks.size()) + " checks failed");
    }
    return out;
  };
  r.false_alarms = failures("clean");
  for (Fault f : planted_faults()) {
    std::vector<std::unique_ptr<PlantedFault>> planted;
    for (const auto& m : models) planted.push_back(std::make_unique<PlantedFault>(*m.model, f));
    FaultOutcome fo;
    fo.fault = f;
    fo.exposed_by = fault_condition(f);
    fo.caught_by = failures(fault_name(f));
    fo.detected = !fo.caught_by.empty();
    r.faults.push_back(std::move(fo));
  }
  return r;
}

DataLeakageChecks check_data_leakage(const TokenSplit& train, const TokenSplit& val, const LeakCheckOptions& o) {
  const LeakageReport r = measure_leakage(train, val, o.ngram_n);
  DataLeakageChecks out;
  if (r.val_ngrams > 0)
    out.checks.push_back(leak::make_check("data.val_ngram_share", r.ngram_share, o.max_ngram_share,
                                          std::to_string(r.shared_ngrams) + " of " + std::to_string(r.val_ngrams) +
                                              " " + std::to_string(r.n) + "-token windows of val also occur in train"));
  else
    out.skipped.emplace_back("data.val_ngram_share", "no val document holds a " + std::to_string(r.n) +
                                                         "-token window (--ngram " + std::to_string(r.n) + ")");
  if (r.val_docs > 0)
    out.checks.push_back(leak::make_check(
        "data.duplicated_docs", static_cast<double>(r.duplicated_docs), static_cast<double>(o.max_duplicated_docs),
        "val documents identical to a train document, of " + std::to_string(r.val_docs)));
  else out.skipped.emplace_back("data.duplicated_docs", "val holds no document");
  return out;
}

}  // namespace qkv::analysis
