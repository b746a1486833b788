#include "analysis/study.h"

#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "analysis/html.h"
#include "analysis/cost.h"
#include "analysis/leakcheck.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "train/atomic_file.h"
#include "train/bench.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"
#include "train/sampler.h"
#include "train/session.h"
#include "train/trainer.h"

namespace qkv::analysis {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::vector<VariantRule>& variant_rules() {
  auto one = [](std::vector<std::string> fixed, std::string key) {
    return [fixed, key](const std::string& p) {
      auto o = fixed;
      if (!key.empty() && !p.empty()) o.push_back(key + "=" + p);
      return o;
    };
  };
  // The keys are train/config.h's: model.attention_pattern picks the attention, model.pattern_*
  // its parameters (each left at its default when no parameter is given), and model.window = 0
  // because the sparse patterns are ANDed with the window and linear refuses one.
  static const std::vector<VariantRule> rules = {
      {"full", "", false, "causal attention over every earlier token",
       one({"model.window=0", "model.attention_pattern=full"}, "")},
      {"window", "W", true, "sliding window: each query reads its W most recent keys",
       one({"model.attention_pattern=full"}, "model.window")},
      {"strided", "S", false, "strided: a local band of S keys + every S-th key (S default ceil(sqrt(block_size)))",
       one({"model.window=0", "model.attention_pattern=strided"}, "model.pattern_stride")},
      {"global", "G", false, "the first G tokens (default 1) are global, plus the local band",
       one({"model.window=0", "model.attention_pattern=global"}, "model.pattern_global")},
      {"bigbird", "B", false,
       "BigBird: local, global and random blocks of B tokens (default clamp(block_size/4, 1, 64))",
       one({"model.window=0", "model.attention_pattern=bigbird"}, "model.pattern_block_size")},
      {"block_sparse", "B", false, "block-sparse local_global layout with blocks of B tokens",
       one({"model.window=0", "model.attention_pattern=block_sparse"}, "model.pattern_block_size")},
      {"linear", "", false, "linear attention (elu+1 feature map, no softmax; a recurrent decode state)",
       one({"model.window=0", "model.attention_pattern=linear"}, "")},
  };
  return rules;
}

std::vector<VariantSpec> parse_variants(const std::string& list) {
  std::vector<VariantSpec> out;
  std::set<std::string> seen;
  std::stringstream ss(list);
  std::string item;
  const size_t last = list.find_last_not_of(" \t");
  QKV_CHECK(last == std::string::npos || list[last] != ',', "--variants: '", list, "' ends with a comma");
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    QKV_CHECK(!item.empty(), "--variants: an empty item in '", list, "' (a stray comma?)");
    const auto colon = item.find(':');
    const std::string name = item.substr(0, colon), param = colon == std::string::npos ? "" : item.substr(colon + 1);
    const VariantRule* rule = nullptr;
    std::string known;
    for (const auto& r : variant_rules()) {
      if (r.name == name) rule = &r;
      known += (known.empty() ? "" : ", ") + r.name + (r.param.empty() ? "" : ":" + r.param);
    }
    QKV_CHECK(rule, "--variants: unknown variant '", name, "' (known: ", known, ")");
    QKV_CHECK(!rule->param_required || !param.empty(), "--variants: ", name, " needs a parameter (", name, ":",
              rule->param, ")");
    QKV_CHECK(!rule->param.empty() || colon == std::string::npos, "--variants: ", name, " takes no parameter, got '",
              item, "'");
    if (!param.empty()) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(param.data(), param.data() + param.size(), v);
      QKV_CHECK(ec == std::errc() && end == param.data() + param.size() && v >= 1 && v <= (int64_t{1} << 20),
                "--variants: ", item, ": the parameter must be an integer in [1, 1048576]");
    }
    QKV_CHECK(seen.insert(item).second, "--variants: ", item, " is listed twice");
    out.push_back({item, rule->overrides(param)});
  }
  QKV_CHECK(!out.empty(), "--variants: no variant given (e.g. full,window:64)");
  return out;
}

namespace {

std::string safe_name(const std::string& s) {
  std::string o;
  for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return o;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
double num_from(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : NAN; }

// Resets the kernel's high-water mark of this process' resident set (Linux >= 4.0), so VmHWM after
// a variant is that variant's peak. False when the kernel refuses (the process peak is reported).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return f.good();
}

int64_t vm_hwm_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return train::peak_rss_bytes();
}

// Val loss against wall time from the run's metrics.jsonl: each record's ms_per_step covers the
// steps since the previous record, so the cumulative sum is the training time (evaluation excluded).
std::vector<CurvePoint> read_curve(const std::string& metrics) {
  std::vector<CurvePoint> out;
  std::ifstream f(metrics);
  std::string line;
  int64_t prev_step = 0;
  double wall = 0;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step")) continue;
    const int64_t step = j["step"].get<int64_t>();
    if (j.contains("ms_per_step") && j["ms_per_step"].is_number())
      wall += (step - prev_step) * j["ms_per_step"].get<double>() / 1000.0;
    prev_step = step;
    if (j.contains("val_loss") && j["val_loss"].is_number()) out.push_back({step, wall, j["val_loss"].get<double>()});
  }
  return out;
}

bool positions_bounded(const nn::ModelConfig& c) {
  return c.position == nn::Position::learned || c.position == nn::Position::sinusoidal;
}

// A prompt of n tokens from the validation text (repeated when it is shorter).
std::vector<int32_t> text_prompt(const std::vector<int32_t>& val, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(val.empty() ? 0 : val[static_cast<size_t>(i) % val.size()]);
  return out;
}

Tensor ids_tensor(const std::vector<int32_t>& ids, size_t from, size_t to) {
  std::vector<int64_t> v(ids.begin() + static_cast<std::ptrdiff_t>(from),
                         ids.begin() + static_cast<std::ptrdiff_t>(to));
  return from_vector_i64(v, {1, static_cast<int64_t>(v.size())});
}

LengthResult measure_length(const nn::DecoderModel& model, int64_t N, const std::vector<int32_t>& val,
                            const StudyOptions& o) {
  const nn::ModelConfig& c = model.config();
  LengthResult r;
  r.length = N;
  autograd::NoGradGuard no_grad;
  if (positions_bounded(c) && N + o.decode_tokens > c.block_size) {
    r.skipped = "learned/sinusoidal positions stop at block_size " + std::to_string(c.block_size);
  } else {
    release_cached_memory();
    const int64_t before = allocator_stats().bytes_in_use;
    reset_peak_bytes();
    {
      nn::ModelCache cache = model.make_cache(1, N + o.decode_tokens);
      // Linear attention's state (S, z) lives in host vectors, not the tensor allocator.
      int64_t linear_state = 0;
      for (const auto& st : cache.linear) linear_state += st.state_bytes();
      r.kv_cache_bytes = allocator_stats().bytes_in_use - before + linear_state;
      std::vector<int32_t> ctx = text_prompt(val, N);
      // The prefill twice (the cache emptied in between), keeping the faster: the first call
      // also pays for first-touch pages and thread start-up.
      Tensor logits;
      auto t0 = Clock::now();
      for (int rep = 0; rep < 2; ++rep) {
        cache.clear();  // KV layers and linear states alike (a linear state kept would run on past the length)
        nn::ForwardArgs a;
        a.ids = ids_tensor(ctx, 0, ctx.size());
        a.cache = &cache;
        t0 = Clock::now();
        logits = model.forward(a);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        r.prefill_ms = rep == 0 ? ms : std::min(r.prefill_ms, ms);
      }
      std::vector<double> ms;
      for (int64_t t = 0; t < o.decode_tokens; ++t) {
        const Tensor row = logits.select(0, 0).select(0, logits.size(1) - 1).contiguous();
        const float* p = row.data<float>();
        ctx.push_back(static_cast<int32_t>(std::max_element(p, p + c.vocab_size) - p));
        nn::ForwardArgs d;
        d.ids = ids_tensor(ctx, ctx.size() - 1, ctx.size());
        d.cache = &cache;
        t0 = Clock::now();
        logits = model.forward(d);
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      r.decode_ms_per_token = ms.empty() ? NAN : ms[ms.size() / 2];
      r.measured = true;
    }
    r.memory_bytes = allocator_stats().peak_bytes - before;
  }
  // Validation loss over windows of N tokens (the positions permitting).
  if (positions_bounded(c) && N > c.block_size) {
    r.val_skipped = "positions stop at block_size " + std::to_string(c.block_size);
  } else if (static_cast<int64_t>(val.size()) < N + 1) {
    r.val_skipped =
        "the validation split has " + std::to_string(val.size()) + " tokens, fewer than " + std::to_string(N + 1);
  } else {
    const int64_t avail = static_cast<int64_t>(val.size()) - (N + 1);
    const int64_t windows = std::clamp<int64_t>(o.eval_tokens / N, 1, 16);
    double sum = 0;
    int64_t count = 0;
    for (int64_t w = 0; w < windows; ++w) {
      const int64_t start = windows == 1 ? 0 : avail * w / (windows - 1);
      nn::ForwardArgs a;
      a.ids = ids_tensor(val, static_cast<size_t>(start), static_cast<size_t>(start + N));
      const Tensor logits = model.forward(a).reshape({N, c.vocab_size});
      const Tensor targets =
          ids_tensor(val, static_cast<size_t>(start + 1), static_cast<size_t>(start + N + 1)).reshape({N});
      sum += ag::cross_entropy(logits, targets).item() * static_cast<double>(N);
      count += N;
    }
    r.val_loss = sum / static_cast<double>(count);
  }
  return r;
}

bool finite_everywhere(const Tensor& t) {
  const Tensor c = t.contiguous().to(Device::cpu);
  const float* p = c.data<float>();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

std::vector<EdgeResult> edge_inputs(const nn::DecoderModel& model, const std::vector<int32_t>& val) {
  const nn::ModelConfig& c = model.config();
  std::vector<EdgeResult> out;
  autograd::NoGradGuard no_grad;
  {
    EdgeResult e{"empty_prompt", "a clear error naming the prompt", "", false};
    train::SampleOptions so;
    so.max_new_tokens = 4;
    so.temperature = 0;
    try {
      const auto toks = train::generate(model, {}, so);
      e.got = "returned " + std::to_string(toks.size()) + " tokens";
    } catch (const Error& err) {
      e.got = std::string("error: ") + err.what();
      e.pass = e.got.find("prompt") != std::string::npos;
    }
    out.push_back(e);
  }
  {
    EdgeResult e{"fully_masked_row", "finite logits; the fully masked row's attention output is zero", "", false};
    const int64_t T = std::min<int64_t>(c.block_size, 8);
    const std::vector<int32_t> p = text_prompt(val, T);
    std::vector<int64_t> ids;
    for (int r = 0; r < 2; ++r) ids.insert(ids.end(), p.begin(), p.end());
    std::vector<double> valid(static_cast<size_t>(2 * T), 1.0);
    for (int64_t j = 0; j < T; ++j) valid[static_cast<size_t>(T + j)] = 0.0;  // row 1: every key is padding
    std::vector<nn::AttentionCapture> caps;
    nn::ForwardArgs a;
    a.ids = from_vector_i64(ids, {2, T});
    a.key_padding = from_vector(valid, {2, T}, DType::boolean);
    a.attention = &caps;
    try {
      const Tensor logits = model.forward(a);
      bool zero = true;
      for (const auto& cap : caps) {
        const Tensor o1 = cap.out.select(0, 1).contiguous().to(Device::cpu);
        const float* q = o1.data<float>();
        for (int64_t i = 0; i < o1.numel(); ++i) zero = zero && q[i] == 0.0f;
      }
      const bool finite = finite_everywhere(logits);
      e.got = std::string(finite ? "finite logits" : "NON-FINITE logits") + ", masked row output " +
              (zero ? "zero" : "NOT zero");
      e.pass = finite && zero;
    } catch (const Error& err) { e.got = std::string("error: ") + err.what(); }
    out.push_back(e);
  }
  {
    EdgeResult e{"prompt_over_block", "generates from the last block_size tokens", "", false};
    train::SampleOptions so;
    so.max_new_tokens = 4;
    so.temperature = 0;
    try {
      const auto toks = train::generate(model, text_prompt(val, c.block_size + 8), so);
      const bool in_vocab =
          std::all_of(toks.begin(), toks.end(), [&](int32_t t) { return t >= 0 && t < c.vocab_size; });
      e.got = std::to_string(toks.size()) + " tokens" + (in_vocab ? "" : " (outside the vocabulary)");
      e.pass = toks.size() == 4 && in_vocab;
    } catch (const Error& err) { e.got = std::string("error: ") + err.what(); }
    out.push_back(e);
  }
  return out;
}

std::string result_key(const Config& cfg, const StudyOptions& o) {
  std::ostringstream k;
  k << "qkv-study-1\n" << to_toml(cfg) << "\nlengths";
  for (int64_t n : o.lengths) k << " " << n;
  k << "\ndecode " << o.decode_tokens << " eval " << o.eval_tokens << " checks " << o.run_checks;
  return k.str();
}

}  // namespace

nlohmann::json variant_json(const VariantResult& v) {
  nlohmann::json curve = nlohmann::json::array(), lengths = nlohmann::json::array(), checks = nlohmann::json::array(),
                 edges = nlohmann::json::array();
  for (const auto& p : v.curve)
    curve.push_back({{"step", p.step}, {"wall_s", p.wall_s}, {"val_loss", num(p.val_loss)}});
  for (const auto& l : v.lengths)
    lengths.push_back({{"length", l.length},
                       {"measured", l.measured},
                       {"skipped", l.skipped},
                       {"prefill_ms", num(l.prefill_ms)},
                       {"decode_ms_per_token", num(l.decode_ms_per_token)},
                       {"memory_bytes", l.memory_bytes},
                       {"kv_cache_bytes", l.kv_cache_bytes},
                       {"val_loss", num(l.val_loss)},
                       {"val_skipped", l.val_skipped}});
  int passed = 0;
  for (const auto& c : v.checks) {
    checks.push_back({{"name", c.name}, {"value", num(c.value)}, {"threshold", num(c.threshold)}, {"pass", c.pass}});
    passed += c.pass;
  }
  int edges_passed = 0;
  for (const auto& e : v.edges) {
    edges.push_back({{"name", e.name}, {"expected", e.expected}, {"got", e.got}, {"pass", e.pass}});
    edges_passed += e.pass;
  }
  return {{"name", v.name},
          {"overrides", v.overrides},
          {"val_loss", num(v.val_loss)},
          {"val_loss_gap", num(v.val_loss_gap)},
          {"tokens_per_s", num(v.tokens_per_s)},
          {"wall_s", num(v.wall_s)},
          {"peak_rss_bytes", v.peak_rss_bytes},
          {"peak_rss_per_variant", v.peak_rss_per_variant},
          {"steps", v.steps},
          {"train_tokens", v.train_tokens},
          {"params", v.params},
          {"block_size", v.block_size},
          {"curve", curve},
          {"lengths", lengths},
          {"checks", checks},
          {"checks_passed", passed},
          {"checks_failed", static_cast<int>(v.checks.size()) - passed},
          {"edges", edges},
          {"edges_passed", edges_passed},
          {"resumed", v.resumed}};
}

VariantResult variant_from_json(const nlohmann::json& j) {
  VariantResult v;
  v.name = j.at("name").get<std::string>();
  v.overrides = j.at("overrides").get<std::vector<std::string>>();
  v.val_loss = num_from(j.at("val_loss"));
  v.tokens_per_s = num_from(j.at("tokens_per_s"));
  v.wall_s = num_from(j.at("wall_s"));
  v.peak_rss_bytes = j.at("peak_rss_bytes").get<int64_t>();
  v.peak_rss_per_variant = j.value("peak_rss_per_variant", false);
  v.steps = j.at("steps").get<int64_t>();
  v.train_tokens = j.at("train_tokens").get<int64_t>();
  v.params = j.at("params").get<int64_t>();
  v.block_size = j.value("block_size", int64_t{0});
  for (const auto& p : j.at("curve"))
    v.curve.push_back({p.at("step").get<int64_t>(), p.at("wall_s").get<double>(), num_from(p.at("val_loss"))});
  for (const auto& l : j.at("lengths")) {
    LengthResult r;
    r.length = l.at("length").get<int64_t>();
    r.measured = l.at("measured").get<bool>();
    r.skipped = l.at("skipped").get<std::string>();
    r.prefill_ms = num_from(l.at("prefill_ms"));
    r.decode_ms_per_token = num_from(l.at("decode_ms_per_token"));
    r.memory_bytes = l.at("memory_bytes").get<int64_t>();
    r.kv_cache_bytes = l.at("kv_cache_bytes").get<int64_t>();
    r.val_loss = num_from(l.at("val_loss"));
    r.val_skipped = l.at("val_skipped").get<std::string>();
    v.lengths.push_back(r);
  }
  for (const auto& c : j.at("checks"))
    v.checks.push_back({c.at("name").get<std::string>(), num_from(c.at("value")), num_from(c.at("threshold")),
                        c.at("pass").get<bool>()});
  for (const auto& e : j.at("edges"))
    v.edges.push_back({e.at("name").get<std::string>(), e.at("expected").get<std::string>(),
                       e.at("got").get<std::string>(), e.at("pass").get<bool>()});
  return v;
}

StudyResult run_study(const std::string& base_path, const std::vector<std::string>& sets,
                      const std::vector<VariantSpec>& variants, const StudyOptions& o) {
  QKV_CHECK(!variants.empty(), "[study] no variants");
  QKV_CHECK(o.budget_tokens >= 0, "[study] --budget-tokens must be >= 0, got ", o.budget_tokens);
  QKV_CHECK(o.decode_tokens >= 1, "[study] decode tokens must be >= 1, got ", o.decode_tokens);
  for (int64_t n : o.lengths) QKV_CHECK(n >= 1, "[study] --lengths must be >= 1, got ", n);
  auto progress = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  StudyResult result;
  result.base = base_path;
  result.options = o;
  // Every variant's config first: a bad variant (an unknown key in this build) fails before training.
  std::vector<Config> cfgs;
  for (const auto& v : variants) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), v.overrides.begin(), v.overrides.end());
    Config cfg = parse_config(base_path, all);
    const std::string vdir = o.dir + "/variants/" + safe_name(v.name);
    cfg.train.out_dir = vdir + "/run";
    cfg.train.checkpoint_interval = 0;
    if (o.budget_tokens > 0) {
      const int64_t per_step =
          cfg.train.batch_size * cfg.train.grad_accum * cfg.train.resolved_seq_len(cfg.model.block_size);
      cfg.train.max_steps = std::max<int64_t>(1, (o.budget_tokens + per_step - 1) / per_step);
      cfg.train.warmup_steps = std::min(cfg.train.warmup_steps, cfg.train.max_steps / 10);
      cfg.train.eval_interval = std::max<int64_t>(1, std::min(cfg.train.eval_interval, cfg.train.max_steps / 4));
    }
    validate(cfg, "variant " + v.name);
    cfgs.push_back(cfg);
  }
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  QKV_CHECK(!ec, "[study] cannot create ", o.dir, ": ", ec.message());

  for (size_t i = 0; i < variants.size(); ++i) {
    const auto& spec = variants[i];
    const Config& cfg = cfgs[i];
    const std::string vdir = o.dir + "/variants/" + safe_name(spec.name);
    const std::string result_path = vdir + "/result.json";
    const std::string key = result_key(cfg, o);
    {
      std::ifstream f(result_path);
      if (f) {
        std::stringstream ss;
        ss << f.rdbuf();
        const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
        if (!j.is_discarded() && j.value("key", std::string()) == key) {
          VariantResult v = variant_from_json(j.at("result"));
          v.resumed = true;
          progress("study: " + spec.name + ": finished earlier (" + result_path + "), skipped");
          result.variants.push_back(v);
          continue;
        }
      }
    }
    VariantResult v;
    v.name = spec.name;
    v.overrides = spec.overrides;
    fs::remove_all(vdir + "/run", ec);  // an unfinished earlier attempt starts over
    fs::create_directories(vdir, ec);
    progress("study: " + spec.name + ": training " + std::to_string(cfg.train.max_steps) + " steps (" +
             std::to_string(cfg.train.max_steps * cfg.train.batch_size * cfg.train.grad_accum *
                            cfg.train.resolved_seq_len(cfg.model.block_size)) +
             " tokens) -> " + cfg.train.out_dir);
    // Freed memory back to the OS first (the tensor cache, then the heap), so the high-water mark
    // starts from what the process still holds, not from the previous variant's peak.
    release_cached_memory();
    malloc_trim(0);
    v.peak_rss_per_variant = reset_peak_rss();
    train::TrainOptions to;
    to.progress = static_cast<bool>(o.progress);
    const train::TrainSummary s = train::run_training(cfg, to);
    v.peak_rss_bytes = v.peak_rss_per_variant ? vm_hwm_bytes() : train::peak_rss_bytes();
    v.tokens_per_s = s.tokens_per_s;
    v.wall_s = s.seconds;
    v.steps = s.step;
    v.train_tokens =
        s.step * cfg.train.batch_size * cfg.train.grad_accum * cfg.train.resolved_seq_len(cfg.model.block_size);
    v.curve = read_curve(cfg.train.out_dir + "/metrics.jsonl");
    v.val_loss = s.val_loss;

    // The trained model, for inference, lengths, checks and edges.
    train::CheckpointMeta meta = train::read_checkpoint_meta(s.checkpoint);
    auto model = train::build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
    train::load_model_weights(s.checkpoint, *model);
    model->eval();
    v.params = model->parameter_count();
    v.block_size = model->config().block_size;
    const train::RunData data = train::load_run_data(cfg);
    const std::vector<int32_t>& val = data.val->tokens;
    if (!std::isfinite(v.val_loss)) {
      const LengthResult at_block = measure_length(*model, std::min<int64_t>(model->config().block_size, 1 << 30), val,
                                                   StudyOptions{o.dir, {}, 0, 1, o.eval_tokens, false, {}});
      v.val_loss = at_block.val_loss;
    }
    for (int64_t n : o.lengths) {
      progress("study: " + spec.name + ": inference at length " + std::to_string(n));
      v.lengths.push_back(measure_length(*model, n, val, o));
    }
    if (o.run_checks) {
      progress("study: " + spec.name + ": consistency checks (leakcheck)");
      for (const auto& c : run_model_checks(*model, LeakCheckOptions{}))
        v.checks.push_back({c.name, c.value, c.threshold, c.pass});
    }
    progress("study: " + spec.name + ": edge inputs");
    v.edges = edge_inputs(*model, val);
    train::write_file_atomic(result_path, nlohmann::json{{"key", key}, {"result", variant_json(v)}}.dump(1) + "\n");
    char line[256];
    std::snprintf(line, sizeof line, "study: %s: val loss %.4f, %.0f tok/s, %.1f s, peak RSS %.0f MB",
                  spec.name.c_str(), v.val_loss, v.tokens_per_s, v.wall_s,
                  static_cast<double>(v.peak_rss_bytes) / 1048576.0);
    progress(line);
    result.variants.push_back(v);
  }
  // Gaps to full.
  const VariantResult* full = nullptr;
  for (const auto& v : result.variants)
    if (v.name == "full") full = &v;
  for (auto& v : result.variants) v.val_loss_gap = full ? v.val_loss - full->val_loss : NAN;
  return result;
}

nlohmann::json study_json(const StudyResult& r) {
  nlohmann::json vs = nlohmann::json::array();
  for (const auto& v : r.variants) vs.push_back(variant_json(v));
  return {{"variants", vs},
          {"base", r.base},
          {"budget_tokens", r.options.budget_tokens},
          {"lengths", r.options.lengths},
          {"report", r.options.dir + "/index.html"}};
}

namespace {

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string mib(int64_t b) { return fmt("%.1f", static_cast<double>(b) / 1048576.0); }

}  // namespace

std::string study_table(const StudyResult& r) {
  std::ostringstream o;
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %9s %8s %10s %8s %10s %7s %7s %6s\n", "variant", "val loss", "gap",
                "tokens/s", "wall s", "peak RSS", "steps", "checks", "edges");
  o << line;
  for (const auto& v : r.variants) {
    int cp = 0, ep = 0;
    for (const auto& c : v.checks) cp += c.pass;
    for (const auto& e : v.edges) ep += e.pass;
    std::snprintf(line, sizeof line, "%-16s %9s %8s %10s %8s %8s M %7lld %3d/%-3zu %2d/%zu%s\n", v.name.c_str(),
                  fmt("%.4f", v.val_loss).c_str(), fmt("%+.4f", v.val_loss_gap).c_str(),
                  fmt("%.0f", v.tokens_per_s).c_str(), fmt("%.1f", v.wall_s).c_str(), mib(v.peak_rss_bytes).c_str(),
                  static_cast<long long>(v.steps), cp, v.checks.size(), ep, v.edges.size(),
                  v.resumed ? " (earlier run)" : "");
    o << line;
  }
  o << "\nlength  variant          prefill ms  decode ms/tok  memory MiB  KV MiB  val loss\n";
  for (size_t li = 0; li < r.options.lengths.size(); ++li)
    for (const auto& v : r.variants) {
      if (li >= v.lengths.size()) continue;
      const auto& l = v.lengths[li];
      std::snprintf(line, sizeof line, "%6lld  %-16s %10s %14s %11s %7s %9s%s%s\n", static_cast<long long>(l.length),
                    v.name.c_str(), fmt("%.2f", l.prefill_ms).c_str(), fmt("%.3f", l.decode_ms_per_token).c_str(),
                    l.measured ? mib(l.memory_bytes).c_str() : "-", l.measured ? mib(l.kv_cache_bytes).c_str() : "-",
                    fmt("%.4f", l.val_loss).c_str(), l.skipped.empty() ? "" : ("  [" + l.skipped + "]").c_str(),
                    l.val_skipped.empty() || !l.skipped.empty() ? "" : ("  [loss: " + l.val_skipped + "]").c_str());
      o << line;
    }
  return o.str();
}

namespace {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

// A line chart as inline SVG: one polyline (with dots) per series, axes with 5 ticks each, a legend.
std::string svg_chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                      const std::vector<Series>& series, bool log_x) {
  const double W = 520, H = 320, l = 70, r = 140, t = 30, b = 45;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto tx = [&](double x) { return log_x ? std::log2(x) : x; };
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (log_x && x <= 0)) continue;
      x0 = std::min(x0, tx(x)), x1 = std::max(x1, tx(x)), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"" << W / 2 << "\" y=\"16\" text-anchor=\"middle\" "
    << "font-size=\"13\">" << html_escape(title) << "</text>\n";
  if (!std::isfinite(x0)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">no data</text></svg>\n";
    return o.str();
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= 0.5 * std::max(std::abs(y0), 1e-9), y1 += 0.5 * std::max(std::abs(y1), 1e-9);
  const double pw = W - l - r, ph = H - t - b;
  auto px = [&](double x) { return l + (tx(x) - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return t + (1 - (y - y0) / (y1 - y0)) * ph; };
  o << "<rect x=\"" << l << "\" y=\"" << t << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double xv = x0 + (x1 - x0) * k / 4, yv = y0 + (y1 - y0) * k / 4;
    const double xx = l + pw * k / 4, yy = t + ph * (1 - k / 4.0);
    o << "<text x=\"" << xx << "\" y=\"" << t + ph + 14 << "\" text-anchor=\"middle\">"
      << fmt(log_x ? "%.0f" : "%.3g", log_x ? std::exp2(xv) : xv) << "</text>\n";
    o << "<text x=\"" << l - 4 << "\" y=\"" << yy + 4 << "\" text-anchor=\"end\">" << fmt("%.3g", yv) << "</text>\n";
  }
  o << "<text x=\"" << l + pw / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\">" << html_escape(xlabel)
    << "</text>\n";
  o << "<text transform=\"translate(14," << t + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << html_escape(ylabel) << "</text>\n";
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  for (size_t i = 0; i < series.size(); ++i) {
    const char* c = colours[i % 8];
    std::string pts;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (log_x && x <= 0)) continue;
      pts += fmt("%.1f", px(x)) + "," + fmt("%.1f", py(y)) + " ";
      o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"2.5\" fill=\"" << c << "\"/>\n";
    }
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\" points=\"" << pts << "\"/>\n";
    o << "<text x=\"" << l + pw + 10 << "\" y=\"" << t + 12 + 14 * static_cast<double>(i) << "\" fill=\"" << c << "\">"
      << html_escape(series[i].name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace

void write_study_report(const StudyResult& r) {
  std::ostringstream h;
  h << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>qkv study: " << html_escape(r.base)
    << "</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
       "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td.l{text-align:left}.fail{color:#c00}</style>"
       "</head><body>\n<h1>Attention study of "
    << html_escape(r.base) << "</h1>\n";
  h << "<p>Each variant trained with the same data, seed, schedule and token budget ("
    << (r.options.budget_tokens > 0 ? std::to_string(r.options.budget_tokens) + " tokens"
                                    : std::string("the config's max_steps"))
    << "). Validation loss is the trainer's last evaluation; wall time and tokens/s are the trainer's (evaluation "
       "excluded from the curve's time axis); peak RSS is the process's resident high-water mark during the variant"
       " (reset before it where the kernel allows).</p>\n";
  h << "<table><tr><th>variant</th><th>overrides</th><th>val loss</th><th>gap to full</th><th>tokens/s</th><th>wall "
       "s</th>"
       "<th>peak RSS MiB</th><th>steps</th><th>params</th><th>checks passed</th><th>edges passed</th></tr>\n";
  for (const auto& v : r.variants) {
    int cp = 0, ep = 0;
    for (const auto& c : v.checks) cp += c.pass;
    for (const auto& e : v.edges) ep += e.pass;
    std::string ov;
    for (const auto& s : v.overrides) ov += (ov.empty() ? "" : " ") + s;
    h << "<tr><td class=\"l\">" << html_escape(v.name) << "</td><td class=\"l\">" << html_escape(ov) << "</td><td>"
      << fmt("%.4f", v.val_loss) << "</td><td>" << fmt("%+.4f", v.val_loss_gap) << "</td><td>"
      << fmt("%.0f", v.tokens_per_s) << "</td><td>" << fmt("%.1f", v.wall_s) << "</td><td>" << mib(v.peak_rss_bytes)
      << "</td><td>" << v.steps << "</td><td>" << v.params << "</td><td"
      << (cp < static_cast<int>(v.checks.size()) ? " class=\"fail\"" : "") << ">" << cp << "/" << v.checks.size()
      << "</td><td" << (ep < static_cast<int>(v.edges.size()) ? " class=\"fail\"" : "") << ">" << ep << "/"
      << v.edges.size() << "</td></tr>\n";
  }
  h << "</table>\n";
  std::vector<Series> loss, prefill, decode, memory, len_loss;
  for (const auto& v : r.variants) {
    Series s{v.name, {}}, p{v.name, {}}, d{v.name, {}}, m{v.name, {}}, ll{v.name, {}};
    for (const auto& c : v.curve) s.points.push_back({c.wall_s, c.val_loss});
    for (const auto& l : v.lengths) {
      const double n = static_cast<double>(l.length);
      if (l.measured) {
        p.points.push_back({n, l.prefill_ms});
        d.points.push_back({n, l.decode_ms_per_token});
        m.points.push_back({n, static_cast<double>(l.memory_bytes) / 1048576.0});
      }
      ll.points.push_back({n, l.val_loss});
    }
    loss.push_back(s), prefill.push_back(p), decode.push_back(d), memory.push_back(m), len_loss.push_back(ll);
  }
  h << "<h2>Plots</h2>\n<div>" << svg_chart("validation loss vs training wall time", "seconds", "val loss", loss, false)
    << svg_chart("prefill latency vs length", "tokens (log2)", "ms", prefill, true)
    << svg_chart("decode latency per token vs length", "context tokens (log2)", "ms / token", decode, true)
    << svg_chart("inference memory vs length", "tokens (log2)", "MiB (cache + activations)", memory, true)
    << svg_chart("validation loss vs evaluation length", "tokens (log2)", "val loss", len_loss, true) << "</div>\n";
  h << "<h2>Inference and length</h2>\n<table><tr><th>variant</th><th>length</th><th>prefill ms</th><th>decode "
       "ms/token</th>"
       "<th>memory MiB</th><th>KV cache MiB</th><th>val loss at length</th><th>note</th></tr>\n";
  for (const auto& v : r.variants)
    for (const auto& l : v.lengths)
      h << "<tr><td class=\"l\">" << html_escape(v.name) << "</td><td>" << l.length << "</td><td>"
        << fmt("%.2f", l.prefill_ms) << "</td><td>" << fmt("%.3f", l.decode_ms_per_token) << "</td><td>"
        << (l.measured ? mib(l.memory_bytes) : "-") << "</td><td>" << (l.measured ? mib(l.kv_cache_bytes) : "-")
        << "</td><td>" << fmt("%.4f", l.val_loss) << "</td><td class=\"l\">"
        << html_escape(l.skipped + (l.skipped.empty() || l.val_skipped.empty() ? "" : "; ") + l.val_skipped)
        << "</td></tr>\n";
  h << "</table>\n<h2>Train-vs-inference consistency (leakcheck model checks)</h2>\n<table><tr><th>check</th>";
  for (const auto& v : r.variants) h << "<th>" << html_escape(v.name) << "</th>";
  h << "</tr>\n";
  if (!r.variants.empty())
    for (size_t c = 0; c < r.variants.front().checks.size(); ++c) {
      h << "<tr><td class=\"l\">" << html_escape(r.variants.front().checks[c].name) << "</td>";
      for (const auto& v : r.variants) {
        if (c >= v.checks.size()) {
          h << "<td>-</td>";
          continue;
        }
        const auto& k = v.checks[c];
        h << "<td" << (k.pass ? "" : " class=\"fail\"") << ">" << (k.pass ? "pass " : "FAIL ") << fmt("%.2g", k.value)
          << "</td>";
      }
      h << "</tr>\n";
    }
  h << "</table>\n<h2>Edge inputs</h2>\n<table><tr><th>variant</th><th>input</th><th>documented result</th><th>got</th>"
       "<th></th></tr>\n";
  for (const auto& v : r.variants)
    for (const auto& e : v.edges)
      h << "<tr><td class=\"l\">" << html_escape(v.name) << "</td><td class=\"l\">" << html_escape(e.name)
        << "</td><td class=\"l\">" << html_escape(e.expected) << "</td><td class=\"l\">" << html_escape(e.got)
        << "</td><td" << (e.pass ? "" : " class=\"fail\"") << ">" << (e.pass ? "pass" : "FAIL") << "</td></tr>\n";
  h << "</table>\n</body></html>\n";
  train::write_file_atomic(r.options.dir + "/index.html", h.str());
}

}  // namespace qkv::analysis
