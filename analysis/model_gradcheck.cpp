#include "analysis/model_gradcheck.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#include "tensor/philox.h"
#include "train/evaluate.h"
#include "train/model_factory.h"

namespace qkv::analysis {

namespace {

// 64 seeded bits for counter `i` of stream `stream`.
uint64_t draw(uint64_t seed, uint64_t stream, uint64_t i) {
  const Philox4 r =
      philox4x32_10(static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(stream), 0x9c3a,
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}
int64_t draw_below(uint64_t seed, uint64_t stream, uint64_t i, int64_t n) {
  return static_cast<int64_t>(draw(seed, stream, i) % static_cast<uint64_t>(n));
}

// One comparison under the rule of the header: error, counted relative error, pass.
struct Compared {
  double abs_err, rel_err;  // rel_err 0 when below the absolute floor
  bool pass;
};
Compared compare(double analytic, double numeric, const ModelGradcheckOptions& o) {
  const double err = std::fabs(analytic - numeric);
  Compared c{std::isfinite(err) ? err : INFINITY, 0, false};
  c.pass = std::isfinite(analytic) && std::isfinite(numeric) && err <= o.atol + o.rtol * std::fabs(numeric);
  if (std::fabs(numeric) > o.atol || !(err <= o.atol)) {
    const double scale = std::max(std::fabs(analytic), std::fabs(numeric));
    c.rel_err = scale > 0 && std::isfinite(err) ? err / scale : INFINITY;
  }
  return c;
}

}  // namespace

std::unique_ptr<nn::DecoderModel> build_float64_model(const nn::ModelConfig& cfg, uint64_t seed) {
  auto model = std::make_unique<nn::DecoderModel>(cfg);
  model->init_weights(seed);
  autograd::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    Tensor handle = p.tensor;
    handle.set_data(p.tensor.to(DType::f64).contiguous());
    handle.set_grad(Tensor());
  }
  model->train(true);
  return model;
}

Batch gradcheck_batch(BatchMode mode, Padding padding, int64_t rows, int64_t tokens, int64_t vocab, uint64_t seed) {
  QKV_CHECK(rows > 0 && tokens > 0 && vocab > 0, "[gradcheck] batch ", rows, " x ", tokens, " over vocab ", vocab,
            " is empty");
  const int64_t B = rows, T = tokens;
  std::vector<int64_t> x(static_cast<size_t>(B * T)), y(x.size()), pos(x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    x[e] = draw_below(seed, 1, e, vocab);
    y[e] = draw_below(seed, 2, e, vocab);
  }
  Batch b;
  if (mode == BatchMode::padded_docs) {
    b.key_padding = Tensor::empty({B, T}, DType::boolean);
    bool* kp = b.key_padding.data<bool>();
    for (int64_t r = 0; r < B; ++r) {
      // row 0 full, row 1 two tokens, the others anywhere in [2, T]
      const int64_t len = std::min(T, r == 0   ? T
                                      : r == 1 ? 2
                                               : 2 + draw_below(seed, 3, r, std::max<int64_t>(T - 1, 1)));
      const int64_t first = padding == Padding::left ? T - len : 0;
      for (int64_t t = 0; t < T; ++t) {
        const size_t e = static_cast<size_t>(r * T + t);
        const bool real = t >= first && t < first + len;
        kp[e] = real;
        pos[e] = real ? t - first : 0;
        if (!real) {
          x[e] = 0;
          y[e] = kIgnoreIndex;
        }
      }
    }
    b.positions = from_vector_i64(pos, {B, T});
  } else if (mode == BatchMode::packed_docs) {
    std::vector<int64_t> seg(x.size());
    for (int64_t r = 0; r < B; ++r) {
      // up to two cuts, each after a piece of >= 1 token
      int64_t piece = 0, start = 0;
      const int64_t cut1 = T > 2 ? 1 + draw_below(seed, 4, 2 * r, T - 1) : T;
      const int64_t cut2 = T > 3 ? 1 + draw_below(seed, 4, 2 * r + 1, T - 1) : T;
      for (int64_t t = 0; t < T; ++t) {
        if (t > 0 && (t == cut1 || t == cut2)) {
          ++piece;
          start = t;
          y[static_cast<size_t>(r * T + t - 1)] = kIgnoreIndex;  // the next token is another document's
        }
        seg[static_cast<size_t>(r * T + t)] = piece;
        pos[static_cast<size_t>(r * T + t)] = t - start;
      }
    }
    b.segment_ids = from_vector_i64(seg, {B, T}, DType::i32);
    b.positions = from_vector_i64(pos, {B, T});
  }
  b.x = from_vector_i64(x, {B, T});
  b.y = from_vector_i64(y, {B, T});
  b.n_targets = static_cast<int64_t>(std::count_if(y.begin(), y.end(), [](int64_t t) { return t != kIgnoreIndex; }));
  return b;
}

std::string attention_kernel_description(const nn::ModelConfig& cfg) {
  if (cfg.attn_kernel == attn::Kernel::reference)
    return "reference (composed ops: matmul, masked_fill, softmax; float64, CPU)";
  return "fused (CPU kernel with float64 tiles, hand-derived backward)";
}

ModelGradcheckReport run_model_gradcheck(const nn::DecoderModel& model, const Batch& batch, const nn::RngContext& rng,
                                         const ModelGradcheckOptions& opt,
                                         const std::function<void(const std::string&)>& progress) {
  QKV_CHECK(opt.directions >= 0 && opt.elements >= 0 && opt.directions + opt.elements > 0, "[gradcheck] --directions (",
            opt.directions, ") and --elements (", opt.elements, ") must be >= 0 and not both 0");
  QKV_CHECK(opt.eps > 0 && std::isfinite(opt.eps), "[gradcheck] --eps must be a finite number > 0, got ", opt.eps);
  QKV_CHECK(model.device() == Device::cpu, "[gradcheck] the model must be on the CPU");
  const std::vector<nn::NamedParameter> params = model.named_parameters();
  for (const auto& p : params)
    QKV_CHECK(p.tensor.dtype() == DType::f64 && p.tensor.is_contiguous(), "[gradcheck] parameter ", p.name,
              " must be contiguous float64 (build_float64_model), got ", dtype_name(p.tensor.dtype()));
  std::regex only;
  if (!opt.only.empty()) {
    try {
      only = std::regex(opt.only);
    } catch (const std::regex_error&) {
      throw Error(cat("[gradcheck] --only '", opt.only, "' is not a valid regular expression"));
    }
    QKV_CHECK(std::any_of(params.begin(), params.end(),
                          [&](const nn::NamedParameter& p) { return std::regex_search(p.name, only); }),
              "[gradcheck] --only '", opt.only, "' matches no parameter tensor of the model");
  }

  ModelGradcheckReport rep;
  rep.attention_kernel = attention_kernel_description(model.config());
  auto loss_at = [&] {
    autograd::NoGradGuard no_grad;
    ++rep.evaluations;
    return train::batch_loss(model, batch, rng).item();
  };

  // Analytic gradient: one backward of the recorded loss.
  for (const auto& p : params) Tensor(p.tensor).set_grad(Tensor());
  {
    Tensor loss = train::batch_loss(model, batch, rng);
    ++rep.evaluations;
    rep.loss = loss.item();
    // The attention nodes of the recorded graph: which kernel's backward is being checked.
    std::vector<const autograd::Node*> stack, seen;
    if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
    while (!stack.empty()) {
      const autograd::Node* n = stack.back();
      stack.pop_back();
      if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      const std::string name = n->name();
      if (name.find("Attention") != std::string::npos &&
          std::find(rep.attention_nodes.begin(), rep.attention_nodes.end(), name) == rep.attention_nodes.end())
        rep.attention_nodes.push_back(name);
      for (const auto& next : n->next())
        if (next) stack.push_back(next.get());
    }
    autograd::backward(loss);
  }
  rep.loss_again = loss_at();
  rep.deterministic = rep.loss == rep.loss_again;  // bitwise: the masks and kernels must repeat exactly
  std::vector<std::vector<double>> grad(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].tensor.grad();
    grad[i] = g.defined() ? g.to_vector() : std::vector<double>(static_cast<size_t>(params[i].tensor.numel()), 0.0);
  }

  // One comparison: the central difference of `shifted` (the loss at θ + step·direction) at ε,
  // then, while it fails, at ε/10 and ε/100 (a kink of ReLU crossed within ±ε; a wrong backward
  // fails at every step). Kept: the attempt that passed, else the one at ε (the least noisy).
  struct Attempt {
    double numeric, step;
    Compared c;
  };
  auto central = [&](double analytic, const std::function<double(double)>& shifted) {
    Attempt best{0, 0, {INFINITY, INFINITY, false}};
    double step = opt.eps;
    for (int a = 0; a <= opt.retries; ++a, step /= 10) {
      const double fp = shifted(step), fm = shifted(-step);
      const double numeric = (fp - fm) / (2 * step);
      const Compared c = compare(analytic, numeric, opt);
      if (a == 0 || c.pass) best = {numeric, step, c};
      if (c.pass) break;
      if (a == 0) ++rep.retried;
    }
    shifted(0);  // θ back bit for bit
    return best;
  };

  // Directions over every parameter at once.
  if (opt.directions > 0) {
    std::vector<std::vector<double>> theta(params.size());
    for (size_t i = 0; i < params.size(); ++i) theta[i] = params[i].tensor.to_vector();
    for (int d = 0; d < opt.directions; ++d) {
      std::vector<std::vector<double>> v(params.size());
      double norm2 = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor r = randn(params[i].tensor.shape(), opt.seed + 1 + static_cast<uint64_t>(d),
                               static_cast<uint64_t>(i + 1) << 40, 0.0, 1.0, DType::f64);
        v[i] = r.to_vector();
        for (double a : v[i]) norm2 += a * a;
      }
      const double inv = 1.0 / std::sqrt(norm2);
      double analytic = 0;
      for (size_t i = 0; i < params.size(); ++i)
        for (size_t e = 0; e < v[i].size(); ++e) analytic += (v[i][e] *= inv) * grad[i][e];
      const Attempt at = central(analytic, [&](double step) {
        for (size_t i = 0; i < params.size(); ++i) {
          double* x = params[i].tensor.data<double>();
          for (size_t e = 0; e < theta[i].size(); ++e) x[e] = step == 0 ? theta[i][e] : theta[i][e] + step * v[i][e];
        }
        return step == 0 ? 0.0 : loss_at();
      });
      rep.directions.push_back({analytic, at.numeric, at.step, at.c.abs_err, at.c.rel_err, at.c.pass});
    }
  }

  // Single elements of every tensor: the largest |g|, then uniform draws (no repeats).
  for (size_t i = 0; i < params.size() && opt.elements > 0; ++i) {
    const auto& p = params[i];
    if (!opt.only.empty() && !std::regex_search(p.name, only)) continue;
    ParamGradcheck pc;
    pc.name = p.name;
    pc.shape = p.tensor.shape();
    const int64_t n = p.tensor.numel();
    std::vector<int64_t> picks;
    int64_t top = 0;
    for (int64_t e = 1; e < n; ++e)
      if (std::fabs(grad[i][static_cast<size_t>(e)]) > std::fabs(grad[i][static_cast<size_t>(top)])) top = e;
    picks.push_back(top);
    const int64_t want = std::min<int64_t>(opt.elements, n);
    for (uint64_t k = 0; static_cast<int64_t>(picks.size()) < want; ++k) {
      const int64_t e = draw_below(opt.seed, 16 + i, k, n);
      if (std::find(picks.begin(), picks.end(), e) == picks.end()) picks.push_back(e);
    }
    double* x = p.tensor.data<double>();
    for (int64_t e : picks) {
      const double orig = x[e];
      const double analytic = grad[i][static_cast<size_t>(e)];
      const Attempt at = central(analytic, [&](double step) {
        x[e] = step == 0 ? orig : orig + step;
        return step == 0 ? 0.0 : loss_at();
      });
      if (pc.worst < 0 || at.c.abs_err > pc.max_abs_err) pc.worst = static_cast<int64_t>(pc.elements.size());
      pc.max_abs_err = std::max(pc.max_abs_err, at.c.abs_err);
      pc.max_rel_err = std::max(pc.max_rel_err, at.c.rel_err);
      pc.pass = pc.pass && at.c.pass;
      pc.elements.push_back({e, analytic, at.numeric, at.step});
    }
    if (progress)
      progress(
          cat(p.name, ": ", pc.elements.size(), " elements, max rel err ", pc.max_rel_err, pc.pass ? "" : "  FAIL"));
    rep.params.push_back(std::move(pc));
  }

  rep.pass = rep.deterministic;
  for (const auto& d : rep.directions) rep.pass = rep.pass && d.pass;
  for (const auto& p : rep.params) rep.pass = rep.pass && p.pass;
  return rep;
}

ConfigGradcheck run_config_gradcheck(const Config& cfg, const ModelGradcheckOptions& opt,
                                     std::shared_ptr<const nn::AttentionOps> ops,
                                     const std::function<void(const std::string&)>& progress) {
  ConfigGradcheck r;
  r.vocab_stand_in = cfg.model.vocab_size == 0;
  int64_t vocab = 1;
  if (r.vocab_stand_in)
    vocab = cfg.data.tokenizer == TokenizerKind::bpe    ? cfg.data.bpe_vocab_size
            : cfg.data.tokenizer == TokenizerKind::byte ? 256
                                                        : kStandInVocab;
  r.model = train::model_config(cfg, vocab);
  train::check_memory_budget(cfg, vocab, train::ModelUse::inference);  // a lower bound: float64 doubles it
  const auto model = build_float64_model(r.model, static_cast<uint64_t>(cfg.train.seed));
  if (ops) model->set_attention_ops(std::move(ops));
  r.parameters = model->parameter_count();
  r.parameter_tensors = static_cast<int64_t>(model->named_parameters().size());
  const int64_t rows = std::min(cfg.train.batch_size, kMaxRows);
  const int64_t tokens = std::min(cfg.train.resolved_seq_len(r.model.block_size), kMaxTokens);
  r.batch = gradcheck_batch(cfg.data.batching, cfg.data.padding_side, rows, tokens, r.model.vocab_size, opt.seed);
  r.attention_kernel = attention_kernel_description(r.model);
  r.report = run_model_gradcheck(*model, r.batch, nn::RngContext{opt.seed, 0, 0}, opt, progress);
  return r;
}

}  // namespace qkv::analysis
