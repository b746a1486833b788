// The attention op from Python: qkv.attention / attention_vjp / gradcheck_attention over
// attn::attention (attention/attention.h, every AttentionOptions field as a keyword of the same
// name), and qkv.linear_attention over attn::linear_attention. The compute runs without the GIL.
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <regex>

#include "attention/attention.h"
#include "attention/linear/linear_attention.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "python/src/bindings.h"
#include "python/src/convert.h"

namespace py = pybind11;

namespace qkv::python {
namespace {

constexpr const char* kAttentionKeys =
    "scale, causal, window, key_padding, key_lengths, allow_mask, bias, alibi_slopes, segment_ids, pattern, "
    "dropout_p, dropout_seed, dropout_offset, fully_masked, kernel, check_invariants";
constexpr const char* kPatternKeys =
    "kind, stride, local, global, global_tokens, random_blocks, block_size, seed, layout";

std::string key_of(py::handle h) { return py::str(h).cast<std::string>(); }

template <class T>
T scalar(py::handle v, const std::string& key, const char* type) {
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    fail("argument '", key, "' must be ", type, ", got ",
         py::str(py::type::of(v).attr("__name__")).cast<std::string>());
  }
  return T{};
}

int64_t nonnegative(py::handle v, const std::string& key) {
  const auto x = scalar<int64_t>(v, key, "an int");
  QKV_CHECK(x >= 0, "argument '", key, "' must be >= 0, got ", x);
  return x;
}

// A sequence of numbers, or a 1-d tensor/array of them.
template <class T>
std::vector<T> number_list(py::handle v, const std::string& key) {
  std::vector<T> out;
  if (py::isinstance<py::sequence>(v) && !py::isinstance<py::str>(v)) {
    for (py::handle x : v) out.push_back(scalar<T>(x, key, "a sequence of numbers"));
    return out;
  }
  const Tensor t = as_tensor(v, key.c_str());
  QKV_CHECK(t.dim() == 1, "argument '", key, "' must be 1-d, got ", shape_str(t.shape()));
  for (double x : t.to_vector()) out.push_back(static_cast<T>(x));
  return out;
}

// pattern: a name ("strided") or a dict {"kind": "strided", "stride": 4, ...} with the keys of
// SparsePattern (the config's model.pattern_* keys without the prefix).
attn::SparsePattern parse_pattern_spec(py::handle spec) {
  attn::SparsePattern p;
  auto kind = [&](py::handle name) {
    const auto s = scalar<std::string>(name, "pattern", "a pattern name");
    QKV_CHECK(attn::parse_pattern(s, &p.kind), "argument 'pattern' = '", s,
              "' is not a pattern (full, window, strided, global, bigbird, block_sparse)");
  };
  if (py::isinstance<py::str>(spec)) {
    kind(spec);
    return p;
  }
  QKV_CHECK(py::isinstance<py::dict>(spec), "argument 'pattern' must be a pattern name or a dict with keys ",
            kPatternKeys);
  auto d = py::reinterpret_borrow<py::dict>(spec);
  QKV_CHECK(d.contains("kind"),
            "argument 'pattern' needs a 'kind' (full, window, strided, global, bigbird, block_sparse)");
  for (auto [key, value] : d) {
    const std::string k = key_of(key), name = "pattern." + k;
    if (k == "kind") kind(value);
    else if (k == "stride") p.stride = nonnegative(value, name);
    else if (k == "local") p.local = nonnegative(value, name);
    else if (k == "global") p.global = nonnegative(value, name);
    else if (k == "global_tokens") p.global_tokens = number_list<int64_t>(value, name);
    else if (k == "random_blocks") p.random_blocks = nonnegative(value, name);
    else if (k == "block_size") p.block_size = nonnegative(value, name);
    else if (k == "seed") p.seed = static_cast<uint64_t>(nonnegative(value, name));
    else if (k == "layout") p.layout = scalar<std::string>(value, name, "a layout name or file");
    else fail("argument 'pattern' has no key '", k, "' (", kPatternKeys, ")");
  }
  if (p.kind == attn::Pattern::block_sparse && p.layout != "local_global" && p.layout != "fixed") attn::load_layout(p);
  return p;
}

// The options of one call from the keywords that differ from their defaults (option_dict).
attn::AttentionOptions parse_options(const py::dict& kw, int64_t nk) {
  attn::AttentionOptions o;
  for (auto [key, value] : kw) {
    const std::string k = key_of(key);
    if (value.is_none() && k != "fully_masked" && k != "kernel") continue;  // None: the default
    if (k == "scale") {
      o.scale = scalar<double>(value, k, "a number");
      QKV_CHECK(o.scale > 0 && std::isfinite(o.scale),
                "argument 'scale' must be a finite number > 0 (None: 1/sqrt(D)), got ", o.scale);
    } else if (k == "causal") {
      o.causal = scalar<bool>(value, k, "a bool");
    } else if (k == "window") {
      o.window = nonnegative(value, k);
    } else if (k == "key_padding") {
      o.key_padding = as_tensor(value, "key_padding");
    } else if (k == "key_lengths") {
      o.key_lengths = number_list<int64_t>(value, k);
    } else if (k == "allow_mask") {
      o.allow_mask = as_tensor(value, "allow_mask");
    } else if (k == "bias") {
      o.bias = as_tensor(value, "bias");
    } else if (k == "alibi_slopes") {
      o.alibi_slopes = number_list<float>(value, k);
    } else if (k == "segment_ids") {
      o.segment_ids = as_tensor(value, "segment_ids");
    } else if (k == "pattern") {
      auto p = parse_pattern_spec(value);
      p.validate_for(nk, "pattern.", "the key count Nk");
      o.pattern = std::make_shared<const attn::SparsePattern>(std::move(p));
    } else if (k == "dropout_p") {
      o.dropout_p = scalar<double>(value, k, "a number");
    } else if (k == "dropout_seed") {
      o.dropout_seed = static_cast<uint64_t>(nonnegative(value, k));
    } else if (k == "dropout_offset") {
      o.dropout_offset = static_cast<uint64_t>(nonnegative(value, k));
    } else if (k == "fully_masked") {
      const auto s = scalar<std::string>(value, k, "'zero' or 'error'");
      QKV_CHECK(s == "zero" || s == "error", "argument 'fully_masked' must be 'zero' or 'error', got '", s, "'");
      o.fully_masked = s == "zero" ? attn::FullyMasked::zero : attn::FullyMasked::error;
    } else if (k == "kernel") {
      const auto s = scalar<std::string>(value, k, "'fused' or 'reference'");
      QKV_CHECK(s == "fused" || s == "reference", "argument 'kernel' must be 'fused' or 'reference', got '", s, "'");
      o.kernel = s == "fused" ? attn::Kernel::fused : attn::Kernel::reference;
    } else if (k == "check_invariants") {
      o.check_invariants = scalar<bool>(value, k, "a bool");
    } else {
      fail("unknown keyword argument '", k, "' (accepted: ", kAttentionKeys, ")");
    }
  }
  return o;
}

// The keyword-only arguments of attention, attention_vjp and gradcheck_attention: the fields of
// attn::AttentionOptions with their defaults (the same values as the struct's), declared once so
// that help() and the stubs show every one. Their order is kAttentionKeys'.
constexpr size_t kOptionCount = 16;
auto option_args() {
  return std::make_tuple(py::arg("scale") = py::none(), py::arg("causal") = false, py::arg("window") = 0,
                         py::arg("key_padding") = py::none(), py::arg("key_lengths") = py::none(),
                         py::arg("allow_mask") = py::none(), py::arg("bias") = py::none(),
                         py::arg("alibi_slopes") = py::none(), py::arg("segment_ids") = py::none(),
                         py::arg("pattern") = py::none(), py::arg("dropout_p") = 0.0, py::arg("dropout_seed") = 0,
                         py::arg("dropout_offset") = 0, py::arg("fully_masked") = "zero", py::arg("kernel") = "fused",
                         py::arg("check_invariants") = false);
}
static_assert(std::tuple_size_v<decltype(option_args())> == kOptionCount);

// Whether an option's value is its default: then it is left out of the options a call was given.
bool is_default(const py::object& value, const py::object& default_value) {
  // An option left out arrives as pybind11's own default object: one pointer comparison per call.
  if (value.is(default_value)) return true;
  if (value.is_none() || default_value.is_none()) return false;
  try {
    return value.equal(default_value);
  } catch (py::error_already_set&) {
    return false;  // no single truth value (an array): given, and parse_options says what is wrong with it
  }
}

// The options given as values, each keyed by its name, leaving out those equal to their default: a
// call that leaves an option out and one that passes its default mean the same.
py::dict option_dict(const py::object* values) {
  py::dict given;
  size_t i = 0;
  std::apply(
      [&](const auto&... arg) {
        (
            [&] {
              const py::object& value = values[i++];
              if (!is_default(value, arg.value)) given[arg.name] = value;
            }(),
            ...);
      },
      option_args());
  return given;
}

// A callable of `lead + kOptionCount` Python objects that hands them to f as one array: the form
// pybind11 needs to give every keyword its own name and default.
template <size_t lead, class F, size_t... I>
auto objects_callable(F f, std::index_sequence<I...>) {
  return [f](std::enable_if_t<(I < lead + kOptionCount), py::object>... a) {
    const std::array<py::object, sizeof...(I)> all{std::move(a)...};
    return f(all);
  };
}
template <size_t lead, class F>
auto objects_callable(F f) {
  return objects_callable<lead>(f, std::make_index_sequence<lead + kOptionCount>{});
}

struct Inputs {
  Tensor q, k, v;
};
Inputs inputs(py::handle q, py::handle k, py::handle v) {
  Inputs in{as_tensor(q, "q"), as_tensor(k, "k"), as_tensor(v, "v")};
  QKV_CHECK(in.k.dim() == 4, "[attention] k must be [B,Hkv,Nk,D], got ", shape_str(in.k.shape()));
  return in;
}

// Gradients of q, k, v for upstream grad_out, through the op's own backward.
std::tuple<Tensor, Tensor, Tensor> vjp(const Inputs& in, const Tensor& grad_out, const attn::AttentionOptions& o) {
  Tensor q = in.q.detach(), k = in.k.detach(), v = in.v.detach();
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  {
    const autograd::GradModeGuard record(true);
    const Tensor out = attn::attention(q, k, v, o);
    autograd::backward(out, grad_out);
  }
  auto grad = [](const Tensor& x) { return x.grad().defined() ? x.grad() : zeros_like(x); };
  return {grad(q), grad(k), grad(v)};
}

py::dict result_dict(const autograd::GradcheckResult& r) {
  py::dict d;
  d["op"] = r.op;
  d["case"] = r.name;
  d["max_abs_err"] = r.max_abs_err;
  d["max_rel_err"] = r.max_rel_err;
  d["pass"] = r.pass;
  if (!r.error.empty()) d["error"] = r.error;
  return d;
}

// gradcheck_attention(q, k, v, *, eps, atol, rtol, seed, only, <options>): options holds the
// attention options that differ from their defaults.
py::dict gradcheck(py::handle q, py::handle k, py::handle v, py::handle eps, py::handle atol, py::handle rtol,
                   py::handle seed, py::handle only_arg, const py::dict& options) {
  autograd::GradcheckOptions g;
  g.eps = scalar<double>(eps, "eps", "a number");
  g.atol = scalar<double>(atol, "atol", "a number");
  g.rtol = scalar<double>(rtol, "rtol", "a number");
  g.seed = static_cast<uint64_t>(nonnegative(seed, "seed"));
  const std::string only = only_arg.is_none() ? ".*" : scalar<std::string>(only_arg, "only", "a regular expression");
  QKV_CHECK(g.eps > 0 && g.eps < 1, "argument 'eps' must be in (0, 1), got ", g.eps);
  QKV_CHECK(g.atol >= 0 && g.rtol >= 0, "arguments 'atol' and 'rtol' must be >= 0");
  if (q.is_none() && k.is_none() && v.is_none()) {
    // The registered cases of the attention ops (`qkv gradcheck --only REGEX` over attention's grid).
    for (const auto& given : options)
      fail("argument '", key_of(given.first),
           "' needs q, k and v (without them the registered cases run; they take eps, atol, rtol, seed, only)");
    std::regex re;
    try {
      re = std::regex(only);
    } catch (const std::regex_error&) { fail("argument 'only' = '", only, "' is not a valid regular expression"); }
    autograd::GradcheckRegistry reg;
    attn::register_attention_gradchecks(reg);
    std::vector<autograd::GradcheckResult> results;
    {
      py::gil_scoped_release release;
      for (const auto& c : reg.cases())
        if (std::regex_search(c.op, re) || std::regex_search(c.op + " " + c.name, re))
          results.push_back(autograd::run_gradcheck(c, g));
    }
    QKV_CHECK(!results.empty(), "argument 'only' = '", only, "' matches no registered attention case");
    py::list checks;
    int passed = 0;
    for (const auto& r : results) {
      checks.append(result_dict(r));
      passed += r.pass;
    }
    py::dict d;
    d["checks"] = checks;
    d["passed"] = passed;
    d["failed"] = static_cast<int>(results.size()) - passed;
    return d;
  }
  QKV_CHECK(!q.is_none() && !k.is_none() && !v.is_none(), "arguments 'q', 'k' and 'v' go together (or none of them)");
  QKV_CHECK(only_arg.is_none(), "argument 'only' selects registered cases: pass it without q, k and v");
  const Inputs in = inputs(q, k, v);
  const attn::AttentionOptions o = parse_options(options, in.k.size(2));
  // Central differences in float64 on copies: the caller's tensors are never perturbed.
  const Tensor q64 = in.q.to(DType::f64).clone(), k64 = in.k.to(DType::f64).clone(), v64 = in.v.to(DType::f64).clone();
  autograd::GradcheckCase c{
      "attention", cat("q ", shape_str(q64.shape()), " k ", shape_str(k64.shape()), " v ", shape_str(v64.shape())),
      [=] {
        return std::vector<Tensor>{q64.clone(), k64.clone(), v64.clone()};
      },
      [o](const std::vector<Tensor>& x) { return attn::attention(x[0], x[1], x[2], o); }};
  autograd::GradcheckResult r;
  {
    py::gil_scoped_release release;
    r = autograd::run_gradcheck(c, g);
  }
  return result_dict(r);
}

}  // namespace

void bind_attention(py::module_& m) {
  const char* attention_doc =
      "Scaled dot-product attention, q [B,Hq,Nq,D], k [B,Hkv,Nk,D], v [B,Hkv,Nk,Dv] -> [B,Hq,Nq,Dv] (float32 or "
      "float64), a qkv.Tensor. The keywords are the fields of attn::AttentionOptions (attention/attention.h); "
      "masks are ANDed. scale None: 1/sqrt(D). window > 0: a causal sliding window. key_padding [B,Nk] bool, "
      "key_lengths [B], allow_mask [B|1,Hq|1,Nq,Nk] bool, bias (added to the scores), alibi_slopes [Hq], "
      "segment_ids [B,N]. pattern: a name ('strided') or a dict {'kind': 'strided', 'stride': 4, 'local': 2, "
      "...} with keys kind, stride, local, global, global_tokens, random_blocks, block_size, seed, layout. "
      "fully_masked: 'zero' | 'error'; kernel: 'fused' | 'reference'.";
  std::apply(
      [&](const auto&... option) {
        m.def("attention", objects_callable<3>([](const auto& a) {
                const Inputs in = inputs(a[0], a[1], a[2]);
                const attn::AttentionOptions o = parse_options(option_dict(&a[3]), in.k.size(2));
                py::gil_scoped_release release;
                return attn::attention(in.q, in.k, in.v, o);
              }),
              py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), option..., attention_doc);
        m.def("attention_vjp", objects_callable<4>([](const auto& a) {
                const Inputs in = inputs(a[0], a[1], a[2]);
                const attn::AttentionOptions o = parse_options(option_dict(&a[4]), in.k.size(2));
                const Tensor g = as_tensor(a[3], "grad_out");
                py::gil_scoped_release release;
                return vjp(in, g, o);
              }),
              py::arg("q"), py::arg("k"), py::arg("v"), py::arg("grad_out"), py::kw_only(), option...,
              "(dq, dk, dv) for the upstream gradient grad_out of attention(q, k, v, **options): the op's "
              "hand-derived backward. The keywords are attention's.");
        m.def("gradcheck_attention", objects_callable<8>([](const auto& a) {
                return gradcheck(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], option_dict(&a[8]));
              }),
              py::arg("q") = py::none(), py::arg("k") = py::none(), py::arg("v") = py::none(), py::kw_only(),
              py::arg("eps") = 1e-6, py::arg("atol") = 1e-5, py::arg("rtol") = 1e-3, py::arg("seed") = 1234,
              py::arg("only") = py::none(), option...,
              "Float64 central differences against the backward of attention(q, k, v, **options), as `qkv "
              "gradcheck` checks each case -> dict(op, case, max_abs_err, max_rel_err, pass[, error]). Without "
              "q, k, v: the registered attention cases whose 'op case' matches only (a regular expression; None: "
              "all) -> dict(checks=[...], passed, failed); they take eps, atol, rtol, seed and only.");
      },
      option_args());
  m.def(
      "_time_attention",
      [](py::handle q, py::handle k, py::handle v, int64_t iters, const py::kwargs& kw) {
        QKV_CHECK(iters > 0, "argument 'iters' must be > 0, got ", iters);
        const Inputs in = inputs(q, k, v);
        const attn::AttentionOptions o = parse_options(kw, in.k.size(2));
        py::gil_scoped_release release;
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i) attn::attention(in.q, in.k, in.v, o);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
               static_cast<double>(iters);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("iters"),
      "Seconds per attention call timed inside C++ over iters calls (bench/python_call_overhead.py).");
  m.def(
      "linear_attention",
      [](py::handle q, py::handle k, py::handle v, const std::string& feature, bool causal, int64_t chunk,
         std::optional<double> scale, double eps, py::handle key_padding, py::handle segment_ids, py::handle projection,
         std::optional<int64_t> features, uint64_t seed) {
        const Inputs in = inputs(q, k, v);
        attn::LinearAttentionOptions o;
        o.feature = attn::parse_linear_feature(feature, "feature");
        o.causal = causal;
        QKV_CHECK(chunk >= 1, "argument 'chunk' must be >= 1, got ", chunk);
        o.chunk = chunk;
        if (scale) {
          QKV_CHECK(*scale > 0 && std::isfinite(*scale), "argument 'scale' must be a finite number > 0, got ", *scale);
          o.scale = *scale;
        }
        QKV_CHECK(eps > 0, "argument 'eps' must be > 0, got ", eps);
        o.eps = eps;
        if (!key_padding.is_none()) o.key_padding = as_tensor(key_padding, "key_padding");
        if (!segment_ids.is_none()) o.segment_ids = as_tensor(segment_ids, "segment_ids");
        const int64_t D = in.q.dim() == 4 ? in.q.size(3) : 1;
        if (!projection.is_none()) {
          QKV_CHECK(o.feature == attn::LinearFeature::favor, "argument 'projection' is used by feature='favor' only");
          o.projection = as_tensor(projection, "projection");
        } else if (o.feature == attn::LinearFeature::favor) {
          const int64_t mdim = features.value_or(D);
          QKV_CHECK(mdim >= 1, "argument 'features' must be >= 1, got ", mdim);
          o.projection = attn::favor_projection(mdim, D, seed);
        }
        py::gil_scoped_release release;
        return attn::linear_attention(in.q, in.k, in.v, o);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("feature") = "elu1", py::arg("causal") = false,
      py::arg("chunk") = 64, py::arg("scale") = py::none(), py::arg("eps") = 1e-6, py::arg("key_padding") = py::none(),
      py::arg("segment_ids") = py::none(), py::arg("projection") = py::none(), py::arg("features") = py::none(),
      py::arg("seed") = 0,
      "Linear attention (attention/linear/linear_attention.h): phi(q)·phi(k) in place of exp(q·k), "
      "feature = 'elu1' | 'relu' | 'favor' (favor: projection W [m, D], or one drawn from seed with "
      "features = m rows, default D). Differentiable in q, k, v.");
}

}  // namespace qkv::python
