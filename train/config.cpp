// Config parsing, overrides, validation and TOML output.
//
// One table (fields_of) lists every key once with a pointer to its member; parsing, `--set`,
// to_toml and config_keys all walk it, so a new key is added in exactly two places: the struct
// in config.h and this table.
#include "train/config.h"

#include "train/config_schema.h"
#include "train/did_you_mean.h"

#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <variant>

#include "data/input_file.h"
#include "tensor/error.h"
#include "train/model_factory.h"

namespace qkv {
namespace {

// Every enumerated setting is one of these: an enum spelt by its table (spellings(E)), or an
// optional one whose "" is the family default.
using FieldPtr =
    std::variant<int64_t*, double*, bool*, std::optional<bool>*, std::string*, nn::Family*,
                 std::optional<nn::Position>*, std::optional<nn::NormKind>*, std::optional<nn::Activation>*,
                 attn::Kernel*, AttentionChoice*, attn::LinearFeature*, TokenizerKind*, DocSeparator*, BatchMode*,
                 Padding*, Device*, DType*, train::LrScheduleKind*, std::optional<Numerics>*>;

template <class T>
struct IsOptionalEnum : std::false_type {};
template <class E>
struct IsOptionalEnum<std::optional<E>> : std::bool_constant<!std::is_same_v<E, bool>> {};

// A field written as a TOML string: text, or an enum spelt by name.
bool is_text(const FieldPtr& p) {
  return !std::holds_alternative<int64_t*>(p) && !std::holds_alternative<double*>(p) &&
         !std::holds_alternative<bool*>(p) && !std::holds_alternative<std::optional<bool>*>(p);
}

// `range`: what a numeric key accepts, checked by validate() before any other rule. A key that
// maps one to one onto nn::ModelConfig has its range there (ModelConfig::validate, the model's
// own rules, which validate() runs too) and none here.
using KeyRange = std::variant<std::monostate, IntRange, RealRange>;

// A key's row: its name, the member it reads into (whose C++ type and default are the key's),
// what it means, the range a numeric key accepts (checked by validate() before any other rule;
// a key that maps one to one onto nn::ModelConfig has its range there, nn::model_key_range), and
// the model.attention_pattern values a key applies to (empty: all; away from its default under
// any other pattern it is refused).
struct Field {
  const char* section;
  const char* key;
  FieldPtr ptr;
  const char* help;
  KeyRange range = {};
  std::vector<std::string_view> used_by = {};
  // Why values above the range are refused, when the range alone does not say (a feature not
  // implemented): appended to the range error.
  const char* above = nullptr;
  std::string name() const { return std::string(section) + "." + key; }
};

constexpr int64_t kMaxSize = int64_t{1} << 20;    // sizes and counts of one run (tokens, positions, rows)
constexpr int64_t kMaxSteps = 1'000'000'000'000;  // steps and step intervals

const char* const kSections[] = {"model", "data", "train", "sample"};

// Every key, once, in the order to_toml writes them: the one declaration of each setting.
std::vector<Field> fields_of(Config& c) {
  ModelSettings& m = c.model;
  DataSettings& d = c.data;
  TrainSettings& t = c.train;
  SampleSettings& s = c.sample;
  const std::vector<std::string_view> globals{"global", "bigbird"}, blocks{"bigbird", "block_sparse"};
  return {
      {"model", "family", &m.family, "a preset for position, norm, activation, bias and tie_embeddings"},
      {"model", "n_layer", &m.n_layer, "transformer blocks"},
      {"model", "n_head", &m.n_head, "query heads"},
      {"model", "n_kv_head", &m.n_kv_head, "key/value heads; 0 = n_head (multi-head), 1 = multi-query, else GQA",
       IntRange{0, 1024}},
      {"model", "n_embd", &m.n_embd, "width C of the residual stream; n_embd / n_head is the head size"},
      {"model", "block_size", &m.block_size, "the longest context in tokens"},
      {"model", "vocab_size", &m.vocab_size, "rows of the embedding; 0 = the tokenizer's",
       IntRange{0, int64_t{1} << 24}},
      {"model", "dropout", &m.dropout, "embedding and residual dropout"},
      {"model", "attn_dropout", &m.attn_dropout, "dropout on the attention weights"},
      {"model", "norm_eps", &m.norm_eps, "epsilon of LayerNorm / RMSNorm"},
      {"model", "rope_theta", &m.rope_theta, "RoPE base"},
      {"model", "ffn_hidden", &m.ffn_hidden,
       "MLP width; 0 = the family's (gpt2: 4C; llama: 2/3 of 4C rounded up to ffn_multiple_of)", IntRange{0, kMaxSize}},
      {"model", "ffn_multiple_of", &m.ffn_multiple_of, "llama's rounding of the default ffn_hidden",
       IntRange{1, 65536}},
      {"model", "position", &m.position, "position scheme; \"\" = the family's (gpt2: learned, llama: rope)"},
      {"model", "norm", &m.norm, "norm; \"\" = the family's (gpt2: layernorm, llama: rmsnorm)"},
      {"model", "activation", &m.activation, "MLP activation; \"\" = the family's (gpt2: gelu_tanh, llama: swiglu)"},
      {"model", "bias", &m.bias, "biases in linear layers and norms; unset = the family's (gpt2: true, llama: false)"},
      {"model", "tie_embeddings", &m.tie_embeddings,
       "the LM head shares the token embedding; unset = the family's (gpt2: true, llama: false)"},
      {"model", "window", &m.window, "sliding window: each query sees its last `window` keys; 0 = none"},
      {"model", "init_std", &m.init_std, "standard deviation of the initial weights"},
      {"model", "attn_kernel", &m.attn_kernel, "fused (tiled online softmax) or reference (naive, for checks)"},
      {"model", "attention_pattern", &m.attention_pattern,
       "softmax attention under a sparse pattern (docs/attention.md), or linear attention (O(N), a recurrent "
       "decode state)"},
      {"model", "linear_feature", &m.linear_feature, "linear attention's feature map φ", {}, {"linear"}},
      {"model",
       "linear_features",
       &m.linear_features,
       "favor's m random features; 0 = the head size",
       IntRange{0, 65536},
       {"linear"}},
      {"model",
       "linear_chunk",
       &m.linear_chunk,
       "keys per chunk of the causal training form (any value is exact)",
       IntRange{1, kMaxSize},
       {"linear"}},
      {"model",
       "pattern_stride",
       &m.pattern_stride,
       "strided: s; 0 = ceil(sqrt(block_size))",
       IntRange{0, kMaxSize},
       {"strided"}},
      {"model",
       "pattern_local",
       &m.pattern_local,
       "local width l; 0 = the pattern's default (window, bigbird: the pattern block size; strided: s; global: 1)",
       IntRange{0, kMaxSize},
       {"window", "strided", "global", "bigbird"}},
      {"model", "pattern_global", &m.pattern_global, "the first g positions are global", IntRange{0, kMaxSize},
       globals},
      {"model",
       "pattern_global_tokens",
       &m.pattern_global_tokens,
       "the global positions as a list (\"0,17,33\"), instead of pattern_global",
       {},
       globals},
      {"model",
       "pattern_random_blocks",
       &m.pattern_random_blocks,
       "random key blocks per query block",
       IntRange{0, kMaxSize},
       {"bigbird"}},
      {"model", "pattern_block_size", &m.pattern_block_size, "block size; 0 = clamp(block_size / 4, 1, 64)",
       IntRange{0, kMaxSize}, blocks},
      {"model",
       "pattern_layout",
       &m.pattern_layout,
       "local_global | fixed | a file of 0/1 rows (one per query block) | \"rows:\" + rows joined by / (how a "
       "checkpoint stores a file's table)",
       {},
       {"block_sparse"}},
      {"model", "pattern_seed", &m.pattern_seed, "seed of the random blocks", IntRange{0, kIntMax}, {"bigbird"}},
      {"data", "path", &d.path, "a text file or a prepared .h5 (`qkv prepare`); may be empty with random_tokens"},
      {"data", "tokenizer", &d.tokenizer,
       "char | byte | bpe (trained on the corpus) | gpt2_bpe (GPT-2's, from a `qkv import` checkpoint)"},
      {"data", "bpe_vocab_size", &d.bpe_vocab_size, "the bpe tokenizer's vocabulary", IntRange{256, kMaxSize}},
      {"data", "separator", &d.separator, "what ends a document in the corpus"},
      {"data", "val_fraction", &d.val_fraction, "share of the corpus held out for evaluation",
       RealRange{0, 1, false, true}},
      {"data", "batching", &d.batching,
       "rows as random windows of the token stream, one document per row (padded), or documents packed end to end "
       "(data/batcher.h)"},
      {"data", "padding_side", &d.padding_side, "where document rows are padded"},
      {"data", "random_tokens", &d.random_tokens, "train on uniform random tokens (benchmarks); no corpus needed"},
      {"train", "device", &t.device, "where the model runs"},
      {"train", "dtype", &t.dtype, "float32, or bf16 autocast (matmuls and attention in bf16)"},
      {"train", "batch_size", &t.batch_size, "rows per micro-batch", IntRange{1, kMaxSize}},
      {"train", "grad_accum", &t.grad_accum, "micro-batches per optimizer step", IntRange{1, kMaxSize}},
      {"train", "seq_len", &t.seq_len, "tokens per training row; 0 = model.block_size", IntRange{0, kMaxSize}},
      {"train", "max_steps", &t.max_steps, "optimizer steps", IntRange{1, kMaxSteps}},
      {"train", "lr", &t.lr, "peak learning rate", RealRange{0, 10}},
      {"train", "min_lr", &t.min_lr, "the cosine schedule's floor", RealRange{0, 10}},
      {"train", "warmup_steps", &t.warmup_steps, "linear warmup steps", IntRange{0, kMaxSteps}},
      {"train", "lr_schedule", &t.lr_schedule, "the schedule after warmup"},
      {"train", "weight_decay", &t.weight_decay, "AdamW's decoupled weight decay (matrices only)", RealRange{0, 10}},
      {"train", "beta1", &t.beta1, "AdamW β1", RealRange{0, 1, false, true}},
      {"train", "beta2", &t.beta2, "AdamW β2", RealRange{0, 1, false, true}},
      {"train", "eps", &t.eps, "AdamW ε; above 0, or a weight whose gradient is 0 would step by 0/0",
       RealRange{0, 1, true, false}},
      {"train", "grad_clip", &t.grad_clip, "clip the global L2 norm of the gradients to this; 0 = off",
       RealRange{0, 1e6}},
      {"train", "seed", &t.seed, "seed of initialization, batches and dropout", IntRange{0, kIntMax}},
      {"train", "out_dir", &t.out_dir, "the run's folder (checkpoints, metrics.jsonl); one run per folder"},
      {"train", "eval_interval", &t.eval_interval, "steps between evaluations", IntRange{1, kMaxSteps}},
      {"train", "eval_batches", &t.eval_batches, "batches per evaluation", IntRange{1, kMaxSize}},
      {"train", "checkpoint_interval", &t.checkpoint_interval, "steps between checkpoints; 0 = only at the end",
       IntRange{0, kMaxSteps}},
      {"train", "keep_last", &t.keep_last, "periodic checkpoints kept", IntRange{1, kMaxSize}},
      {"train", "max_bad_steps", &t.max_bad_steps, "consecutive non-finite steps before training stops",
       IntRange{1, kMaxSize}},
      {"train", "recompute", &t.recompute, "recompute each block's activations in backward (less memory)"},
      {"train", "threads", &t.threads, "CPU threads; 0 = all cores", IntRange{0, 4096}},
      {"train", "log_interval", &t.log_interval, "steps between log lines", IntRange{1, kMaxSteps}},
      {"train",
       "zero",
       &t.zero,
       "optimizer-state sharding: 0 = none, 1 = ZeRO-1",
       IntRange{0, kMaxZeroStage},
       {},
       "ZeRO stages 2 and 3, which shard gradients and parameters, are not implemented"},
      {"train", "dp_bucket_kb", &t.dp_bucket_kb,
       "KiB of gradients per data-parallel all-reduce bucket (speed only: the same bits for any value)",
       IntRange{1, kMaxSize}},
      {"train", "dp_overlap", &t.dp_overlap,
       "start all-reduce buckets during the step's last backward (speed only); false: after it"},
      {"train", "cuda_mma", &t.cuda_mma,
       "bf16 on CUDA: attention on the tensor-core kernels where they apply; false keeps the float32 kernels"},
      {"train", "numerics", &t.numerics,
       "invariant: each token's logits bitwise a function of its prefix (any batch, chunking, KV cache, thread "
       "count or BLAS; docs/consistency.md); standard: BLAS GEMMs; \"\" = invariant on the CPU, standard on CUDA"},
      {"sample", "max_new_tokens", &s.max_new_tokens, "tokens to generate", IntRange{0, 10'000'000}},
      {"sample", "temperature", &s.temperature, "softmax temperature; 0 = greedy", RealRange{0, 10000}},
      {"sample", "top_k", &s.top_k, "keep the k most likely tokens; 0 = off", IntRange{0, int64_t{1} << 24}},
      {"sample", "top_p", &s.top_p, "nucleus: keep the smallest set of mass p; 1 = off", RealRange{0, 1, true, false}},
      {"sample", "seed", &s.seed, "seed of sampling", IntRange{0, kIntMax}},
      {"sample", "prompt", &s.prompt, "text the generation continues"},
  };
}

// " (did you mean model.n_layer?)" when some key is within a typo's reach of `name`.
std::string suggestion(const std::string& name) {
  const std::string best = closest_name(name, config_keys());
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

bool is_section(const std::string& s) {
  return std::find(std::begin(kSections), std::end(kSections), s) != std::end(kSections);
}

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

// Stores node `n` into the field, or throws "<origin>: <key> must be ..., got <type>".
void assign(const Field& f, const toml::node& n, const std::string& origin) {
  auto wrong = [&](const char* want) { fail(origin, ": ", f.name(), " must be ", want, ", got ", toml_type_name(n)); };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (auto v = n.as_integer()) *p = v->get();
          else wrong("an integer");
        } else if constexpr (std::is_same_v<T, double>) {
          if (auto v = n.as_floating_point()) *p = v->get();
          else if (auto i = n.as_integer()) *p = static_cast<double>(i->get());
          else wrong("a number");
        } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) {
          if (auto v = n.as_boolean()) *p = v->get();
          else wrong("a boolean");
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (auto v = n.as_string()) *p = v->get();
          else wrong("a string");
        } else if constexpr (IsOptionalEnum<T>::value) {  // as below; "" = the family default
          const auto* v = n.as_string();
          const auto& table = spellings(typename T::value_type{});
          if (!v) wrong("a string");
          else if (v->get().empty()) p->reset();
          else if (const auto* e = find_choice(table, v->get())) *p = *e;
          else fail(origin, ": ", not_one_of(f.name(), v->get(), names_of(table), true));
        } else {  // an enumerated setting: one of its table's spellings, read into the enum here
          const auto* v = n.as_string();
          if (!v) wrong("a string");
          else if (const T* e = find_choice(spellings(*p), v->get())) *p = *e;
          else fail(origin, ": ", not_one_of(f.name(), v->get(), names_of(spellings(*p)), false));
        }
      },
      f.ptr);
}

Field* find_field(std::vector<Field>& fields, const std::string& section, const std::string& key) {
  for (Field& f : fields)
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

void load_table(Config& cfg, const toml::table& root, const std::string& origin) {
  std::vector<Field> fields = fields_of(cfg);
  for (const auto& [skey, snode] : root) {
    std::string section(skey.str());
    if (!is_section(section))
      fail(origin, ": unknown section [", section, "] (sections are [model], [data], [train], [sample])");
    const toml::table* tbl = snode.as_table();
    if (!tbl) fail(origin, ": ", section, " must be a table ([", section, "]), got ", toml_type_name(snode));
    for (const auto& [kkey, knode] : *tbl) {
      std::string key(kkey.str());
      Field* f = find_field(fields, section, key);
      if (!f) fail(origin, ": unknown key ", section, ".", key, suggestion(section + "." + key));
      assign(*f, knode, origin);
    }
  }
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

std::string format_double(double v) {
  char buf[400];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  auto f = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  if (f.ec == std::errc() && f.ptr - buf <= 8) s.assign(buf, f.ptr);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  if (std::isnan(v)) s = "nan";
  return s;
}

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// The field's value as TOML text (to_toml, first_difference).
std::string field_text(const Field& f) {
  std::ostringstream os;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) os << *p;
        else if constexpr (std::is_same_v<T, double>) os << format_double(*p);
        else if constexpr (std::is_same_v<T, bool>) os << (*p ? "true" : "false");
        else if constexpr (std::is_same_v<T, std::optional<bool>>) os << (p->value_or(false) ? "true" : "false");
        else if constexpr (std::is_same_v<T, std::string>) os << quote(*p);
        else if constexpr (IsOptionalEnum<T>::value) os << quote(*p ? std::string(name_of(**p)) : "");
        else os << quote(std::string(name_of(*p)));
      },
      f.ptr);
  return os.str();
}

// Each numeric key's value against the range its table entry declares; throws
// "<origin>: <key> must be <range>, got <value>".
void check_ranges(Config& cfg, const std::string& origin) {
  for (const Field& f : fields_of(cfg)) {
    if (const auto* r = std::get_if<IntRange>(&f.range)) {
      const int64_t v = *std::get<int64_t*>(f.ptr);
      if (!r->contains(v))
        fail(origin, ": ", f.name(), " must be ", describe(*r), ", got ", v,
             v > r->hi && f.above ? std::string(" (") + f.above + ")" : std::string());
    } else if (const auto* r = std::get_if<RealRange>(&f.range)) {
      const double v = *std::get<double*>(f.ptr);
      if (!r->contains(v)) fail(origin, ": ", f.name(), " must be ", describe(*r), ", got ", format_double(v));
    }
  }
}

// A key that applies to some attention patterns only (its row's used_by), set away from its
// default under another: refused, since the model would silently ignore it.
void check_used_by(Config& cfg, const std::string& origin) {
  Config defaults;
  const std::vector<Field> set = fields_of(cfg), unset = fields_of(defaults);
  const std::string_view pattern = name_of(cfg.model.attention_pattern);
  for (size_t i = 0; i < set.size(); ++i) {
    const std::vector<std::string_view>& users = set[i].used_by;
    if (users.empty() || std::find(users.begin(), users.end(), pattern) != users.end()) continue;
    const std::string value = field_text(set[i]);
    if (value == field_text(unset[i])) continue;
    std::string list;
    for (size_t u = 0; u < users.size(); ++u)
      list += (u == 0 ? "" : u + 1 == users.size() ? " or " : ", ") + std::string(users[u]);
    fail(origin, ": ", set[i].name(), " = ", value, " is only used by model.attention_pattern = ", list, ", not ",
         pattern);
  }
}

}  // namespace

// ---- resolved values ----

nn::Position ModelSettings::resolved_position() const {
  return position.value_or(family == nn::Family::llama ? nn::Position::rope : nn::Position::learned);
}
nn::NormKind ModelSettings::resolved_norm() const {
  return norm.value_or(family == nn::Family::llama ? nn::NormKind::rmsnorm : nn::NormKind::layernorm);
}
nn::Activation ModelSettings::resolved_activation() const {
  return activation.value_or(family == nn::Family::llama ? nn::Activation::swiglu : nn::Activation::gelu_tanh);
}
bool ModelSettings::resolved_bias() const { return bias.value_or(family != nn::Family::llama); }
bool ModelSettings::resolved_tie_embeddings() const { return tie_embeddings.value_or(family != nn::Family::llama); }
int64_t ModelSettings::resolved_n_kv_head() const { return n_kv_head > 0 ? n_kv_head : n_head; }
int64_t ModelSettings::resolved_ffn_hidden() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (family != nn::Family::llama) return 4 * n_embd;
  int64_t h = 2 * (4 * n_embd) / 3;
  int64_t m = ffn_multiple_of > 0 ? ffn_multiple_of : 1;
  return m * ((h + m - 1) / m);
}

Config Config::resolved() const {
  Config c = *this;
  ModelSettings& m = c.model;
  m.position = m.resolved_position();
  m.norm = m.resolved_norm();
  m.activation = m.resolved_activation();
  m.bias = m.resolved_bias();
  m.tie_embeddings = m.resolved_tie_embeddings();
  m.n_kv_head = m.resolved_n_kv_head();
  m.ffn_hidden = m.resolved_ffn_hidden();
  c.train.numerics = c.train.resolved_numerics();
  return c;
}

// ---- parsing ----

Config parse_config_text(const std::string& text, const std::string& origin,
                         const std::vector<std::string>& overrides) {
  Config cfg;
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& at = e.source().begin;
    fail(origin, ":", at.line, ":", at.column, ": TOML syntax error: ", e.description());
  }
  load_table(cfg, root, origin);
  for (const std::string& o : overrides) apply_override(cfg, o);
  validate(cfg, origin);
  return cfg;
}

Config parse_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A directory opens and reads as empty text (which would train the built-in defaults), and a
  // FIFO blocks until some writer appears: only a regular file is a config.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open config file (", std::strerror(errno), ")");
  if (S_ISDIR(st.st_mode)) fail(path, ": is a directory, not a config file");
  if (!S_ISREG(st.st_mode))
    fail(path, ": not a regular file (a pipe, FIFO or device?); the config must be a TOML file");
  return parse_config_text(read_input_file(path, kConfigFileCap, "config file"), path, overrides);
}

void apply_override(Config& cfg, const std::string& assignment) {
  const std::string origin = "--set " + assignment;
  size_t eq = assignment.find('=');
  if (eq == std::string::npos) fail(origin, ": expected section.key=value");
  std::string name = trim(assignment.substr(0, eq));
  std::string value = trim(assignment.substr(eq + 1));
  size_t dot = name.find('.');
  if (dot == std::string::npos) fail(origin, ": expected a dotted key like train.lr, got ", name);
  std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  if (!is_section(section)) fail(origin, ": unknown section [", section, "]", suggestion(name));
  std::vector<Field> fields = fields_of(cfg);
  Field* f = find_field(fields, section, key);
  if (!f) fail(origin, ": unknown key ", name, suggestion(name));

  // Read the value as TOML; anything that is not exactly one TOML value is a bare string.
  toml::table parsed;
  bool is_toml = false;
  try {
    parsed = toml::parse("v = " + value);
    is_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error&) { is_toml = false; }
  const bool string_field = is_text(f->ptr);
  if (is_toml && !(string_field && !parsed["v"].is_string())) {
    assign(*f, *parsed.get("v"), origin);
  } else {
    assign(*f, toml::value<std::string>(value), origin);
  }
}

void validate(const Config& cfg, const std::string& origin) {
  Config scratch = cfg;  // fields_of needs a non-const config; nothing is written
  check_ranges(scratch, origin);
  check_used_by(scratch, origin);
  const ModelSettings& m = cfg.model;
  // Every rule on the model itself is nn::ModelConfig::validate's (the one place it is written),
  // run here on the model these settings describe; vocabulary 1 stands in for the tokenizer's.
  try {
    (void)train::model_config(cfg, 1);
  } catch (const Error& e) { fail(origin, ": ", e.what()); }

  const DataSettings& d = cfg.data;
  if (!d.random_tokens && m.vocab_size > 0) {
    if (d.tokenizer == TokenizerKind::byte && m.vocab_size < 256)
      fail(origin, ": model.vocab_size (", m.vocab_size, ") is smaller than the byte tokenizer's 256");
    if (d.tokenizer == TokenizerKind::bpe && m.vocab_size < d.bpe_vocab_size)
      fail(origin, ": model.vocab_size (", m.vocab_size, ") is smaller than data.bpe_vocab_size (", d.bpe_vocab_size,
           ")");
  }
  if (d.random_tokens && m.vocab_size <= 0)
    fail(origin, ": data.random_tokens needs model.vocab_size > 0 (there is no tokenizer to ask)");

  const TrainSettings& t = cfg.train;
  if (t.seq_len > m.block_size)
    fail(origin, ": train.seq_len (", t.seq_len, ") exceeds model.block_size (", m.block_size, ")");
  if (t.out_dir.empty()) fail(origin, ": train.out_dir must not be empty");
  if (!t.cuda_mma && (t.device != Device::cuda || t.dtype != DType::bf16))
    fail(origin,
         ": train.cuda_mma = false is only used with train.device = \"cuda\" and train.dtype = \"bf16\" "
         "(the tensor-core attention kernels run nowhere else)");
}

namespace {

// The range of type R (IntRange or RealRange) that key's table entry declares.
template <class R>
R key_range(std::string_view key) {
  Config scratch;
  for (const Field& f : fields_of(scratch))
    if (f.name() == key)
      if (const auto* r = std::get_if<R>(&f.range)) return *r;
  fail("internal error: ", key, " has no ", std::is_same_v<R, IntRange> ? "integer" : "real", " range");
}

}  // namespace

IntRange int_key_range(std::string_view key) { return key_range<IntRange>(key); }
RealRange real_key_range(std::string_view key) { return key_range<RealRange>(key); }

// ---- output ----

std::string to_toml(const Config& cfg) {
  Config r = cfg.resolved();
  std::ostringstream os;
  os << "# qkv configuration (resolved: family defaults filled in)\n";
  std::string section;
  for (const Field& f : fields_of(r)) {
    if (section != f.section) {
      section = f.section;
      os << (section == "model" ? "" : "\n") << "[" << section << "]\n";
    }
    os << f.key << " = " << field_text(f) << "\n";
  }
  return os.str();
}

std::string not_one_of(std::string_view key, std::string_view value, const std::vector<std::string_view>& names,
                       bool empty_ok) {
  std::string list;
  for (std::string_view a : names) list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
  return cat(key, " must be one of ", list, (empty_ok ? " (or \"\" for the family default)" : ""), "; got \"", value,
             "\"");
}

std::optional<ConfigDifference> first_difference(const Config& a, const Config& b,
                                                 std::initializer_list<std::string_view> keys) {
  Config ca = a, cb = b;  // fields_of needs non-const configs; nothing is written
  const std::vector<Field> fa = fields_of(ca), fb = fields_of(cb);
  for (size_t i = 0; i < fa.size(); ++i) {
    const std::string name = fa[i].name();
    const bool selected = std::any_of(keys.begin(), keys.end(), [&](std::string_view k) {
      return k.ends_with('.') ? name.starts_with(k) : name == k;
    });
    if (!selected) continue;
    const bool same =
        std::visit([&](auto* p) { return *p == *std::get<std::remove_cvref_t<decltype(p)>>(fb[i].ptr); }, fa[i].ptr);
    if (!same) return ConfigDifference{name, field_text(fa[i]), field_text(fb[i])};
  }
  return std::nullopt;
}

namespace {

template <class T>
struct EnumOf {
  using type = T;
};
template <class E>
struct EnumOf<std::optional<E>> {
  using type = E;
};

// A key's type as the reference shows it: the spellings of an enumerated setting.
std::string type_text(const FieldPtr& ptr) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) return "integer";
        else if constexpr (std::is_same_v<T, double>) return "number";
        else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) return "boolean";
        else if constexpr (std::is_same_v<T, std::string>) return "string";
        else {
          std::string out;
          const auto& table = spellings(typename EnumOf<T>::type{});
          for (std::string_view name : names_of(table)) out += (out.empty() ? "" : " | ") + std::string(name);
          return out;
        }
      },
      ptr);
}

std::string range_text(const Field& f) {
  std::optional<std::variant<IntRange, RealRange>> r;
  if (const auto* i = std::get_if<IntRange>(&f.range)) r = *i;
  else if (const auto* x = std::get_if<RealRange>(&f.range)) r = *x;
  else r = nn::model_key_range(f.name());
  if (!r) return "";
  return std::visit([](const auto& range) { return describe(range); }, *r);
}

bool unset_optional(const FieldPtr& ptr) {
  return std::visit(
      [](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (IsOptionalEnum<T>::value || std::is_same_v<T, std::optional<bool>>) return !p->has_value();
        else return false;
      },
      ptr);
}

}  // namespace

std::vector<KeyDoc> key_docs() {
  Config defaults;
  std::vector<KeyDoc> out;
  for (const Field& f : fields_of(defaults)) {
    KeyDoc d;
    d.key = f.name();
    d.section = f.section;
    d.type = type_text(f.ptr);
    // An unset optional resolves by the family (model keys) or the device (train.numerics).
    d.default_value = !unset_optional(f.ptr)                   ? field_text(f)
                      : std::string_view(f.section) == "train" ? "by train.device"
                                                               : "the family's";
    d.default_is_value = !unset_optional(f.ptr);
    d.accepts = range_text(f);
    d.meaning = f.help;
    for (const auto& u : f.used_by) d.used_by.emplace_back(u);
    out.push_back(std::move(d));
  }
  return out;
}

std::string config_reference() {
  std::ostringstream os;
  std::string section;
  for (const KeyDoc& d : key_docs()) {
    if (section != d.section) {
      section = d.section;
      os << (section == "model" ? "" : "\n") << "### [" << section << "]\n\n"
         << "| key | type | default | accepts | meaning |\n|---|---|---|---|---|\n";
    }
    auto cell = [](const std::string& text) {  // a Markdown table cell
      std::string out;
      for (char ch : text) out += ch == '|' ? "\\|" : std::string(1, ch);
      return out;
    };
    std::string help = cell(d.meaning);
    if (!d.used_by.empty()) {
      help += "; only under model.attention_pattern = ";
      for (size_t u = 0; u < d.used_by.size(); ++u) help += (u ? ", " : "") + d.used_by[u];
    }
    const std::string def = d.default_is_value ? "`" + d.default_value + "`" : d.default_value;
    os << "| `" << d.key << "` | " << cell(d.type) << " | " << def << " | " << d.accepts << " | " << help << " |\n";
  }
  return os.str();
}

std::vector<std::string> attention_defaults() {
  Config defaults;
  std::vector<std::string> out;
  for (const Field& f : fields_of(defaults)) {
    const std::string name = f.name();
    if (f.used_by.empty() && name != "model.attention_pattern" && name != "model.window") continue;
    std::string value = field_text(f);
    if (!value.empty() && value.front() == '"') value = value.substr(1, value.size() - 2);  // --set takes it bare
    out.push_back(name + "=" + value);
  }
  return out;
}

std::vector<std::string> config_keys() {
  Config scratch;
  std::vector<std::string> out;
  for (const Field& f : fields_of(scratch)) out.push_back(f.name());
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates, size_t max_distance) {
  std::string best;
  size_t best_d = max_distance + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace qkv
