// Checkpoint save/load (schema in checkpoint.h).
//
// Layout: /model/<name> holds each parameter under its Hugging Face name and in Hugging Face's
// layout, so `transformers` users and h5py scripts read it without remapping. The only layout
// difference is GPT-2's Conv1D projections (c_attn, c_proj, c_fc), which HF stores [in, out]
// while our Linear keeps [out, in]; swap_layout() maps one to the other, and because a transpose
// is its own inverse the same helper serves save and load. Optimizer moments share the layout of
// their parameter so /optimizer/<name> lines up with /model/<name> element for element.
//
// Loading validates before it touches anything: names, dtypes and shapes of every tensor first,
// then the values (read, checked finite) into temporaries, and only then copies into the model
// or optimizer. A bad file therefore leaves the model as it was, and the error names the first
// problem ("[checkpoint] run/ckpt_10.h5: /model/transformer.wte.weight has shape [65,32] but this
// model expects [65,48] ...").
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "autograd/grad_mode.h"
#include "data/h5.h"
#include "data/h5_atomic.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "train/model_factory.h"

namespace qkv::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "qkv-checkpoint";

template <class... Args>
[[noreturn]] void ckpt_fail(const std::string& path, const Args&... parts) {
  ::qkv::fail("[checkpoint] ", path, ": ", parts...);
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Shape stored_shape(const Shape& s, bool conv1d) { return conv1d ? Shape{s.at(1), s.at(0)} : s; }

// Our layout <-> the stored one, as a contiguous CPU float32 tensor. Without a transpose and for
// a tensor that already is contiguous CPU float32 this is the same handle (no copy).
Tensor swap_layout(const Tensor& t, bool conv1d) {
  Tensor c = t.device() == Device::cpu ? t : t.to(Device::cpu);
  if (c.dtype() != DType::f32) c = c.to(DType::f32);
  return conv1d ? c.transpose(0, 1).contiguous() : c.contiguous();
}

// Names the first NaN/Inf of a contiguous float32 tensor, or returns an empty string.
std::string first_non_finite(const Tensor& t) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return cat("element ", i, " is ", p[i]);
  return {};
}

// HDF5 keeps variable-length strings (our format, config and tokenizer text) in "global heap"
// collections, which carry no checksum, and HDF5 1.10 trusts the object sizes inside them: a
// corrupted size makes it read past the collection and crash (found by the byte-flip test).
// So before HDF5 reads any string, every collection in the file is walked here, and one whose
// objects do not tile it exactly is refused. Layout (HDF5 format spec, 8-byte lengths):
//   "GCOL" | version 1 | 3 reserved zero bytes | u64 collection size (>= 4096, header included)
//   then objects: u16 index | u16 refcount | 4 reserved | u64 size | data padded to 8 bytes;
//   index 0 is the trailing free space, whose size counts its own 16-byte header.
// The signature plus version and reserved bytes (8 fixed bytes) cannot plausibly occur by chance
// inside tensor data, so a match is a collection.
void check_global_heaps(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;  // h5::File::open has already reported unreadable files
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 16) {
    ::close(fd);
    return;
  }
  const auto n = static_cast<uint64_t>(st.st_size);
  void* map = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return;
  const auto* d = static_cast<const unsigned char*>(map);
  auto le = [d](uint64_t at, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | d[at + static_cast<uint64_t>(i)];
    return v;
  };
  std::string problem;
  uint64_t where = 0;
  // The scan goes window by window and drops the pages it has passed: every page of the mapping
  // it touched would otherwise count in the process's resident set until munmap (1.5 GB for a
  // GPT-2 checkpoint with its optimizer state, on top of the model being loaded).
  constexpr uint64_t kWindow = uint64_t(4) << 20;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t dropped = 0;  // [0, dropped) is released
  for (const unsigned char* p = d; problem.empty();) {
    const auto from = static_cast<uint64_t>(p - d), len = std::min(kWindow, n - from);
    p = static_cast<const unsigned char*>(::memmem(p, len, "GCOL", 4));
    if (!p) {
      if (from + len >= n) break;
      p = d + from + len - 3;  // a signature may straddle the windows
      const uint64_t behind = (from + len - 3) / page * page;
      if (behind > dropped) ::madvise(const_cast<unsigned char*>(d) + dropped, behind - dropped, MADV_DONTNEED);
      dropped = std::max(dropped, behind);
      continue;
    }
    const auto at = static_cast<uint64_t>(p - d);
    ++p;
    if (at + 16 > n || d[at + 4] != 1 || d[at + 5] || d[at + 6] || d[at + 7]) continue;
    where = at;
    const uint64_t size = le(at + 8, 8);
    if (size < 4096 || size > n - at) {
      problem = cat("its size ", size, " does not fit the file");
      break;
    }
    const uint64_t end = at + size;
    for (uint64_t q = at + 16; q + 16 <= end;) {
      const uint64_t index = le(q, 2), obj = le(q + 8, 8);
      const uint64_t need = index == 0 ? obj : obj > end - q ? UINT64_MAX : 16 + (obj + 7) / 8 * 8;
      if (need < 16 || need > end - q) {
        problem = cat("object ", index, " of size ", obj, " at byte ", q, " runs past the collection");
        break;
      }
      q += need;
    }
  }
  ::munmap(map, n);
  if (!problem.empty()) ckpt_fail(path, "corrupt HDF5 global heap (string storage) at byte ", where, ": ", problem);
}

// True when the schema in checkpoint.h describes a group (`group`) or dataset named `obj`:
// /data, /data/state, /model, /model/<name>, /optimizer, /optimizer/<name>,
// /optimizer/<name>/{exp_avg, exp_avg_sq}, /rng, /tokenizer, /tokenizer/json, /train.
bool in_schema(const std::string& obj, bool group) {
  static const std::set<std::pair<std::string, bool>> fixed = {
      {"/data", true}, {"/data/state", false}, {"/model", true},           {"/optimizer", true},
      {"/rng", true},  {"/tokenizer", true},   {"/tokenizer/json", false}, {"/train", true}};
  if (fixed.count({obj, group})) return true;
  const auto member = [&](std::string_view parent) {  // the name below `parent`, or ""
    return obj.size() > parent.size() && obj.compare(0, parent.size(), parent) == 0 ? obj.substr(parent.size())
                                                                                    : std::string();
  };
  if (const std::string name = member("/model/"); !name.empty()) return !group && name.find('/') == std::string::npos;
  if (const std::string rest = member("/optimizer/"); !rest.empty()) {
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) return group;
    const std::string leaf = rest.substr(slash + 1);
    return !group && slash > 0 && (leaf == "exp_avg" || leaf == "exp_avg_sq");
  }
  return false;
}

// Opens `path` and checks it is a checkpoint this build can read: every object in it is one the
// schema describes, stored in the file under one name (h5::File::all_objects refuses soft,
// external and extra hard links), so no content can hide where a reader does not look.
h5::File open_checkpoint(const std::string& path) {
  h5::File f = h5::File::open(path);
  check_global_heaps(path);
  if (!f.has_attr("/", "format")) ckpt_fail(path, "not a qkv checkpoint (the root has no 'format' attribute)");
  const std::string format = f.attr_string("/", "format");
  if (format != kFormat) ckpt_fail(path, "not a qkv checkpoint (format is '", format, "', expected '", kFormat, "')");
  const int64_t version = f.attr_int("/", "format_version");
  if (version > kCheckpointFormatVersion)
    ckpt_fail(path, "written by a newer qkv (format_version ", version, "; this build reads up to ",
              kCheckpointFormatVersion, ")");
  if (version < 1) ckpt_fail(path, "invalid format_version ", version);
  for (const auto& [obj, group] : f.all_objects())
    if (!in_schema(obj, group))
      ckpt_fail(path, group ? "group " : "dataset ", obj,
                " is not part of the checkpoint schema (train/checkpoint.h); refused");
  return f;
}

// The config attribute's text lives in HDF5's global heap, which (unlike object headers and
// chunks) carries no checksum, so the text gets its own.
int64_t text_checksum(const std::string& s) { return static_cast<int64_t>(h5::fnv1a64(s.data(), s.size())); }

Config stored_config(const h5::File& f) {
  const std::string text = f.attr_string("/", "config");
  if (f.has_attr("/", "config_fnv1a64") && f.attr_int("/", "config_fnv1a64") != text_checksum(text))
    ckpt_fail(f.path(), "the config attribute fails its checksum (corrupt file)");
  return parse_config_text(text, "checkpoint " + f.path());
}

// The model being saved must be the one the config describes, or the file could never be loaded
// (the same comparison --resume makes: model_difference).
void check_config_matches(const std::string& path, const Config& cfg, const nn::DecoderModel& model, int64_t vocab) {
  if (const auto d = model_difference(model_config(cfg.resolved(), vocab), model.config()))
    ckpt_fail(path, "the config does not describe the model being saved: ", d->key, " is ", d->a, " in the config but ",
              d->b, " in the model");
}

// Checks one stored float32 tensor's type and shape; `what` is its full name for messages.
void check_stored(const h5::File& f, const std::string& obj, const Shape& want) {
  const h5::DatasetInfo info = f.info(obj);
  if (info.type != "float32") ckpt_fail(f.path(), obj, " has type ", info.type, ", expected float32");
  if (info.shape != want)
    ckpt_fail(f.path(), obj, " has shape ", shape_str(info.shape), " but this model expects ", shape_str(want),
              " (was the checkpoint written for another model config?)");
}

// Reads a checked float32 tensor and refuses NaN/Inf, naming the tensor.
Tensor read_finite(const h5::File& f, const std::string& obj) {
  Tensor t = f.read_tensor(obj);
  const std::string bad = first_non_finite(t);
  if (!bad.empty()) ckpt_fail(f.path(), obj, " holds a non-finite value (", bad, ")");
  return t;
}

// Writes `t` (our layout) as `obj` in the stored layout, refusing NaN/Inf so a poisoned model is
// never written over a good checkpoint.
void write_stored(h5::File& f, const std::string& path, const std::string& obj, const Tensor& t, bool conv1d) {
  const Tensor s = swap_layout(t, conv1d);
  const std::string bad = first_non_finite(s);
  if (!bad.empty()) ckpt_fail(path, "refusing to save ", obj, ": it holds a non-finite value (", bad, ")");
  f.write_tensor(obj, s);
}

// "transformer.h.10.x" after "transformer.h.9.x": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string_view na = std::string_view(a).substr(i, ie - i), nb = std::string_view(b).substr(j, je - j);
      const size_t la = na.find_first_not_of('0'), lb = nb.find_first_not_of('0');
      const std::string_view ta = la == std::string_view::npos ? "" : na.substr(la);
      const std::string_view tb = lb == std::string_view::npos ? "" : nb.substr(lb);
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ie, j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// The settings that decide which tensors a model holds and their shapes, as (key, value) pairs:
// two models hold the same names and shapes exactly when these agree. (n_head alone shapes
// nothing: only n_kv_head × head size, the width of k and v, does.)
std::vector<std::pair<std::string, std::string>> tensor_signature(const nn::ModelConfig& c) {
  const bool learned = c.position == nn::Position::learned;
  return {{"model.family", nn::family_name(c.family)},
          {"model.n_layer", std::to_string(c.n_layer)},
          {"model.n_embd", std::to_string(c.n_embd)},
          {"model.vocab_size", std::to_string(c.vocab_size)},
          {"model.ffn_hidden", std::to_string(c.ffn_hidden)},
          {"model.n_kv_head * head size", std::to_string(c.n_kv_head * c.head_dim())},
          {"model.position", learned ? "learned" : "not learned (no position table)"},
          {"model.block_size (rows of the learned position table)", learned ? std::to_string(c.block_size) : "-"},
          {"model.activation", c.activation == nn::Activation::swiglu ? "swiglu" : "not swiglu (no gate)"},
          {"model.bias", c.bias ? "true" : "false"},
          {"model.norm", c.norm == nn::NormKind::layernorm && c.bias ? "layernorm with bias" : "a norm without bias"},
          {"model.tie_embeddings", c.tie_embeddings ? "true" : "false"}};
}

// The model a checkpoint's own config describes, as far as tensors go. The attention keys shape
// no tensor and are put back to their defaults first: a layout file need not exist where the file
// is read, and a config this qkv refuses only for such a key (an inert model.linear_feature under
// a sparse pattern, written by an older qkv) can still be compared.
nn::ModelConfig stored_model(const h5::File& f) {
  const std::string text = f.attr_string("/", "config");
  if (f.has_attr("/", "config_fnv1a64") && f.attr_int("/", "config_fnv1a64") != text_checksum(text))
    ckpt_fail(f.path(), "the config attribute fails its checksum (corrupt file)");
  // The same mapping from settings to model every other reader uses (model_config).
  const Config cfg = parse_config_text(text, "checkpoint " + f.path(), attention_defaults());
  const int64_t vocab = cfg.model.vocab_size > 0 ? cfg.model.vocab_size : load_tokenizer(f, "tokenizer")->vocab_size();
  return model_config(cfg, vocab);
}

}  // namespace

bool is_conv1d_weight(nn::Family family, const std::string& name) {
  return family == nn::Family::gpt2 &&
         (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_proj.weight") ||
          ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_proj.weight"));
}

void save_checkpoint(const std::string& path, const Config& cfg, const nn::DecoderModel& model, const AdamW* opt,
                     const TrainState& state, const Tokenizer& tok) {
  check_config_matches(path, cfg, model, tok.vocab_size());
  if (state.step < 0 || state.step > cfg.train.max_steps)  // what read_checkpoint_meta refuses
    ckpt_fail(path, "refusing to save step ", state.step, ": outside [0, train.max_steps ", cfg.train.max_steps, "]");
  const nn::Family family = model.config().family;
  h5::AtomicWriter writer(path);
  h5::File& f = writer.file();

  f.set_attr("/", "format", kFormat);
  f.set_attr("/", "format_version", kCheckpointFormatVersion);
  // A block_sparse layout file is stored as its table ("rows:..."): the checkpoint is the model it
  // was trained as, whatever later becomes of the file.
  Config stored = cfg;
  stored.model.pattern_layout = attn::inline_layout(model.config().pattern);
  const std::string toml = to_toml(stored);
  f.set_attr("/", "config", toml);
  f.set_attr("/", "config_fnv1a64", text_checksum(toml));
  f.set_attr("/", "step", state.step);
  f.set_attr("/", "tokens_seen", state.tokens_seen);

  f.create_group("rng");
  f.set_attr("rng", "seed", static_cast<int64_t>(state.seed));
  const std::array<int64_t, 5> data_state = state.data.to_array();
  f.write("data/state", data_state.data(), Shape{5});
  f.set_attr("data", "mode", batch_mode_name(state.batch_mode));
  if (state.global_batch_rows > 0) f.set_attr("data", "global_batch_rows", state.global_batch_rows);
  if (state.corpus) {
    f.set_attr("data", "corpus_tokens", state.corpus->tokens);
    f.set_attr("data", "corpus_fnv1a64", static_cast<int64_t>(state.corpus->fnv1a64));
  }
  f.create_group("train");
  f.set_attr("train", "best_val_loss", state.best_val_loss);
  f.set_attr("train", "bad_steps_in_a_row", state.bad_steps_in_a_row);
  f.set_attr("train", "skipped_steps", state.skipped_steps);
  save_tokenizer(f, "tokenizer", tok);

  f.create_group("model");
  std::string order;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    write_stored(f, path, "/model/" + p.name, p.tensor, is_conv1d_weight(family, p.name));
    order += (order.empty() ? "" : "\n") + p.name;
  }
  f.set_attr("model", "parameter_order", order);  // HDF5 lists by name; inspect shows model order

  if (opt) {
    f.create_group("optimizer");
    f.set_attr("optimizer", "step", opt->step_count());
    const auto& params = opt->params();
    const auto& states = opt->states();
    for (size_t i = 0; i < params.size(); ++i) {
      const bool conv1d = is_conv1d_weight(family, params[i].name);
      const std::string group = "/optimizer/" + params[i].name;
      write_stored(f, path, group + "/exp_avg", states[i].exp_avg, conv1d);
      write_stored(f, path, group + "/exp_avg_sq", states[i].exp_avg_sq, conv1d);
    }
  }
  writer.commit();
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  const h5::File f = open_checkpoint(path);
  CheckpointMeta m;
  m.path = path;
  m.format_version = f.attr_int("/", "format_version");
  m.config = stored_config(f);
  TrainState& s = m.state;
  s.step = f.attr_int("/", "step");
  s.tokens_seen = f.attr_int("/", "tokens_seen");
  if (s.step < 0 || s.tokens_seen < 0)
    ckpt_fail(path, "negative step (", s.step, ") or tokens_seen (", s.tokens_seen, ")");
  // A run stops at train.max_steps and saves under its own config, so no run writes a step past it.
  if (s.step > m.config.train.max_steps)
    ckpt_fail(path, "step ", s.step, " is past train.max_steps ", m.config.train.max_steps,
              " of its own config (a run stops there; the step or the config was edited)");
  s.seed = static_cast<uint64_t>(f.attr_int("rng", "seed"));
  const std::vector<int64_t> data_state = f.read_shaped<int64_t>("data/state", Shape{5});
  s.data = BatcherState::from_array(data_state);
  const std::string mode = f.attr_string("data", "mode");
  const BatchMode* batch_mode = find_choice(kBatchModes, mode);
  if (!batch_mode) ckpt_fail(path, "unknown batching mode '", mode, "' in /data");
  s.batch_mode = *batch_mode;
  if (f.has_attr("data", "global_batch_rows")) {
    s.global_batch_rows = f.attr_int("data", "global_batch_rows");
    if (s.global_batch_rows < 1)
      ckpt_fail(path, "global_batch_rows ", s.global_batch_rows, " in /data is not positive");
  }
  if (f.has_attr("data", "corpus_tokens"))
    s.corpus = CorpusFingerprint{f.attr_int("data", "corpus_tokens"),
                                 static_cast<uint64_t>(f.attr_int("data", "corpus_fnv1a64"))};
  s.best_val_loss = f.attr_double("train", "best_val_loss");
  s.bad_steps_in_a_row = f.attr_int("train", "bad_steps_in_a_row");
  s.skipped_steps = f.attr_int("train", "skipped_steps");
  if (s.bad_steps_in_a_row < 0 || s.skipped_steps < 0)
    ckpt_fail(path, "negative skipped-step counts in /train (", s.bad_steps_in_a_row, ", ", s.skipped_steps, ")");
  m.tokenizer = load_tokenizer(f, "tokenizer");
  const int64_t vocab = m.config.model.vocab_size;
  if (vocab > 0 && m.tokenizer->vocab_size() > vocab)
    ckpt_fail(path, "the tokenizer has ", m.tokenizer->vocab_size(), " tokens but model.vocab_size is ", vocab);
  if (!f.has("model")) ckpt_fail(path, "group /model is missing");
  m.has_optimizer = f.has("optimizer");
  return m;
}

namespace {

// load_model_weights' checks, all before a value is read: every parameter of `model` is in /model
// as float32 in its stored shape, /model holds nothing else, and the file's own config describes
// the same tensors.
void check_model_tensors(const h5::File& f, const nn::DecoderModel& model) {
  const std::string& path = f.path();
  if (!f.has("model")) ckpt_fail(path, "group /model is missing");
  const nn::Family family = model.config().family;
  const std::vector<std::string> stored = f.children("model");
  const std::set<std::string> stored_set(stored.begin(), stored.end());
  std::set<std::string> expected;
  for (const nn::NamedParameter& p : model.named_parameters()) {
    const Shape want = stored_shape(p.tensor.shape(), is_conv1d_weight(family, p.name));
    if (!stored_set.count(p.name))
      ckpt_fail(path, "parameter ", p.name, " ", shape_str(want),
                " is missing from /model (was the checkpoint written for another model config?)");
    check_stored(f, "/model/" + p.name, want);
    expected.insert(p.name);
  }
  for (const std::string& name : stored)
    if (!expected.count(name))
      ckpt_fail(path, "/model/", name,
                " is not a parameter of this model (was the checkpoint written for another model config?)");
  // The tensors are this model's; the file's own config must describe the same tensors, or the
  // file contradicts itself (a config edited or written apart from its weights).
  const auto said = tensor_signature(stored_model(f)), held = tensor_signature(model.config());
  for (size_t i = 0; i < said.size(); ++i)
    if (said[i] != held[i])
      ckpt_fail(path, "its config says ", said[i].first, " = ", said[i].second, " but /model holds the tensors of ",
                held[i].second, " (config and tensors disagree; the file was edited or assembled from two models)");
}

// load_optimizer_state's checks, all before a value is read: /optimizer/<name>/{exp_avg,
// exp_avg_sq} for each of `params` (name, our layout's shape) in its stored shape, nothing else,
// and a step count in [0, the checkpoint's step] (the optimizer steps at most once per training
// step; a skipped step does not step it). Returns the step count.
int64_t check_optimizer_tensors(const h5::File& f, const std::vector<StoredTensor>& params) {
  const std::string& path = f.path();
  const nn::Family family = stored_config(f).model.family;
  if (!f.has("optimizer")) ckpt_fail(path, "has no optimizer state (group /optimizer is missing)");
  const int64_t step = f.attr_int("optimizer", "step");
  if (step < 0) ckpt_fail(path, "negative optimizer step ", step);
  const int64_t run_step = f.attr_int("/", "step");
  if (step > run_step)
    ckpt_fail(path, "the optimizer step (attribute step of /optimizer) is ", step, ", past the checkpoint's step ",
              run_step, " (AdamW steps at most once per training step)");
  const std::vector<std::string> stored = f.children("optimizer");
  const std::set<std::string> stored_set(stored.begin(), stored.end());
  std::set<std::string> expected;
  for (const StoredTensor& p : params) {
    const Shape want = stored_shape(p.shape, is_conv1d_weight(family, p.name));
    if (!stored_set.count(p.name))
      ckpt_fail(path, "optimizer state of ", p.name,
                " is missing from /optimizer (was the checkpoint written for another model config?)");
    check_stored(f, "/optimizer/" + p.name + "/exp_avg", want);
    check_stored(f, "/optimizer/" + p.name + "/exp_avg_sq", want);
    expected.insert(p.name);
  }
  for (const std::string& name : stored)
    if (!expected.count(name)) ckpt_fail(path, "/optimizer/", name, " is not a parameter of this optimizer");
  return step;
}

}  // namespace

void load_model_weights(const std::string& path, nn::DecoderModel& model, bool take_buffers) {
  const h5::File f = open_checkpoint(path);
  check_model_tensors(f, model);  // names, types, shapes, the config: all before any value is read
  const nn::Family family = model.config().family;
  const std::vector<nn::NamedParameter> params = model.named_parameters();
  std::vector<Tensor> values;
  values.reserve(params.size());
  for (const nn::NamedParameter& p : params)
    values.push_back(swap_layout(read_finite(f, "/model/" + p.name), is_conv1d_weight(family, p.name)));

  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor dst = params[i].tensor;
    if (take_buffers && dst.device() == Device::cpu && dst.dtype() == DType::f32) dst.set_data(values[i]);
    else copy_(dst, dst.device() == Device::cpu ? values[i] : values[i].to(dst.device()));
  }
}

void load_optimizer_state(const std::string& path, AdamW& opt) {
  const h5::File f = open_checkpoint(path);
  std::vector<StoredTensor> params;
  for (const OptimParam& p : opt.params()) params.push_back({p.name, p.param.shape()});
  const int64_t step = check_optimizer_tensors(f, params);
  const nn::Family family = stored_config(f).model.family;

  std::vector<std::pair<Tensor, Tensor>> values;
  values.reserve(opt.params().size());
  for (const OptimParam& p : opt.params()) {
    const bool conv1d = is_conv1d_weight(family, p.name);
    const std::string group = "/optimizer/" + p.name;
    values.emplace_back(swap_layout(read_finite(f, group + "/exp_avg"), conv1d),
                        swap_layout(read_finite(f, group + "/exp_avg_sq"), conv1d));
  }
  for (size_t i = 0; i < values.size(); ++i) opt.load_state(opt.params()[i].name, values[i].first, values[i].second);
  opt.set_step_count(step);
}

CheckpointLoads check_checkpoint_loads(const std::string& path) {
  const CheckpointMeta meta = read_checkpoint_meta(path);
  // The model load_for_inference builds (and the trainer, for --resume and --init-from).
  const std::unique_ptr<nn::DecoderModel> model = build_model(meta.config.resolved(), meta.tokenizer->vocab_size());
  const h5::File f = open_checkpoint(path);
  check_model_tensors(f, *model);
  CheckpointLoads loads;
  if (meta.has_optimizer) {
    // The trainer's AdamW keeps moments for every parameter (train/trainer.cpp).
    std::vector<StoredTensor> params;
    for (const nn::NamedParameter& p : model->named_parameters()) params.push_back({p.name, p.tensor.shape()});
    check_optimizer_tensors(f, params);
    loads.resume = true;
  }
  return loads;
}

std::vector<StoredTensor> list_model_tensors(const std::string& path) {
  const h5::File f = open_checkpoint(path);
  if (!f.has("model")) ckpt_fail(path, "group /model is missing");
  std::vector<std::string> names = f.children("model");
  std::sort(names.begin(), names.end(), natural_less);
  // The model's own order when the file records it (and it names exactly the stored tensors).
  if (f.has_attr("model", "parameter_order")) {
    std::vector<std::string> order;
    std::istringstream in(f.attr_string("model", "parameter_order"));
    for (std::string line; std::getline(in, line);) order.push_back(line);
    std::vector<std::string> sorted = order;
    std::sort(sorted.begin(), sorted.end(), natural_less);
    if (sorted == names) names = std::move(order);
  }
  std::vector<StoredTensor> out;
  out.reserve(names.size());
  for (const std::string& name : names) {
    const h5::DatasetInfo info = f.info("/model/" + name);
    if (info.type != "float32") ckpt_fail(path, "/model/", name, " has type ", info.type, ", expected float32");
    out.push_back({name, info.shape});
  }
  return out;
}

int64_t verify_checkpoint_data(const std::string& path) {
  const h5::File f = open_checkpoint(path);
  const std::vector<std::string> names = f.all_datasets();
  for (const std::string& name : names) {
    const bool tensor = name.rfind("/model/", 0) == 0 || name.rfind("/optimizer/", 0) == 0;
    if (tensor && f.info(name).type == "float32") (void)read_finite(f, name);
    else f.verify(name);
  }
  return static_cast<int64_t>(names.size());
}

std::optional<int64_t> checkpoint_step(const std::string& name) {
  // ckpt_<digits>.h5 exactly; temporaries (".h5.tmp.*"), best.h5 and anything else are not.
  if (name.size() <= 8 || name.rfind("ckpt_", 0) != 0 || !ends_with(name, ".h5")) return std::nullopt;
  const std::string digits = name.substr(5, name.size() - 8);
  int64_t step = 0;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (err != std::errc() || end != digits.data() + digits.size() || digits[0] == '-' || digits[0] == '+')
    return std::nullopt;
  return step;
}

void prune_checkpoints(const std::string& dir, int64_t keep_last) {
  QKV_CHECK(keep_last >= 1, "[checkpoint] keep_last must be at least 1, got ", keep_last);
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) ::qkv::fail("[checkpoint] cannot list ", dir, ": ", ec.message());
  std::vector<std::pair<int64_t, fs::path>> found;  // (step, file)
  for (const fs::directory_entry& e : it) {
    const std::optional<int64_t> step = checkpoint_step(e.path().filename().string());
    if (!step || !e.is_regular_file(ec)) continue;
    found.emplace_back(*step, e.path());
  }
  if (static_cast<int64_t>(found.size()) <= keep_last) return;
  std::sort(found.begin(), found.end());
  const size_t n_remove = found.size() - static_cast<size_t>(keep_last);
  for (size_t i = 0; i < n_remove; ++i)
    if (!fs::remove(found[i].second, ec) && ec)
      ::qkv::fail("[checkpoint] cannot remove ", found[i].second.string(), ": ", ec.message());
}

}  // namespace qkv::train
