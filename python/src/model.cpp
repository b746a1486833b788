// qkv.load / qkv.Model (inference on a checkpoint or a Hugging Face directory) and qkv.train.
// Every Model call runs under the model's numerics mode and thread count (ModelScope, model.h)
// with the GIL released around the compute; arguments are converted and checked first (with the
// GIL held), so bad input raises qkv.Error before anything runs.
#include "python/src/model.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <omp.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "analysis/model_gradcheck.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "data/batcher.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"
#include "python/src/json.h"
#include "tensor/choice.h"
#include "train/evaluate.h"
#include "train/hf_interop.h"
#include "train/inference.h"
#include "train/sampler.h"
#include "train/trainer.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

Device device_named(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  fail("device '", name, "' is not one of: cpu, cuda");
  return Device::cpu;
}

std::optional<Numerics> numerics_named(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  const Numerics* found = find_choice(kNumericsModes, *name);
  QKV_CHECK(found, "numerics '", *name, "' is not one of: ", names_or(kNumericsModes));
  return *found;
}

// qkv.load's threads=: at least 1, at most train.threads' limit (train::apply_thread_setting).
void check_threads(int64_t threads) {
  const int64_t most = 4 * std::max(1, omp_get_num_procs());
  QKV_CHECK(threads >= 1 && threads <= most, "threads = ", threads, " is outside [1, ", most,
            "] (4 x the processors of this machine: oversubscribed threads wait at every barrier for threads "
            "that are not running); or None for the config's train.threads");
}

int64_t vocab_of(const Model& m) { return m.model->config().vocab_size; }

// Token ids as the model takes them: an int32/int64 array (or list) of 1 or 2 dims, as int64
// [B, T] on the CPU (1 dim: B = 1); every id in [0, vocab) (`allow_ignore`: or -100, a target
// that does not count) and T in [1, block_size] when `check_length`.
Tensor ids_argument(const Model& m, py::handle obj, const char* what, bool check_length = true,
                    bool allow_ignore = false, int64_t* given_dims = nullptr) {
  Tensor t = as_tensor(obj, what);
  if (given_dims) *given_dims = t.dim();
  QKV_CHECK(t.dtype() == DType::i64 || t.dtype() == DType::i32, what, ": dtype ", dtype_name(t.dtype()),
            "; token ids must be integers (int32 or int64)");
  QKV_CHECK(t.dim() == 1 || t.dim() == 2, what, ": shape ", shape_str(t.shape()),
            "; give one sequence [N] or a batch [B, N]");
  if (t.dim() == 1) t = t.reshape({1, t.size(0)});
  t = t.to(Device::cpu).to(DType::i64).contiguous();
  const int64_t T = t.size(1), V = vocab_of(m), block = m.model->config().block_size;
  QKV_CHECK(T >= 1 && t.size(0) >= 1, what, ": no tokens; give at least one");
  QKV_CHECK(!check_length || T <= block, what, ": ", T, " tokens is more than the model's block_size of ", block);
  const int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (allow_ignore && p[i] == kIgnoreIndex) continue;
    QKV_CHECK(p[i] >= 0 && p[i] < V, what, ": token ", p[i], " at ", i, " is outside the model's vocabulary of ", V);
  }
  return t;
}

std::vector<int32_t> id_list(const Model& m, py::handle obj, const char* what) {
  const Tensor t = ids_argument(m, obj, what, /*check_length=*/false);
  QKV_CHECK(t.size(0) == 1, what, ": shape ", shape_str(t.shape()), "; give one sequence of ids");
  const int64_t* p = t.data<int64_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

py::object number_or_none(double v) { return std::isfinite(v) ? py::object(py::float_(v)) : py::object(py::none()); }

// ---- qkv.train's config argument ----

std::string toml_value(py::handle v, const std::string& key) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::int_>(v)) return py::str(v).cast<std::string>();
  if (py::isinstance<py::float_>(v)) {
    const double x = v.cast<double>();
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return py::repr(v).cast<std::string>();  // shortest round-trip form, as TOML reads it
  }
  if (py::isinstance<py::str>(v)) return nlohmann::json(v.cast<std::string>()).dump();  // a TOML basic string
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string s = "[";
    for (py::handle e : v) s += (s.size() > 1 ? ", " : "") + toml_value(e, key);
    return s + "]";
  }
  fail("config: key ", key, " has a value of type ", py::str(py::type::of(v)).cast<std::string>(),
       "; a config dict holds bool, int, float, str, list and dict values");
  return {};
}

// {"model": {"n_layer": 2}, "train": {...}} as TOML text: the dict's scalars, then one table per dict.
void dict_to_toml(const py::dict& d, const std::string& prefix, std::string& out) {
  std::string tables;
  for (auto [k, v] : d) {
    QKV_CHECK(py::isinstance<py::str>(k), "config: key ", py::repr(k).cast<std::string>(), " is not a string");
    const std::string key = k.cast<std::string>();
    const std::string full = prefix.empty() ? key : prefix + "." + key;
    if (py::isinstance<py::dict>(v)) {
      std::string inner;
      dict_to_toml(v.cast<py::dict>(), full, inner);
      tables += "\n[" + full + "]\n" + inner;
    } else {
      out += nlohmann::json(key).dump() + " = " + toml_value(v, full) + "\n";
    }
  }
  out += tables;
}

// A path (str or os.PathLike naming a file), TOML text (a str holding '=' or a newline) or a dict.
Config config_argument(py::handle config, const std::vector<std::string>& sets) {
  if (py::isinstance<py::dict>(config)) {
    std::string text;
    dict_to_toml(config.cast<py::dict>(), "", text);
    return parse_config_text(text, "config (dict)", sets);
  }
  const py::object fspath = py::module_::import("os").attr("fspath");
  if (!py::isinstance<py::str>(config) && py::hasattr(config, "__fspath__"))
    return parse_config(fspath(config).cast<std::string>(), sets);
  QKV_CHECK(py::isinstance<py::str>(config), "config: a ", py::str(py::type::of(config)).cast<std::string>(),
            "; give a TOML file's path, TOML text or a dict");
  const std::string s = config.cast<std::string>();
  if (s.find('\n') != std::string::npos || s.find('=') != std::string::npos)
    return parse_config_text(s, "config (TOML text)", sets);
  return parse_config(s, sets);
}

py::dict train_summary(const train::TrainSummary& s, const Config& cfg) {
  py::dict d;
  d["step"] = s.step;
  d["loss"] = number_or_none(s.loss);
  d["val_loss"] = number_or_none(s.val_loss);
  d["best_val_loss"] = number_or_none(s.best_val_loss);
  d["checkpoint"] = s.checkpoint;
  d["seconds"] = s.seconds;
  d["tokens_per_s"] = s.tokens_per_s;
  d["skipped_steps"] = s.skipped_steps;
  d["nothing_to_do"] = s.nothing_to_do;
  d["stopped"] = s.stopped;
  d["out_dir"] = cfg.train.out_dir;
  return d;
}

py::dict train_binding(py::handle config, py::handle overrides, py::object callback, std::optional<std::string> out_dir,
                       bool quiet, const std::string& resume, const std::string& init_from, bool overwrite,
                       const std::optional<std::string>& numerics, bool change_global_batch) {
  QKV_CHECK(!change_global_batch || !resume.empty(),
            "change_global_batch=True needs resume (a checkpoint to continue)");
  std::vector<std::string> sets;
  if (py::isinstance<py::str>(overrides)) sets.push_back(overrides.cast<std::string>());
  else if (!overrides.is_none())
    for (py::handle o : overrides) {
      QKV_CHECK(py::isinstance<py::str>(o), "overrides: ", py::repr(o).cast<std::string>(),
                " is not a string; each is \"section.key=value\" as --set takes it");
      sets.push_back(o.cast<std::string>());
    }
  if (numerics) {
    numerics_named(numerics);
    sets.push_back("train.numerics=" + *numerics);
  }
  if (out_dir) sets.push_back("train.out_dir=" + *out_dir);
  const Config cfg = config_argument(config, sets);
  QKV_CHECK(callback.is_none() || PyCallable_Check(callback.ptr()), "callback: a ",
            py::str(py::type::of(callback)).cast<std::string>(), " is not callable; give f(metrics: dict) or None");
  train::TrainOptions o;
  o.resume = resume;
  o.init_from = init_from;
  o.overwrite = overwrite;
  o.change_global_batch = change_global_batch;
  o.progress = !quiet;
  // An exception the callback raises stops the run (as returning False does) and is raised again
  // once run_training has returned; so does Ctrl-C (KeyboardInterrupt), noticed at the next logged
  // step, so an interrupted notebook run still ends with its checkpoint.
  std::optional<py::error_already_set> raised;
  o.on_log = [&callback, &raised](const nlohmann::json& metrics) {
    py::gil_scoped_acquire gil;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (callback.is_none()) return true;
      const py::object r = callback(to_python(metrics));
      return !(py::isinstance<py::bool_>(r) && !r.cast<bool>());
    } catch (py::error_already_set& e) {
      raised.emplace(std::move(e));
      return false;
    }
  };
  train::TrainSummary s;
  {
    py::gil_scoped_release nogil;
    const cpu::OmpThreadsGuard keep_threads;  // the run applies train.threads to this thread; restored after
    s = train::run_training(cfg, o);
  }
  if (raised) throw std::move(*raised);
  return train_summary(s, cfg);
}

// ---- qkv.Model ----

// Model.tokenizer: the model's tokenizer, kept alive by the model it came from.
struct TokenizerHandle {
  std::shared_ptr<Model> model;
  const Tokenizer& tok() const { return *model->meta.tokenizer; }
};

train::SampleOptions sample_options(const Model& m, std::optional<int64_t> max_new_tokens,
                                    std::optional<double> temperature, std::optional<int64_t> top_k,
                                    std::optional<double> top_p, std::optional<int64_t> seed, bool kv_cache) {
  const SampleSettings& s = m.meta.config.sample;  // the checkpoint's defaults, as `qkv sample` takes them
  train::SampleOptions o;
  o.max_new_tokens = max_new_tokens.value_or(s.max_new_tokens);
  o.temperature = temperature.value_or(s.temperature);
  o.top_k = top_k.value_or(s.top_k);
  o.top_p = top_p.value_or(s.top_p);
  const int64_t sd = seed.value_or(s.seed);
  QKV_CHECK(sd >= 0, "seed: ", sd, " is negative; give an integer >= 0");
  o.seed = static_cast<uint64_t>(sd);
  o.kv_cache = kv_cache;
  o.token_count = m.meta.tokenizer ? m.meta.tokenizer->vocab_size() : 0;
  return o;
}

// One prompt (str, or a 1-D sequence of ids) or several (a list of them, or a 2-D array).
bool is_single_prompt(py::handle p) {
  if (py::isinstance<py::str>(p)) return true;
  if (py::isinstance<py::array>(p)) return p.cast<py::array>().ndim() <= 1;
  if (py::isinstance<py::list>(p) || py::isinstance<py::tuple>(p)) {
    const py::sequence seq = p.cast<py::sequence>();
    QKV_CHECK(seq.size() > 0, "prompts: an empty list; give a prompt (text or ids) or a list of prompts");
    return !(py::isinstance<py::str>(seq[0]) || py::isinstance<py::sequence>(seq[0]) ||
             py::isinstance<py::array>(seq[0]));
  }
  return true;
}

std::vector<int32_t> prompt_ids(const Model& m, py::handle p, const char* what) {
  if (py::isinstance<py::str>(p)) {
    QKV_CHECK(m.meta.tokenizer, what, ": text needs a tokenizer, and ", m.meta.path,
              " has none; give token ids instead");
    return m.meta.tokenizer->encode(p.cast<std::string>());
  }
  return id_list(m, p, what);
}

py::object completion(const train::Completion& c, bool logprobs) {
  if (!logprobs) return py::cast(c.tokens);
  return py::make_tuple(py::cast(c.tokens),
                        numpy_copy<double>({static_cast<py::ssize_t>(c.logprobs.size())}, c.logprobs.data()));
}

py::object generate(const Model& m, py::handle prompts, std::optional<int64_t> max_new_tokens,
                    std::optional<double> temperature, std::optional<int64_t> top_k, std::optional<double> top_p,
                    std::optional<int64_t> seed, int64_t batch_size, bool logprobs, bool kv_cache) {
  const train::SampleOptions o = sample_options(m, max_new_tokens, temperature, top_k, top_p, seed, kv_cache);
  QKV_CHECK(batch_size >= 1, "batch_size: ", batch_size, " is not >= 1");
  if (is_single_prompt(prompts)) {
    const std::vector<int32_t> ids = prompt_ids(m, prompts, "prompt");
    QKV_CHECK(!ids.empty(), "prompt: no tokens; give at least one");
    train::Completion c;
    {
      py::gil_scoped_release nogil;
      const ModelScope scope(m);
      c.tokens = train::generate(*m.model, ids, o, {}, logprobs ? &c.logprobs : nullptr);
    }
    return completion(c, logprobs);
  }
  std::vector<std::vector<int32_t>> all;
  for (py::handle p : prompts) {
    all.push_back(prompt_ids(m, p, "prompts"));
    QKV_CHECK(!all.back().empty(), "prompts: prompt ", all.size() - 1, " has no tokens; give at least one");
  }
  QKV_CHECK(!all.empty(), "prompts: an empty list; give at least one prompt");
  std::vector<train::Completion> done;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);
    done = train::generate_batch(*m.model, all, o, batch_size, logprobs);
  }
  py::list out;
  for (const auto& c : done) out.append(completion(c, logprobs));
  return out;
}

Tensor logits(const Model& m, const Tensor& ids) {
  py::gil_scoped_release nogil;
  const ModelScope scope(m);
  const autograd::NoGradGuard no_grad;
  nn::ForwardArgs a;
  a.ids = ids;
  return m.model->forward(a).to(Device::cpu);
}

py::array token_logprobs(const Model& m, py::handle obj) {
  int64_t dims = 0;
  const Tensor ids = ids_argument(m, obj, "ids", /*check_length=*/false, false, &dims);
  const int64_t B = ids.size(0), N = ids.size(1);
  QKV_CHECK(N >= 2, "ids: ", N, " token; scoring needs at least 2 (each token after the first is scored)");
  const int64_t* p = ids.data<int64_t>();
  if (dims == 1) {
    // One sequence: `qkv eval --per-token` (windows of block_size + 1, then a partial one).
    const std::vector<int32_t> tokens(p, p + N);
    train::TokenScores t;
    {
      py::gil_scoped_release nogil;
      const ModelScope scope(m);
      t = train::score_tokens(*m.model, tokens, "ids");
    }
    return numpy_copy<double>({static_cast<py::ssize_t>(t.logprob.size())}, t.logprob.data());
  }
  // A batch [B, N]: each row one window (N - 1 <= block_size), scored as score_tokens scores a window.
  const int64_t block = m.model->config().block_size;
  QKV_CHECK(N - 1 <= block, "ids: rows of ", N,
            " tokens; a batch scores one window of at most block_size + 1 = ", block + 1,
            " tokens per row (give one long sequence as a 1-D array)");
  std::vector<int64_t> x, targets;
  std::vector<int32_t> y;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < N; ++t) {
      x.push_back(p[b * N + t]);
      y.push_back(static_cast<int32_t>(p[b * N + t + 1]));
    }
  std::vector<double> lp;
  {
    py::gil_scoped_release nogil;
    const ModelScope scope(m);
    const autograd::NoGradGuard no_grad;
    nn::ForwardArgs a;
    a.ids = from_vector_i64(x, {B, N - 1});
    const Tensor z = m.model->forward(a);
    lp = train::token_logprobs(z.reshape({B * (N - 1), z.size(2)}), y);
  }
  return numpy_copy<double>({B, N - 1}, lp.data());
}

double loss(const Model& m, py::handle ids_obj, py::handle targets_obj) {
  const Tensor ids = ids_argument(m, ids_obj, "ids");
  const Tensor targets = ids_argument(m, targets_obj, "targets", true, /*allow_ignore=*/true);
  QKV_CHECK(ids.shape() == targets.shape(), "targets: shape ", shape_str(targets.shape()), " differs from ids' ",
            shape_str(ids.shape()), "; give one target per token");
  py::gil_scoped_release nogil;
  const ModelScope scope(m);
  const autograd::NoGradGuard no_grad;
  nn::ForwardArgs a;
  a.ids = ids;
  const Tensor z = m.model->forward(a);
  const int64_t V = z.size(2);
  QKV_CHECK(std::any_of(targets.data<int64_t>(), targets.data<int64_t>() + targets.numel(),
                        [](int64_t t) { return t != kIgnoreIndex; }),
            "targets: every target is ", kIgnoreIndex, " (ignored); the loss needs at least one");
  return ag::cross_entropy(ag::reshape(z, {-1, V}), targets.reshape({-1}).to(z.device()), kIgnoreIndex).item();
}

py::dict gradcheck(const Model& m, int directions, int elements, int64_t seed, double eps, double rtol, double atol,
                   const std::string& only) {
  analysis::ModelGradcheckOptions opt;
  QKV_CHECK(directions >= 0 && elements >= 0, "directions, elements: ", directions, ", ", elements,
            "; each must be >= 0");
  QKV_CHECK(seed >= 0, "seed: ", seed, " is negative; give an integer >= 0");
  QKV_CHECK(eps > 0 && eps < 1, "eps: ", eps, " is outside (0, 1)");
  QKV_CHECK(rtol >= 0 && atol >= 0, "rtol, atol: ", rtol, ", ", atol, "; each must be >= 0");
  opt.directions = directions;
  opt.elements = elements;
  opt.seed = static_cast<uint64_t>(seed);
  opt.eps = eps;
  opt.rtol = rtol;
  opt.atol = atol;
  opt.only = only;
  Config cfg = m.meta.config;
  cfg.model.vocab_size = vocab_of(m);  // the model's rows, not a stand-in
  analysis::ConfigGradcheck run;
  {
    py::gil_scoped_release nogil;
    const cpu::OmpThreadsGuard threads(m.threads);  // the model's thread count
    run = analysis::run_config_gradcheck(cfg, opt);
  }
  const analysis::ModelGradcheckReport& r = run.report;
  py::list dirs, params;
  for (const auto& d : r.directions)
    dirs.append(py::dict(py::arg("analytic") = d.analytic, py::arg("numeric") = d.numeric, py::arg("eps") = d.step,
                         py::arg("abs_err") = d.abs_err, py::arg("rel_err") = d.rel_err, py::arg("pass") = d.pass));
  for (const auto& p : r.params) {
    py::list els;
    for (const auto& e : p.elements)
      els.append(py::dict(py::arg("index") = e.index, py::arg("analytic") = e.analytic, py::arg("numeric") = e.numeric,
                          py::arg("eps") = e.step));
    params.append(py::dict(py::arg("name") = p.name, py::arg("shape") = py::tuple(py::cast(p.shape)),
                           py::arg("elements") = els, py::arg("max_abs_err") = p.max_abs_err,
                           py::arg("max_rel_err") = p.max_rel_err, py::arg("worst") = p.worst,
                           py::arg("pass") = p.pass));
  }
  py::dict d;
  d["pass"] = r.pass;
  d["loss"] = r.loss;
  d["loss_again"] = r.loss_again;
  d["deterministic"] = r.deterministic;
  d["attention_kernel"] = r.attention_kernel;
  d["attention_nodes"] = r.attention_nodes;
  d["directions"] = dirs;
  d["params"] = params;
  d["evaluations"] = r.evaluations;
  d["retried"] = r.retried;
  d["parameters"] = run.parameters;
  d["parameter_tensors"] = run.parameter_tensors;
  d["batch_rows"] = run.batch.x.size(0);
  d["batch_tokens"] = run.batch.x.size(1);
  d["eps"] = eps;
  d["rtol"] = rtol;
  d["atol"] = atol;
  d["seed"] = seed;
  return d;
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<TokenizerHandle>(m, "Tokenizer", "A model's tokenizer (Model.tokenizer).")
      .def_property_readonly(
          "vocab_size", [](const TokenizerHandle& t) { return t.tok().vocab_size(); }, "The number of token ids.")
      .def_property_readonly(
          "kind", [](const TokenizerHandle& t) { return std::string(t.tok().kind()); },
          "Which tokenizer: 'char', 'byte', 'bpe' or 'gpt2_bpe'.")
      .def(
          "encode", [](const TokenizerHandle& t, const std::string& text) { return t.tok().encode(text); },
          py::arg("text"), "The token ids of text (a list of int).")
      .def(
          "decode_bytes",
          [](const TokenizerHandle& t, const std::vector<int64_t>& ids) { return py::bytes(t.tok().decode(ids)); },
          py::arg("ids"), "The bytes of ids (a token may hold part of a UTF-8 character).")
      .def(
          "decode",
          [](const TokenizerHandle& t, const std::vector<int64_t>& ids) {
            return py::bytes(t.tok().decode(ids)).attr("decode")("utf-8", "replace");
          },
          py::arg("ids"), "The text of ids (bytes that are not valid UTF-8 become U+FFFD).");

  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "A model loaded for inference (qkv.load).")
      .def(
          "__repr__",
          [](const Model& self) {
            const nn::ModelConfig& c = self.model->config();
            return cat("<qkv.Model ", nn::family_name(c.family), " n_layer=", c.n_layer, " n_embd=", c.n_embd,
                       " vocab_size=", c.vocab_size, " block_size=", c.block_size,
                       " numerics=", choice_name(kNumericsModes, self.numerics), " threads=", self.threads,
                       " device=", self.device, " path='", self.meta.path, "'>");
          },
          "<qkv.Model family n_layer=... path='...'>.")
      .def_property_readonly(
          "path", [](const Model& self) { return self.meta.path; }, "The checkpoint or directory it was loaded from.")
      .def_property_readonly(
          "numerics", [](const Model& self) { return std::string(choice_name(kNumericsModes, self.numerics)); },
          "The numerics mode every call runs under: 'standard' or 'invariant'.")
      .def_property_readonly(
          "threads", [](const Model& self) { return self.threads; }, "The OpenMP threads every call runs on.")
      .def_property_readonly(
          "device", [](const Model& self) { return self.device; }, "Where its weights live: 'cpu' or 'cuda'.")
      .def_property_readonly(
          "config",
          [](const Model& self) { return py::module_::import("tomllib").attr("loads")(to_toml(self.meta.config)); },
          "The run's resolved config as a dict (the TOML the checkpoint stores, parsed).")
      .def_property_readonly(
          "vocab_size", [](const Model& self) { return vocab_of(self); }, "The number of token ids the model takes.")
      .def_property_readonly(
          "block_size", [](const Model& self) { return self.model->config().block_size; },
          "The longest context (positions) the model attends over.")
      .def_property_readonly(
          "step", [](const Model& self) { return self.meta.state.step; },
          "The training step the checkpoint was written at (0 for an imported model).")
      .def_property_readonly(
          "tokenizer",
          [](const std::shared_ptr<Model>& self) -> py::object {
            if (!self->meta.tokenizer) return py::none();
            return py::cast(TokenizerHandle{self});
          },
          "The tokenizer (encode/decode), or None when the model came without one (an HF directory "
          "without tokenizer files).")
      .def(
          "parameters",
          [](const Model& self) {
            py::dict d;
            for (const auto& p : self.model->named_parameters()) d[py::str(p.name)] = py::cast(p.tensor);
            return d;
          },
          "name -> qkv.Tensor sharing the model's weights (writing through one changes the model).")
      .def(
          "logits", [](const Model& self, py::handle ids) { return logits(self, ids_argument(self, ids, "ids")); },
          py::arg("ids"), "Logits [B, N, V] of ids ([N] or [B, N] int ids; [N] gives B = 1), a qkv.Tensor.")
      .def("loss", &loss, py::arg("ids"), py::arg("targets"),
           "Mean next-token cross-entropy of logits(ids) against targets (same shape; -100 ignored), by the "
           "training loss's kernel.")
      .def("token_logprobs", &token_logprobs, py::arg("ids"),
           "log p(token | the tokens before it) of every token after the first, as a float64 array: a 1-D "
           "sequence as `qkv eval --per-token` scores it (windows of block_size + 1), a 2-D batch row by row.")
      .def("generate", &generate, py::arg("prompts"), py::arg("max_new_tokens") = py::none(),
           py::arg("temperature") = py::none(), py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
           py::arg("seed") = py::none(), py::arg("batch_size") = 1, py::arg("logprobs") = false,
           py::arg("kv_cache") = true,
           "Generates as `qkv sample` does (options default to the checkpoint's [sample]). One prompt (text or a "
           "list of ids) gives the generated ids; a list of prompts gives one list each, decoded with continuous "
           "batching (batch_size rows together). logprobs=True: (ids, log-probabilities) instead.")
      .def("gradcheck", &gradcheck, py::arg("directions") = 4, py::arg("elements") = 4, py::arg("seed") = 1234,
           py::arg("eps") = 1e-5, py::arg("rtol") = 1e-5, py::arg("atol") = 1e-8, py::arg("only") = "",
           "Whole-model gradient check of this model's config in float64 (as `qkv gradcheck --config`); the "
           "report as a dict.");

  m.def(
      "load",
      [](const std::string& path, const std::string& device, std::optional<std::string> numerics,
         const std::string& tokenizer, std::optional<int64_t> threads) {
        const Device dev = device_named(device);
        const std::optional<Numerics> mode = numerics_named(numerics);
        if (threads) check_threads(*threads);
        const bool hf = train::is_hf_directory(path);
        QKV_CHECK(tokenizer.empty() || hf, "tokenizer='", tokenizer, "' is for a Hugging Face directory; ", path,
                  " is a checkpoint, which holds its tokenizer");
        auto model = std::make_shared<Model>();
        {
          py::gil_scoped_release nogil;
          // The load applies the mode and train.threads to this thread, inside these scopes: the
          // model keeps them (its calls run under them, ModelScope) and the thread gets its own back.
          const NumericsGuard keep_mode(qkv::numerics());
          const cpu::OmpThreadsGuard keep_threads;
          train::LoadedModel loaded = hf ? train::load_hf_for_inference(path, dev, mode, tokenizer)
                                         : train::load_for_inference(path, dev, mode);
          model->numerics = qkv::numerics();
          model->threads = threads ? static_cast<int>(*threads) : omp_get_max_threads();
          model->model = std::move(loaded.model);
          model->meta = std::move(loaded.meta);
        }
        model->device = device;
        return model;
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("numerics") = py::none(), py::arg("tokenizer") = "",
      py::arg("threads") = py::none(),
      "Loads a qkv checkpoint (.h5) or a Hugging Face model directory (config.json + safetensors) for "
      "inference; numerics: 'standard' or 'invariant' (default: the config's train.numerics); tokenizer: "
      "'byte' for an HF directory without tokenizer files whose ids are bytes (as qkv import --tokenizer); "
      "threads: the OpenMP threads its calls run on (default: the config's train.threads, or when that is 0 "
      "the loading thread's count). The mode and the thread count are the model's own: each call sets them "
      "on the calling thread for its duration.");

  m.def("train", &train_binding, py::arg("config"), py::arg("overrides") = py::tuple(),
        py::arg("callback") = py::none(), py::arg("out_dir") = py::none(), py::arg("quiet") = true,
        py::arg("resume") = "", py::arg("init_from") = "", py::arg("overwrite") = false,
        py::arg("numerics") = py::none(), py::arg("change_global_batch") = false,
        "Trains as `qkv train` does. config: a TOML file's path, TOML text or a dict; overrides: --set "
        "strings (numerics, out_dir: train.numerics, train.out_dir); callback(metrics) after every logged step "
        "(returning False stops the run, checkpoint "
        "written); change_global_batch: let resume continue with another global batch (qkv train "
        "--change-global-batch); returns the summary as a dict.");
}

}  // namespace qkv::python
