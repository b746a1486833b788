// kernel_probes: the model's attention ops on synthetic inputs sized by the probe, not by the model,
// so that the regimes the kernels guard are reached whatever the model's block_size or
// linear_chunk: a model whose context fits one key tile never runs the online softmax's rescale,
// O(1) logits never overflow exp without the running-max shift, and a linear model whose chunk
// covers its context never crosses a chunk boundary.
//
// Softmax models (every attention_pattern but linear): B = 1, the model's heads (GQA groups) and
// head dim, Nq = Nk = kProbeKeys = 320 causal, more keys than any kernel's tile (the CPU kernel's
// 32, CUDA's 64, the strided walk's 256) and a multiple of each. Logits are kProbeLogit + ramp(j) +
// O(1) noise: q_i0 = 1, k_j0 = (100 + 1.5·⌊j / 16⌋) / s, the other dimensions N(0, 1). Every logit
// is past float32's exp overflow (88.7) and each row's max grows by 1.5 every 16 keys, inside and
// across tiles, so O must be rescaled again and again. Cases: no pattern; the model's own masks
// (window, pattern) at this length; each pattern at the edges of its parameters (1 and Nk: window
// l; strided s with l = 1; global g = 0 (each row sees only itself), 1 and Nk; bigbird and
// block_sparse bs = 1 and bs = Nk). Each case runs forward and backward (seeded dO) through
// attention() with the model's kernel, options and ops, and is compared with the naive float64
// loop and its vjp.
//
// Linear models: linear_attention() with the model's feature on Nk = 37 keys in chunks of 4 and on
// Nk = 133 in the library's default chunks of 64 (10 and 3 chunks, the last one partial).
//
// Value: the worst max|Δ| / max(max|ref|, floor) over cases and out, dq, dk, dv (floors:
// leak::attention_floors). Threshold 1e-3: a logit of ~100 carries float32 rounding of about
// u·100·√D ≈ 2e-5 absolute, which moves each weight by as much relatively; a correct kernel
// measures ~1e-5 here and a kernel without the max shift gives NaN (inf), one without the rescale
// or with a chunk that sees its own future keys errs by more than 1e-1.
#include <algorithm>
#include <cmath>

#include "attention/attention.h"
#include "attention/linear/linear_attention.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "analysis/leakcheck_internal.h"

namespace qkv::analysis {

namespace {

constexpr int64_t kProbeKeys = 320;
constexpr double kProbeLogit = 100, kProbeRampStep = 1.5;
constexpr int64_t kProbeRampKeys = 16;
constexpr double kProbeThreshold = 1e-3;

struct GradMode {
  explicit GradMode(bool on) : prev_(autograd::grad_enabled()) { autograd::set_grad_enabled(on); }
  ~GradMode() { autograd::set_grad_enabled(prev_); }
  GradMode(const GradMode&) = delete;
  GradMode& operator=(const GradMode&) = delete;
  bool prev_;
};

struct Worst {
  double value = 0;
  std::string at = "none";
  void note(double v, const std::string& where) {
    if (std::isnan(v)) v = INFINITY;
    if (at == "none" || v > value) {
      value = v;
      at = where;
    }
  }
};

std::shared_ptr<const attn::SparsePattern> pattern_of(attn::Pattern kind, auto&& set) {
  attn::SparsePattern p;
  p.kind = kind;
  set(p);
  return std::make_shared<const attn::SparsePattern>(p);
}

// The softmax cases: a name and the pattern (null: none), window in the options.
struct SoftmaxCase {
  std::string name;
  std::shared_ptr<const attn::SparsePattern> pattern;
  int64_t window = 0;
};

std::vector<SoftmaxCase> softmax_cases(const nn::ModelConfig& c, int64_t n) {
  using P = attn::Pattern;
  std::vector<SoftmaxCase> out;
  out.push_back({"causal", nullptr, 0});
  if (c.window > 0 || c.pattern.sparse()) out.push_back({"the model's masks", leak::model_pattern(c), c.window});
  for (int64_t e : {int64_t{1}, n}) {
    const std::string at = "=" + std::to_string(e);
    out.push_back({"window l" + at, pattern_of(P::window, [&](auto& p) { p.local = e; }), 0});
    out.push_back({"strided s" + at + " l=1",
                   pattern_of(P::strided,
                              [&](auto& p) {
                                p.stride = e;
                                p.local = 1;
                              }),
                   0});
    out.push_back({"bigbird bs" + at,
                   pattern_of(P::bigbird,
                              [&](auto& p) {
                                p.block_size = e;
                                p.random_blocks = 1;
                                p.seed = 7;
                              }),
                   0});
    out.push_back({"block_sparse bs" + at, pattern_of(P::block_sparse, [&](auto& p) { p.block_size = e; }), 0});
  }
  // global: g = 0 (no global position: each row sees only itself), 1 (the default) and Nk
  for (int64_t g : {int64_t{0}, int64_t{1}, n})
    out.push_back({"global g=" + std::to_string(g), pattern_of(P::global, [&](auto& p) { p.global = g; }), 0});
  return out;
}

void softmax_probes(const nn::DecoderModel& model, const LeakCheckOptions& o, Worst& worst) {
  const nn::ModelConfig& c = model.config();
  const int64_t Hq = c.n_head, Hkv = c.n_kv_head, D = c.head_dim(), N = kProbeKeys;
  const double s = 1.0 / std::sqrt(static_cast<double>(D));
  const Device dev = model.device();
  const auto ops = model.attention_ops();
  std::vector<double> q = randn({1, Hq, N, D}, o.seed, uint64_t{0x9b} << 40, 0.0, 1.0, DType::f32).to_vector(),
                      k = randn({1, Hkv, N, D}, o.seed, uint64_t{0x9c} << 40, 0.0, 1.0, DType::f32).to_vector();
  const std::vector<double> v = randn({1, Hkv, N, D}, o.seed, uint64_t{0x9d} << 40).to_vector(),
                            dout = randn({1, Hq, N, D}, o.seed, uint64_t{0x9e} << 40).to_vector();
  for (size_t r = 0; r < q.size(); r += static_cast<size_t>(D)) q[r] = 1;
  for (size_t r = 0; r < k.size(); r += static_cast<size_t>(D)) {
    const int64_t j = static_cast<int64_t>(r / static_cast<size_t>(D)) % N;
    k[r] = (kProbeLogit + kProbeRampStep * static_cast<double>(j / kProbeRampKeys)) / s;
  }
  // The float32 tensors the kernel gets, and the same values in float64 for the oracle.
  const Tensor q32 = from_vector(q, {1, Hq, N, D}), k32 = from_vector(k, {1, Hkv, N, D}),
               v32 = from_vector(v, {1, Hkv, N, D}), dout32 = from_vector(dout, {1, Hq, N, D});
  q = q32.to_vector();
  k = k32.to_vector();
  const leak::AttentionFloors fl = leak::attention_floors(D, D, s, q, k, v, dout, false);
  for (const SoftmaxCase& sc : softmax_cases(c, N)) {
    leak::NaiveSpec spec;
    spec.Hq = Hq, spec.Hkv = Hkv, spec.Nq = N, spec.Nk = N, spec.D = D, spec.Dv = D;
    spec.causal = true;
    spec.window = sc.window;
    if (sc.pattern) spec.pattern = std::make_shared<const attn::PatternPredicate>(*sc.pattern, N, true);
    std::vector<double> ref, dq, dk, dv;
    leak::naive_attention(spec, q, k, v, ref, nullptr);
    leak::naive_attention_backward(spec, q, k, v, dout, dq, dk, dv);

    attn::AttentionOptions opts;
    opts.causal = true;
    opts.window = sc.window;
    opts.pattern = sc.pattern;
    opts.kernel = c.attn_kernel;
    nn::RngContext no_dropout;
    opts = ops->options(opts, c, /*training=*/false, no_dropout);
    const GradMode grad_on(true);
    Tensor qg = q32.clone().to(dev).set_requires_grad(true), kg = k32.clone().to(dev).set_requires_grad(true),
           vg = v32.clone().to(dev).set_requires_grad(true);
    const Tensor out = ops->attention(qg, kg, vg, opts);
    autograd::backward(out, dout32.to(dev));
    const Shape qs{1, Hq, N, D}, ks{1, Hkv, N, D};
    worst.note(leak::floored_ratio(out, from_vector(ref, qs, DType::f64), fl.out), sc.name + " out");
    worst.note(leak::floored_ratio(qg.grad(), from_vector(dq, qs, DType::f64), fl.dq), sc.name + " dq");
    worst.note(leak::floored_ratio(kg.grad(), from_vector(dk, ks, DType::f64), fl.dk), sc.name + " dk");
    worst.note(leak::floored_ratio(vg.grad(), from_vector(dv, ks, DType::f64), fl.dv), sc.name + " dv");
  }
}

void linear_probes(const nn::DecoderModel& model, const LeakCheckOptions& o, Worst& worst) {
  const nn::ModelConfig& c = model.config();
  const int64_t Hq = c.n_head, Hkv = c.n_kv_head, D = c.head_dim();
  const Device dev = model.device();
  const auto ops = model.attention_ops();
  const std::pair<int64_t, int64_t> sizes[] = {{37, 4}, {133, 64}};  // keys, chunk
  uint64_t stream = 0xa0;
  for (const auto& [N, chunk] : sizes) {
    const Tensor q32 = randn({1, Hq, N, D}, o.seed, ++stream << 40),
                 k32 = randn({1, Hkv, N, D}, o.seed, ++stream << 40),
                 v32 = randn({1, Hkv, N, D}, o.seed, ++stream << 40),
                 dout32 = randn({1, Hq, N, D}, o.seed, ++stream << 40);
    const std::vector<double> q = q32.to_vector(), k = k32.to_vector(), v = v32.to_vector(), dout = dout32.to_vector();
    attn::LinearAttentionOptions lo;
    lo.feature = c.linear_feature;
    lo.causal = true;
    lo.chunk = chunk;
    if (c.linear_feature == attn::LinearFeature::favor)
      lo.projection = attn::favor_projection_for_layer(c.linear_features, D, 0).to(dev);
    const std::vector<double> W = lo.projection.defined() ? lo.projection.to_vector() : std::vector<double>();
    leak::NaiveSpec spec;
    spec.Hq = Hq, spec.Hkv = Hkv, spec.Nq = N, spec.Nk = N, spec.D = D, spec.Dv = D;
    std::vector<double> ref, dq, dk, dv;
    leak::naive_linear_attention(spec, c.linear_feature, W, lo.eps, q, k, v, ref);
    leak::naive_linear_attention_backward(spec, c.linear_feature, W, lo.eps, q, k, v, dout, dq, dk, dv);
    const GradMode grad_on(true);
    Tensor qg = q32.clone().to(dev).set_requires_grad(true), kg = k32.clone().to(dev).set_requires_grad(true),
           vg = v32.clone().to(dev).set_requires_grad(true);
    const Tensor out = ops->linear_attention(qg, kg, vg, lo);
    autograd::backward(out, dout32.to(dev));
    const leak::AttentionFloors fl = leak::attention_floors(D, D, 0, q, k, v, dout, true);
    const std::string name = "linear " + std::to_string(N) + " keys, chunk " + std::to_string(chunk);
    const Shape qs{1, Hq, N, D}, ks{1, Hkv, N, D};
    worst.note(leak::floored_ratio(out, from_vector(ref, qs, DType::f64), fl.out), name + " out");
    worst.note(leak::floored_ratio(qg.grad(), from_vector(dq, qs, DType::f64), fl.dq), name + " dq");
    worst.note(leak::floored_ratio(kg.grad(), from_vector(dk, ks, DType::f64), fl.dk), name + " dk");
    worst.note(leak::floored_ratio(vg.grad(), from_vector(dv, ks, DType::f64), fl.dv), name + " dv");
  }
}

}  // namespace

LeakCheck check_kernel_probes(const nn::DecoderModel& model, const LeakCheckOptions& o) {
  const leak::EvalModel m(model);
  Worst worst;
  const bool linear = m->config().attention_pattern == nn::AttentionPattern::linear;
  if (linear) {
    linear_probes(*m, o, worst);
  } else {
    softmax_probes(*m, o, worst);
  }
  const std::string what =
      linear ? "linear_attention() on 37 keys in chunks of 4 and 133 keys in chunks of 64"
             : "attention() on " + std::to_string(kProbeKeys) +
                   " causal keys, logits 100 + 1.5 per 16 keys + N(0,1) noise (past exp overflow, a growing "
                   "max), with no pattern, the model's masks, and each pattern at parameters 1 and " +
                   std::to_string(kProbeKeys);
  return leak::make_check(
      "kernel_probes", worst.value, kProbeThreshold,
      what + "; out, dq, dk, dv vs naive float64, max|Δ| / max(max|ref|, floor), worst " + worst.at);
}

}  // namespace qkv::analysis
