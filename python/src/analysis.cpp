// The analysis tools as functions returning data: qkv.leakcheck, qkv.consistency,
// qkv.attention_map, qkv.heads, qkv.cost, qkv.study. Each runs what its `qkv` command runs
// (app/cmd_*.cpp) through the same analysis/ functions and returns what the command's --json
// prints, as Python objects (json.h); array data the command only draws (attention weights, gaps
// by position, per-head score grids) comes as numpy arrays. Nothing is written but the training
// runs a study needs. The GIL is released around every computation.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>

#include "analysis/attention_map.h"
#include "analysis/cost.h"
#include "analysis/heads.h"
#include "analysis/leakcheck.h"
#include "analysis/study.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"
#include "python/src/json.h"
#include "python/src/model.h"
#include "tensor/choice.h"
#include "tensor/error.h"
#include "tensor/value_range.h"
#include "train/atomic_file.h"
#include "train/config.h"
#include "train/memory_budget.h"
#include "train/output_paths.h"
#include "train/session.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

// ---- arguments ----

int64_t int_arg(const char* fn, const char* name, int64_t v, IntRange r) {
  QKV_CHECK(r.contains(v), fn, ": ", name, " must be ", describe(r), "; got ", v);
  return v;
}

double real_arg(const char* fn, const char* name, double v, const RealRange& r) {
  QKV_CHECK(r.contains(v), fn, ": ", name, " must be ", describe(r), "; got ", v);
  return v;
}

// numerics=None: the model's own mode (qkv.load's).
Numerics numerics_arg(const Model& m, const std::optional<std::string>& name) {
  if (!name) return m.numerics;
  const Numerics* found = find_choice(kNumericsModes, *name);
  QKV_CHECK(found, "numerics '", *name, "' is not one of: ", names_or(kNumericsModes));
  return *found;
}

// A str, or an iterable of str (each item checked), as a list.
std::vector<std::string> strings_arg(const char* fn, const char* name, py::handle obj) {
  if (py::isinstance<py::str>(obj)) return {obj.cast<std::string>()};
  std::vector<std::string> out;
  QKV_CHECK(py::isinstance<py::iterable>(obj), fn, ": ", name, " must be a str or a list of str, not ",
            std::string(py::str(py::type::of(obj).attr("__name__"))));
  for (py::handle item : obj) {
    QKV_CHECK(py::isinstance<py::str>(item), fn, ": ", name, " must hold str items, not ",
              std::string(py::str(py::type::of(item).attr("__name__"))));
    out.push_back(item.cast<std::string>());
  }
  return out;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Token ids of `input`: a str is encoded with the model's tokenizer; anything else goes through
// as_tensor and must be a 1-D array of integers in the vocabulary. `tag` starts each message
// ("[heads]", as the command's).
std::vector<int32_t> token_ids(const Model& m, py::handle input, const char* tag) {
  if (py::isinstance<py::str>(input)) {
    QKV_CHECK(m.meta.tokenizer, tag, " the model has no tokenizer to encode a text with; pass token ids");
    return m.meta.tokenizer->encode(input.cast<std::string>());
  }
  const Tensor t = as_tensor(input, "ids");
  QKV_CHECK(t.shape().size() == 1, tag, " ids must be one sequence (1-D), got ", t.shape().size(), " dimensions");
  QKV_CHECK(t.dtype() == DType::i32 || t.dtype() == DType::i64, tag, " ids must hold integers");
  std::vector<int32_t> ids;
  const int64_t vocab = m.model->config().vocab_size;
  for (double v : t.to_vector()) {
    QKV_CHECK(v >= 0 && v < static_cast<double>(vocab), tag, " token ", static_cast<int64_t>(v),
              " is outside the vocabulary of ", vocab);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// A float64 numpy array of `v`.
py::array_t<double> doubles(const std::vector<double>& v) {
  return numpy_copy<double>({static_cast<py::ssize_t>(v.size())}, v.data());
}

// ---- configs: a path, TOML text, or a dict of sections ----

// One value of a config dict as the TOML an override takes.
std::string toml_value(const std::string& key, py::handle v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(v)) return std::string(py::str(v));
  if (py::isinstance<py::float_>(v)) return std::string(py::repr(v));
  if (py::isinstance<py::str>(v)) return nlohmann::json(v.cast<std::string>()).dump();  // a quoted TOML string
  fail("config: key ", key, " has a value of type ", std::string(py::str(py::type::of(v).attr("__name__"))),
       "; expected bool, int, float or str");
  return {};
}

// {"model": {"n_layer": 2}, "train.lr": 1e-3} as overrides "model.n_layer=2", "train.lr=0.001".
void dict_overrides(py::dict d, const std::string& prefix, std::vector<std::string>& out) {
  for (auto [k, v] : d) {
    QKV_CHECK(py::isinstance<py::str>(k), "config: keys must be str, not ",
              std::string(py::str(py::type::of(k).attr("__name__"))));
    const std::string key = prefix + k.cast<std::string>();
    if (py::isinstance<py::dict>(v)) {
      QKV_CHECK(prefix.empty(), "config: key ", key, " nests deeper than section.key");
      dict_overrides(v.cast<py::dict>(), key + ".", out);
    } else {
      out.push_back(key + "=" + toml_value(key, v));
    }
  }
}

struct ConfigArg {
  std::string path;  // a file, else empty
  std::string text;  // TOML text when not a file
  std::string origin;
};

// config: a path (str or os.PathLike; a str without '=' or a newline), TOML text, or a dict of
// sections (applied as overrides to the defaults, before `overrides`).
ConfigArg config_arg(py::handle config, std::vector<std::string>& overrides) {
  ConfigArg c;
  if (py::isinstance<py::dict>(config)) {
    std::vector<std::string> sets;
    dict_overrides(config.cast<py::dict>(), "", sets);
    overrides.insert(overrides.begin(), sets.begin(), sets.end());
    c.origin = "config dict";
    return c;
  }
  const py::object fspath = py::module_::import("os").attr("fspath");
  std::string s;
  try {
    s = fspath(config).cast<std::string>();
  } catch (const py::error_already_set&) {
    fail("config must be a path, TOML text or a dict, not ",
         std::string(py::str(py::type::of(config).attr("__name__"))));
  }
  if (py::isinstance<py::str>(config) && s.find_first_of("=\n") != std::string::npos) {
    c.text = std::move(s);
    c.origin = "config text";
  } else {
    c.path = std::move(s);
    c.origin = c.path;
  }
  return c;
}

Config parse(const ConfigArg& c, const std::vector<std::string>& overrides) {
  return c.path.empty() ? parse_config_text(c.text, c.origin, overrides) : parse_config(c.path, overrides);
}

// ---- leakcheck ----

// The model-check families `checks` selects (empty: all), validated; "data" selects the dataset checks.
struct CheckSelection {
  std::vector<std::string> families;  // LeakCheckOptions::families
  bool model = true, data = true;     // run any model family; run the dataset checks
};
CheckSelection check_selection(py::handle checks) {
  CheckSelection s;
  if (checks.is_none()) return s;
  std::vector<std::string> names = strings_arg("leakcheck", "checks", checks);
  std::vector<std::string> accepted = analysis::model_check_families();
  accepted.push_back("data");
  for (const auto& f : names)
    QKV_CHECK(std::count(accepted.begin(), accepted.end(), f), "leakcheck: unknown check '", f,
              "'; checks takes: ", joined(accepted));
  QKV_CHECK(!names.empty(), "leakcheck: checks is empty; give None for every check, or some of: ", joined(accepted));
  for (auto& f : names)
    if (f != "data") s.families.push_back(std::move(f));
  s.data = s.families.size() < names.size();
  s.model = !s.families.empty();
  return s;
}

py::object leakcheck(const Model& m, py::handle checks, const std::optional<std::string>& numerics, int64_t ngram,
                     double max_ngram_share, bool consistency, bool self_test) {
  analysis::LeakCheckOptions opts;
  opts.ngram_n = static_cast<int>(int_arg("leakcheck", "ngram", ngram, {1, 1 << 20}));
  opts.max_ngram_share = real_arg("leakcheck", "max_ngram_share", max_ngram_share, {0, 1});
  const CheckSelection selected = check_selection(checks);
  opts.families = selected.families;
  const bool all = selected.model && selected.families.empty();
  const Numerics mode = numerics_arg(m, numerics);

  analysis::LeakCheckReport report;
  report.subject = "checkpoint " + m.meta.path + " (step " + std::to_string(m.meta.state.step) + ")";
  if (m.device != "cpu") report.subject += ", on " + m.device;
  std::optional<analysis::NumericsComparison> cmp;
  std::optional<analysis::SelfTestResult> st;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);
    const NumericsGuard checked_mode(mode);  // numerics= when given, else the model's
    if (selected.model) report.checks = analysis::run_model_checks(*m.model, opts);
    // The reasons of the checks left out, for the families asked for (each skipped name starts with its family's).
    for (auto& na : analysis::not_applicable_checks(*m.model))
      if (all || std::any_of(opts.families.begin(), opts.families.end(),
                             [&](const std::string& f) { return na.first.rfind(f, 0) == 0; }))
        report.skipped.push_back(std::move(na));
    if (selected.data) {
      // As `qkv leakcheck --checkpoint`: the checkpoint's dataset when it loads, else the reason.
      std::optional<train::RunData> data;
      std::string data_error;
      try {
        data = train::load_run_data(m.meta.config);
      } catch (const std::exception& e) { data_error = e.what(); }
      if (data && !m.meta.config.data.random_tokens) {
        auto d = analysis::check_data_leakage(*data->train, *data->val, opts);
        for (auto& c : d.checks) report.checks.push_back(std::move(c));
        for (auto& na : d.skipped) report.skipped.push_back(std::move(na));
      } else {
        const std::string why = data ? "data.random_tokens: no corpus" : "dataset not loadable: " + data_error;
        report.skipped.emplace_back("data.val_ngram_share", why);
        report.skipped.emplace_back("data.duplicated_docs", why);
      }
    }
    if (consistency) cmp = analysis::compare_numerics_modes(*m.model, opts);
    if (self_test) {  // every family: the self-test's verdict counts what any check catches
      analysis::LeakCheckOptions every = opts;
      every.families.clear();
      st = analysis::run_self_test(*m.model, every);
    }
  }
  return to_python(analysis::leakcheck_json(report, st ? &*st : nullptr, cmp ? &*cmp : nullptr));
}

py::dict consistency_mode(const analysis::LeakCheck& c) {
  py::dict d;
  d["max_abs_delta"] = c.value;
  d["threshold"] = c.threshold;
  d["pass"] = c.pass;
  d["diverges_at"] = c.diverges_at >= 0 ? py::object(py::int_(c.diverges_at)) : py::object(py::none());
  d["per_position"] = doubles(c.per_position);
  d["detail"] = c.detail;
  return d;
}

py::dict consistency(const Model& m) {
  analysis::NumericsComparison cmp;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);  // its thread count (the comparison sets each mode itself)
    cmp = analysis::compare_numerics_modes(*m.model, {});
  }
  py::dict out;
  for (size_t i = 0; i < cmp.standard.size() && i < cmp.invariant.size(); ++i) {
    py::dict row;
    row["standard"] = consistency_mode(cmp.standard[i]);
    row["invariant"] = consistency_mode(cmp.invariant[i]);
    out[py::str(cmp.standard[i].name)] = row;
  }
  return out;
}

// ---- attention maps and heads ----

// [L, H, T, T] float32 of `maps` (a layer or a head, when given, is selected: its axis goes).
py::array_t<float> maps_array(const analysis::AttentionMaps& maps, std::optional<int64_t> layer,
                              std::optional<int64_t> head) {
  const int64_t T = maps.tokens, TT = T * T;
  std::vector<int64_t> layers, heads;
  for (int64_t l = 0; l < maps.n_layer; ++l)
    if (!layer || *layer == l) layers.push_back(l);
  for (int64_t h = 0; h < maps.n_head; ++h)
    if (!head || *head == h) heads.push_back(h);
  std::vector<py::ssize_t> shape;
  if (!layer) shape.push_back(static_cast<py::ssize_t>(layers.size()));
  if (!head) shape.push_back(static_cast<py::ssize_t>(heads.size()));
  shape.push_back(T);
  shape.push_back(T);
  py::array_t<float> out(shape);
  float* dst = out.mutable_data();
  for (int64_t l : layers)
    for (int64_t h : heads) {
      std::memcpy(dst, maps.weights[static_cast<size_t>(l)].data<float>() + h * TT, TT * sizeof(float));
      dst += TT;
    }
  return out;
}

py::array_t<float> attention_map(const Model& m, py::handle input, std::optional<int64_t> layer,
                                 std::optional<int64_t> head) {
  const nn::ModelConfig& c = m.model->config();
  QKV_CHECK(!layer || (*layer >= 0 && *layer < c.n_layer), "[attention-map] layer ", *layer, " is outside [0, ",
            c.n_layer, ")");
  QKV_CHECK(!head || (*head >= 0 && *head < c.n_head), "[attention-map] head ", *head, " is outside [0, ", c.n_head,
            ")");
  std::vector<int32_t> ids = token_ids(m, input, "[attention-map]");
  QKV_CHECK(!ids.empty(), "[attention-map] ", py::isinstance<py::str>(input) ? "the text encodes" : "ids has",
            " no tokens");
  // As `qkv attention-map --text`: a longer text is read by its last block_size tokens.
  if (py::isinstance<py::str>(input) && static_cast<int64_t>(ids.size()) > c.block_size)
    ids.erase(ids.begin(), ids.end() - c.block_size);
  analysis::AttentionMaps maps;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);
    maps = analysis::compute_attention_maps(*m.model, ids, m.meta.tokenizer.get());
  }
  return maps_array(maps, layer, head);
}

py::object heads(const Model& m, py::handle input, int64_t windows, int64_t length,
                 const std::optional<std::string>& separators, int64_t local_span, double peak_threshold,
                 double local_threshold, double broad_threshold) {
  constexpr RealRange kThreshold{0, 1, true, false};
  analysis::HeadsOptions o;
  int_arg("heads", "windows", windows, {1, 100000});
  int_arg("heads", "length", length, {0, 1 << 20});
  o.local_span = int_arg("heads", "local_span", local_span, {1, 1 << 20});
  o.peak_threshold = real_arg("heads", "peak_threshold", peak_threshold, kThreshold);
  o.local_threshold = real_arg("heads", "local_threshold", local_threshold, kThreshold);
  o.broad_threshold = real_arg("heads", "broad_threshold", broad_threshold, kThreshold);
  const std::vector<int32_t> ids = token_ids(m, input, "[heads]");
  QKV_CHECK(ids.size() >= 2, "[heads] ", py::isinstance<py::str>(input) ? "the text encodes to " : "ids has ",
            ids.size(), " tokens; need at least 2");
  const int64_t block = m.model->config().block_size;
  QKV_CHECK(length <= block, "[heads] length ", length, " exceeds the model's block_size ", block);
  const int64_t len = length > 0 ? length : block;
  QKV_CHECK(len >= 2, "[heads] length must be >= 2, got ", length);
  // Without a length a text shorter than the block is analysed whole; a length asked for is kept.
  QKV_CHECK(length == 0 || int64_t(ids.size()) >= len, "[heads] ",
            py::isinstance<py::str>(input) ? "the text encodes to " : "ids has ", ids.size(), " tokens; length ", len,
            " needs at least ", len);
  const std::string seps = separators ? *separators : analysis::default_separators();
  const Tokenizer* tok = m.meta.tokenizer.get();
  analysis::HeadsReport r;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);
    const std::vector<bool> is_sep = tok ? analysis::separator_ids(*tok, seps) : std::vector<bool>{};
    r = analysis::analyze_heads(*m.model, analysis::sample_windows(ids, len, windows), is_sep, o, tok);
    r.separators = seps;
  }
  nlohmann::json j = analysis::heads_json(r);
  j["checkpoint"] = m.meta.path;
  py::dict out = to_python(j).cast<py::dict>();
  // Each score as an [n_layer, n_head] grid (heads are layer-major), and the mean maps.
  const int64_t L = r.mean_maps.n_layer, H = r.mean_maps.n_head;
  const std::pair<const char*, double analysis::HeadScores::*> scores[] = {
      {"diagonal", &analysis::HeadScores::diagonal},
      {"previous_token", &analysis::HeadScores::previous_token},
      {"first_token", &analysis::HeadScores::first_token},
      {"separator", &analysis::HeadScores::separator},
      {"local", &analysis::HeadScores::local},
      {"mean_distance", &analysis::HeadScores::mean_distance},
      {"entropy", &analysis::HeadScores::entropy},
      {"entropy_norm", &analysis::HeadScores::entropy_norm},
      {"label_score", &analysis::HeadScores::label_score}};
  py::dict grids;
  for (const auto& [name, field] : scores) {
    py::array_t<double> g({L, H});
    double* d = g.mutable_data();
    for (const auto& h : r.heads) d[h.layer * H + h.head] = h.*field;
    grids[name] = g;
  }
  out["score_grids"] = grids;
  out["mean_maps"] = maps_array(r.mean_maps, std::nullopt, std::nullopt);
  return out;
}

// ---- cost and study ----

py::object cost(py::handle config, std::vector<std::string> overrides, int64_t context, int64_t vocab) {
  analysis::CostOptions o;
  o.context = int_arg("cost", "context", context, {0, 1 << 20});
  o.vocab = int_arg("cost", "vocab", vocab, {0, 1 << 24});
  const ConfigArg c = config_arg(config, overrides);
  nlohmann::json j;
  {
    py::gil_scoped_release nogil;
    const analysis::CostReport r = analysis::estimate_cost(parse(c, overrides), o);
    // As `qkv cost --json`: whether `qkv train` would run it here (train/memory_budget.h).
    const train::MachineMemory mem = train::machine_memory();
    j = analysis::cost_json(r);
    j["config"] = c.path.empty() ? nlohmann::json() : nlohmann::json(c.path);
    j["machine_memory_bytes"] = mem.bytes;
    j["training_step_fits"] = r.peak_step_bytes <= mem.bytes;
  }
  return to_python(j);
}

// A directory that is removed with this object (a study without `dir`, a config given as text).
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    for (int i = 0;; ++i) {
      path = std::filesystem::temp_directory_path() / ("qkv_study_" + std::to_string(rd()));
      std::error_code ec;
      if (std::filesystem::create_directory(path, ec)) return;
      QKV_CHECK(i < 100, "study: cannot create a temporary directory under ",
                std::filesystem::temp_directory_path().string(), ": ", ec.message());
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

py::object study(py::handle config, py::handle variants, std::vector<std::string> overrides,
                 const std::vector<int64_t>& lengths, int64_t budget_tokens, int64_t decode_tokens, int64_t eval_tokens,
                 bool checks, const std::optional<std::string>& dir, py::object progress) {
  analysis::StudyOptions o;
  QKV_CHECK(!lengths.empty(), "study: lengths is empty; give at least one inference length");
  o.lengths.clear();
  for (int64_t l : lengths) o.lengths.push_back(int_arg("study", "lengths", l, {1, 1 << 20}));
  o.budget_tokens = int_arg("study", "budget_tokens", budget_tokens, {0, int64_t{1} << 40});
  o.decode_tokens = int_arg("study", "decode_tokens", decode_tokens, {1, 1 << 20});
  o.eval_tokens = int_arg("study", "eval_tokens", eval_tokens, {1, int64_t{1} << 30});
  o.run_checks = checks;
  if (!progress.is_none()) {
    QKV_CHECK(PyCallable_Check(progress.ptr()), "study: progress must be callable (it receives each line)");
    // Held through a shared_ptr: run_study copies its options without the GIL, and a copied
    // py::object would touch the reference count.
    auto callable = std::make_shared<py::object>(std::move(progress));
    o.progress = [callable](const std::string& line) {
      py::gil_scoped_acquire gil;
      (*callable)(line);
    };
  }
  const auto specs = analysis::parse_variants(joined(strings_arg("study", "variants", variants), ","));
  ConfigArg c = config_arg(config, overrides);
  std::optional<TempDir> work, base_dir;
  if (dir) {
    o.dir = *dir;
    train::OutputGuard guard;
    guard.add_input("config", c.path);
    guard.add_input("data.path", parse(c, overrides).data.path);
    guard.check_dir("dir", o.dir, {.replace = true, .make_parents = true});
  } else {
    o.dir = work.emplace().path.string();
  }
  const bool config_is_text = c.path.empty();
  if (config_is_text) {  // run_study reads its base from a file: the text (or dict) written to one
    c.path = (base_dir.emplace().path / "base.toml").string();
    train::write_file_atomic(c.path, c.text);
  }
  analysis::StudyResult r;
  {
    py::gil_scoped_release nogil;
    const cpu::OmpThreadsGuard keep_threads;  // each run applies its train.threads to this thread
    r = analysis::run_study(c.path, overrides, specs, o);
  }
  nlohmann::json j = analysis::study_json(r);
  if (!dir) j["report"] = nullptr;           // the work directory is gone
  if (config_is_text) j["base"] = c.origin;  // not the file it was written to
  return to_python(j);
}

}  // namespace

void bind_analysis(py::module_& m) {
  m.def("leakcheck", &leakcheck, py::arg("model"), py::arg("checks") = py::none(), py::arg("numerics") = py::none(),
        py::arg("ngram") = 32, py::arg("max_ngram_share") = 0.05, py::arg("consistency") = true,
        py::arg("self_test") = false,
        "The leakage and consistency checks of `qkv leakcheck` on a model, as the dict its --json prints.\n"
        "checks: None (all) or family names (analysis/leakcheck.h; 'data': the dataset checks); numerics:\n"
        "'standard' | 'invariant' (default: the model's); consistency: add both modes side by side.");
  m.def("consistency", &consistency, py::arg("model"),
        "The consistency checks under both numerics modes: {check: {'standard': {...}, 'invariant': {...}}},\n"
        "each with max_abs_delta, threshold, pass, diverges_at (None: never) and per_position (numpy |Δ|).");
  m.def("attention_map", &attention_map, py::arg("model"), py::arg("input"), py::arg("layer") = py::none(),
        py::arg("head") = py::none(),
        "Attention weights on a text (str) or token ids: float32 numpy [n_layer, n_head, N, N] (row = query),\n"
        "without the layer / head axis when one is given.");
  m.def("heads", &heads, py::arg("model"), py::arg("input"), py::arg("windows") = 16, py::arg("length") = 0,
        py::arg("separators") = py::none(), py::arg("local_span") = 4, py::arg("peak_threshold") = 0.5,
        py::arg("local_threshold") = 0.7, py::arg("broad_threshold") = 0.8,
        "Scores and labels of every attention head over a text or token ids, as `qkv heads --json`, plus\n"
        "score_grids ({score: numpy [n_layer, n_head]}) and mean_maps (numpy [n_layer, n_head, T, T]).");
  m.def("cost", &cost, py::arg("config"), py::arg("overrides") = std::vector<std::string>{}, py::arg("context") = 0,
        py::arg("vocab") = 0,
        "Parameters, FLOPs and memory of a config (path, TOML text or dict of sections), as `qkv cost --json`.");
  m.def("study", &study, py::arg("config"), py::arg("variants"), py::arg("overrides") = std::vector<std::string>{},
        py::arg("lengths") = std::vector<int64_t>{256, 1024, 4096}, py::arg("budget_tokens") = 0,
        py::arg("decode_tokens") = 16, py::arg("eval_tokens") = 8192, py::arg("checks") = true,
        py::arg("dir") = py::none(), py::arg("progress") = py::none(),
        "Trains the config once per attention variant and compares them, as `qkv study --json`. dir: the\n"
        "work directory (kept, resumable); None: a temporary one. progress: called with each line.");
}

}  // namespace qkv::python
