// Hugging Face import: such a directory's config.json, tokenizer and weights into a qkv model and
// checkpoint (rules: train/hf_interop.h).
#include "train/hf_interop.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "autograd/grad_mode.h"
#include "data/byte_level_bpe.h"
#include "data/safetensors.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "train/checkpoint.h"
#include "train/hf_common.h"
#include "train/model_factory.h"

namespace qkv::train {

namespace fs = std::filesystem;
namespace st = qkv::safetensors;
using hf::dump;
using hf::json;

namespace {

int64_t get_int(const json& j, const std::string& key, const std::string& where, std::optional<int64_t> dflt = {}) {
  if (!j.contains(key) || j[key].is_null()) {
    QKV_CHECK(dflt.has_value(), where, ": lacks \"", key, "\"");
    return *dflt;
  }
  QKV_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 0, where, ": \"", key, "\" is ", j[key].dump(),
            ", not a non-negative integer");
  return j[key].get<int64_t>();
}
double get_real(const json& j, const std::string& key, const std::string& where, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  QKV_CHECK(j[key].is_number(), where, ": \"", key, "\" is ", j[key].dump(), ", not a number");
  return j[key].get<double>();
}
bool get_bool(const json& j, const std::string& key, const std::string& where, bool dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  QKV_CHECK(j[key].is_boolean(), where, ": \"", key, "\" is ", j[key].dump(), ", not true or false");
  return j[key].get<bool>();
}
std::string get_string(const json& j, const std::string& key, const std::string& where, const std::string& dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  QKV_CHECK(j[key].is_string(), where, ": \"", key, "\" is ", j[key].dump(), ", not a string");
  return j[key].get<std::string>();
}

// The RoPE base of a llama-family config.json, as every transformers version reads it, or refused.
// transformers 4 reads the top-level "rope_theta" (absent: 10000) and scales RoPE when
// "rope_scaling" is an object. transformers 5 reads "rope_parameters" (a non-empty legacy
// "rope_scaling" object in its place), takes its "rope_theta" before the top-level one, and picks
// the variant by its "rope_type" (legacy "type"): "default" is plain RoPE, the others (linear,
// dynamic, yarn, longrope, llama3, ...) scale it. qkv's RoPE is plain and rotates the whole head,
// so any other variant, a partial_rotary_factor, a table per layer type or an unknown key is
// refused by name; and where two keys both give the base with different values, readers of
// different versions would build different models, so that is refused naming both.
double read_rope_theta(const json& j, const std::string& where) {
  struct Stated {
    std::string key;
    double value;
  };
  std::vector<Stated> thetas;
  if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    thetas.push_back({"rope_theta", get_real(j, "rope_theta", where, 0.0)});
  for (const std::string block : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(block) || j[block].is_null()) continue;
    const json& p = j[block];
    QKV_CHECK(p.is_object(), where, ": \"", block, "\" is ", p.dump(), ", not an object");
    const auto refuse = [&](const std::string& key, const json& value, const std::string& why) {
      fail(where, ": \"", block, ".", key, "\" = ", value.dump(), " cannot be imported: ", why);
    };
    // The variant first: a scaled RoPE is named by its type, not by the first of its parameters.
    for (const char* key : {"rope_type", "type"}) {
      if (!p.contains(key) || p[key].is_null()) continue;
      QKV_CHECK(p[key].is_string(), where, ": \"", block, ".", key, "\" is ", p[key].dump(), ", not a string");
      if (p[key] != "default") refuse(key, p[key], "a scaled RoPE (qkv's RoPE has no scaling)");
    }
    for (auto it = p.begin(); it != p.end(); ++it) {
      const std::string& key = it.key();
      const json& v = it.value();
      if (key == "rope_type" || key == "type") continue;
      if (key == "rope_theta") {
        QKV_CHECK(v.is_number(), where, ": \"", block, ".rope_theta\" is ", v.dump(), ", not a number");
        thetas.push_back({block + ".rope_theta", v.get<double>()});
      } else if (key == "partial_rotary_factor") {
        QKV_CHECK(v.is_number(), where, ": \"", block, ".partial_rotary_factor\" is ", v.dump(), ", not a number");
        if (v.get<double>() != 1.0) refuse(key, v, "qkv's RoPE rotates the whole head");
      } else if (v.is_object() || v.is_null()) {
        refuse(key, v, "RoPE settings per layer type (qkv's layers share one RoPE)");
      } else {
        refuse(key, v, "a RoPE scaling setting (qkv's RoPE has no scaling)");
      }
    }
  }
  for (const Stated& t : thetas) {
    QKV_CHECK(std::isfinite(t.value) && t.value > 0, where, ": \"", t.key, "\" = ", json(t.value).dump(),
              " is not a positive RoPE base");
    if (t.value != thetas.front().value)
      fail(where, ": \"", thetas.front().key, "\" = ", json(thetas.front().value).dump(), " and \"", t.key,
           "\" = ", json(t.value).dump(),
           " disagree, and transformers versions differ in which one they read (4: the top-level rope_theta; 5: "
           "rope_scaling's, else rope_parameters', before it), so the file describes two models; keep one");
  }
  return thetas.empty() ? 10000.0 : thetas.front().value;
}

// transformers 5 configs may list each layer's attention ("layer_types"). LlamaForCausalLM and
// MistralForCausalLM give every layer the same one: full attention, or for a Mistral with a
// sliding window, sliding attention. A list saying anything else describes another model
// (Ministral-style alternating layers, say), so it is refused.
void check_layer_types(const json& j, const std::string& where, int64_t n_layer, bool sliding) {
  if (!j.contains("layer_types") || j["layer_types"].is_null()) return;
  const json& types = j["layer_types"];
  QKV_CHECK(types.is_array(), where, ": \"layer_types\" is ", types.dump(), ", not a list");
  const std::string want = sliding ? "sliding_attention" : "full_attention";
  for (const json& t : types)
    // "attention" is transformers 5's legacy spelling of full_attention.
    QKV_CHECK(t == want || (!sliding && t == "attention"), where, ": \"layer_types\" = ", types.dump(),
              " cannot be imported: qkv gives every layer the same attention, ", want, " here");
  QKV_CHECK(static_cast<int64_t>(types.size()) == n_layer, where, ": \"layer_types\" has ", types.size(),
            " entries but num_hidden_layers is ", n_layer);
}

// The weight files of DIR, in order; refuses pickles by name.
std::vector<std::string> weight_files(const std::string& dir, json* weight_map) {
  std::error_code ec;
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(single, ec)) return {single};
  if (fs::exists(index, ec)) {
    const json j = hf::read_json(index);
    QKV_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object() && !j["weight_map"].empty(),
              index, ": has no \"weight_map\" object");
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      QKV_CHECK(it.value().is_string(), index, ": weight_map entry ", json(it.key()).dump(), " is not a file name");
      const std::string f = it.value();
      // A plain file name in DIR: an index is data, and must not send the reader elsewhere.
      QKV_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos && f != "." &&
                    f != ".." && f.ends_with(".safetensors"),
                index, ": weight_map file ", json(f).dump(), " is not a .safetensors file name inside the directory");
      names.insert(f);
    }
    if (weight_map) *weight_map = j["weight_map"];
    std::vector<std::string> out;
    for (const auto& n : names) {
      QKV_CHECK(fs::exists(dir + "/" + n, ec), index, ": lists ", n, ", which is not in ", dir);
      out.push_back(dir + "/" + n);
    }
    return out;
  }
  for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
    QKV_CHECK(!fs::exists(dir + "/" + pickle, ec), dir, ": holds ", pickle,
              " (PyTorch pickle) but no model.safetensors; qkv does not read pickles, since loading one can run "
              "arbitrary code. Convert it in Python: model.save_pretrained(dir, safe_serialization=True)");
  fail(dir, ": has no model.safetensors (nor model.safetensors.index.json)");
}

}  // namespace

bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path + "/config.json", ec);
}

HfModelInfo read_hf_config(const std::string& dir, TokenizerKind tokenizer_kind, int64_t tokenizer_vocab) {
  std::error_code ec;
  QKV_CHECK(fs::is_directory(dir, ec), dir, ": not a directory");
  const std::string where = dir + "/config.json";
  QKV_CHECK(fs::exists(where, ec), dir, ": has no config.json");
  const json j = hf::read_json(where);
  QKV_CHECK(j.is_object(), where, ": is not a JSON object");
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0];
  const std::string type = get_string(j, "model_type", where, "");
  HfModelInfo info;
  info.dir = dir;
  info.architecture = arch.empty() ? type : arch;
  Config cfg;
  ModelSettings& m = cfg.model;
  const auto refuse = [&](const std::string& key, const json& value, const char* why) {
    fail(where, ": \"", key, "\" = ", value.dump(), " cannot be imported: ", why);
  };
  // The one-to-one settings of hf::kHfFields; the rest below, by architecture.
  const auto read_fields = [&](bool gpt2) {
    for (const hf::HfField& f : hf::kHfFields) {
      const char* name = gpt2 ? f.gpt2 : f.llama;
      if (!name) continue;
      const std::optional<double> absent = gpt2 ? f.gpt2_absent : f.llama_absent;
      std::visit(
          [&](auto setting) {
            using T = std::remove_reference_t<decltype(m.*setting)>;
            if constexpr (std::is_same_v<T, int64_t>)
              m.*setting = get_int(j, name, where,
                                   absent ? std::optional<int64_t>(static_cast<int64_t>(*absent)) : std::nullopt);
            else {
              QKV_CHECK(absent || (j.contains(name) && !j[name].is_null()), where, ": lacks \"", name, "\"");
              m.*setting = get_real(j, name, where, absent.value_or(0.0));
            }
          },
          f.setting);
    }
  };
  if (arch == "GPT2LMHeadModel" || (arch.empty() && type == "gpt2")) {
    m.family = nn::Family::gpt2;
    read_fields(true);
    const std::string act = get_string(j, "activation_function", where, "gelu_new");
    if (act == "gelu_new" || act == "gelu_pytorch_tanh") m.activation = nn::Activation::gelu_tanh;
    else if (act == "gelu") m.activation = nn::Activation::gelu;
    else if (act == "relu") m.activation = nn::Activation::relu;
    else refuse("activation_function", act, "qkv has gelu_new (tanh), gelu and relu");
    if (get_real(j, "embd_pdrop", where, m.dropout) != m.dropout)
      refuse("embd_pdrop", j["embd_pdrop"], "qkv has one dropout for embeddings and residuals (resid_pdrop)");
    if (!get_bool(j, "scale_attn_weights", where, true))
      refuse("scale_attn_weights", false, "qkv always scales by 1/sqrt(head size)");
    if (get_bool(j, "scale_attn_by_inverse_layer_idx", where, false))
      refuse("scale_attn_by_inverse_layer_idx", true, "qkv has no per-layer attention scale");
    if (get_bool(j, "add_cross_attention", where, false)) refuse("add_cross_attention", true, "qkv is decoder-only");
    m.tie_embeddings = get_bool(j, "tie_word_embeddings", where, true);
    m.position = nn::Position::learned;
    m.norm = nn::NormKind::layernorm;
    m.bias = true;
  } else if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" ||
             (arch.empty() && (type == "llama" || type == "mistral"))) {
    m.family = nn::Family::llama;
    read_fields(false);
    const std::string act = get_string(j, "hidden_act", where, "silu");
    if (act != "silu") refuse("hidden_act", act, "qkv's llama MLP is SwiGLU (silu)");
    m.rope_theta = read_rope_theta(j, where);
    if (get_bool(j, "attention_bias", where, false)) refuse("attention_bias", true, "qkv's llama has no biases");
    if (get_bool(j, "mlp_bias", where, false)) refuse("mlp_bias", true, "qkv's llama has no biases");
    // Mistral's sliding window is qkv's model.window (the same mask: check_exportable). LlamaConfig
    // has no such field: a llama model would ignore it, and a config carrying one is ambiguous.
    const bool mistral = arch == "MistralForCausalLM" || (arch.empty() && type == "mistral");
    if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
      if (!mistral) refuse("sliding_window", j["sliding_window"], "LlamaForCausalLM has no sliding window");
      m.window = get_int(j, "sliding_window", where);
      if (m.window <= 0) refuse("sliding_window", j["sliding_window"], "a sliding window must be > 0 (or null)");
    }
    if (j.contains("head_dim") && !j["head_dim"].is_null() && m.n_head > 0 &&
        get_int(j, "head_dim", where) * m.n_head != m.n_embd)
      refuse("head_dim", j["head_dim"], "qkv's head size is hidden_size / num_attention_heads");
    check_layer_types(j, where, m.n_layer, m.window > 0);
    m.tie_embeddings = get_bool(j, "tie_word_embeddings", where, false);
    m.position = nn::Position::rope;
    m.norm = nn::NormKind::rmsnorm;
    m.activation = nn::Activation::swiglu;
    m.bias = false;
  } else {
    fail(where, ": architecture ", json(info.architecture).dump(),
         " is not supported (qkv imports GPT2LMHeadModel, LlamaForCausalLM and MistralForCausalLM without sliding "
         "window)");
  }
  cfg.data.tokenizer = tokenizer_kind;
  // A qkv BPE is already trained: its size is the tokenizer's (the config's rule is
  // model.vocab_size >= data.bpe_vocab_size).
  if (tokenizer_kind == TokenizerKind::bpe)
    cfg.data.bpe_vocab_size = tokenizer_vocab > 0 ? tokenizer_vocab : m.vocab_size;
  validate(cfg, where);
  info.config = cfg.resolved();
  info.weight_files = weight_files(dir, nullptr);
  return info;
}

bool has_hf_tokenizer(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir + "/tokenizer.json", ec) ||
         (fs::exists(dir + "/vocab.json", ec) && fs::exists(dir + "/merges.txt", ec)) ||
         fs::exists(dir + "/qkv_tokenizer.json", ec);
}

std::unique_ptr<Tokenizer> read_hf_tokenizer(const std::string& dir, const std::string& fallback) {
  std::error_code ec;
  const std::string tj = dir + "/tokenizer.json", vj = dir + "/vocab.json", mt = dir + "/merges.txt",
                    qj = dir + "/qkv_tokenizer.json";
  const auto with_path = [](const std::string& path, const auto& f) {
    try {
      return f();
    } catch (const Error& e) { fail(path, ": ", e.what()); }
  };
  if (fallback == "byte") return std::make_unique<ByteTokenizer>();
  QKV_CHECK(fallback.empty(), "--tokenizer ", fallback,
            " is not supported (byte, or none to read DIR's tokenizer files)");
  // Files are read before with_path, whose prefix would name them twice in a read error.
  // tokenizer_config.json's add_bos_token / add_eos_token make transformers (4.x and 5.x) put
  // those tokens around every encoding, which qkv's encode does not.
  const std::string tc = dir + "/tokenizer_config.json";
  if ((fs::exists(tj, ec) || fs::exists(vj, ec)) && fs::exists(tc, ec)) {
    const json c = hf::read_json(tc);
    for (const char* key : {"add_bos_token", "add_eos_token"})
      QKV_CHECK(!c.is_object() || !get_bool(c, key, tc, false), tc, ": \"", key,
                "\" = true cannot be imported: transformers adds that token to every encoding, qkv's encode does not");
  }
  std::unique_ptr<Gpt2BpeTokenizer> gpt2;
  if (fs::exists(tj, ec))
    gpt2 = with_path(tj, [text = hf::read_text(tj)] { return Gpt2BpeTokenizer::from_tokenizer_json(text); });
  else if (fs::exists(vj, ec) && fs::exists(mt, ec))
    gpt2 = with_path(
        vj, [v = hf::read_text(vj), m = hf::read_text(mt)] { return Gpt2BpeTokenizer::from_vocab_merges(v, m); });
  if (gpt2) {
    // The 256 byte tokens at their bytes' ids with no merge and no added token encode every text
    // to its bytes: qkv's byte tokenizer, as export writes it.
    const Gpt2BpeTokenizer bytes = hf::byte_tokenizer_as_gpt2();
    if (gpt2->merges().empty() && gpt2->added().empty() && gpt2->vocab() == bytes.vocab())
      return std::make_unique<ByteTokenizer>();
    return gpt2;
  }
  if (fs::exists(qj, ec)) {
    const json j = hf::read_json(qj);
    QKV_CHECK(j.is_object() && get_string(j, "format", qj, "") == "qkv-tokenizer-mapping" && j.contains("qkv"), qj,
              ": not a qkv-tokenizer-mapping file");
    return with_path(qj, [&j] { return tokenizer_from_json(j["qkv"].dump()); });
  }
  fail(dir,
       ": has no tokenizer files (tokenizer.json, vocab.json + merges.txt, or qkv_tokenizer.json); "
       "pass --tokenizer byte if the model's ids are the 256 bytes");
}

void load_hf_weights(const std::string& dir, nn::DecoderModel& model) {
  const std::string family = nn::family_name(model.config().family);
  json weight_map;
  const std::vector<std::string> files = weight_files(dir, &weight_map);
  std::vector<std::unique_ptr<st::Reader>> readers;
  std::map<std::string, std::pair<st::Reader*, const st::TensorInfo*>> found;
  for (const std::string& f : files) {
    readers.push_back(std::make_unique<st::Reader>(f));
    for (const st::TensorInfo& t : readers.back()->header().tensors) {
      const auto [it, fresh] = found.emplace(t.name, std::make_pair(readers.back().get(), &t));
      QKV_CHECK(fresh, dir, ": tensor ", json(t.name).dump(), " is in two shards (", it->second.first->path(), " and ",
                f, ")");
    }
  }
  if (!weight_map.is_null())
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      const auto f = found.find(it.key());
      QKV_CHECK(f != found.end() && fs::path(f->second.first->path()).filename() == it.value().get<std::string>(), dir,
                "/model.safetensors.index.json: tensor ", json(it.key()).dump(), " is not in ",
                it.value().get<std::string>());
    }
  // Files saved from the base model (GPT2Model, LlamaModel) lack the head model's prefix.
  const std::string root = family == "gpt2" ? "transformer." : "model.";
  const std::string probe = family == "gpt2" ? "wte.weight" : "embed_tokens.weight";
  const bool unprefixed = !found.count(root + probe) && found.count(probe);
  const auto file_name = [&](const std::string& name) {
    return unprefixed && name.rfind(root, 0) == 0 ? name.substr(root.size()) : name;
  };
  std::set<std::string> used;
  const std::vector<nn::NamedParameter> params = model.named_parameters();
  std::vector<Tensor> values;  // all read and checked before the model is touched
  for (const nn::NamedParameter& p : params) {
    const std::string name = file_name(p.name);
    const auto it = found.find(name);
    QKV_CHECK(it != found.end(), dir, ": tensor ", json(name).dump(), " is missing (the ", family,
              " model described by ", "config.json needs it)");
    used.insert(name);
    st::Reader& r = *it->second.first;
    const st::TensorInfo& t = *it->second.second;
    const bool conv1d = is_conv1d_weight(model.config().family, p.name);
    Shape want = p.tensor.shape();
    if (conv1d) want = Shape{want.at(1), want.at(0)};
    const std::vector<int64_t> want_v(want.begin(), want.end());
    QKV_CHECK(t.shape == want_v, r.path(), ": tensor ", json(name).dump(), " has shape ", json(t.shape).dump(),
              " but config.json's model needs ", json(want_v).dump());
    const std::vector<float> v = r.read_f32(t);
    for (size_t i = 0; i < v.size(); ++i)
      QKV_CHECK(std::isfinite(v[i]), r.path(), ": tensor ", json(name).dump(), " element ", i, " is ", v[i]);
    Tensor value = Tensor::empty(p.tensor.shape(), DType::f32, Device::cpu);
    float* dst = value.data<float>();
    if (conv1d) {  // stored [in, out] -> ours [out, in]
      const int64_t in = want[0], out = want[1];
      for (int64_t a = 0; a < in; ++a)
        for (int64_t b = 0; b < out; ++b) dst[b * in + a] = v[static_cast<size_t>(a * out + b)];
    } else {
      std::memcpy(dst, v.data(), v.size() * sizeof(float));
    }
    values.push_back(std::move(value));
  }
  for (const auto& [name, where] : found) {
    if (used.count(name)) continue;
    // Non-parameter buffers some versions of transformers saved (the causal mask, the masked
    // fill value, RoPE's frequencies), which HF recomputes from config.json.
    const bool buffer = (family == "gpt2" && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))) ||
                        name.ends_with("rotary_emb.inv_freq");
    if (buffer) continue;
    QKV_CHECK(name == "lm_head.weight" && model.config().tie_embeddings, where.first->path(), ": tensor ",
              json(name).dump(), " is not a parameter of the ", family, " model config.json describes");
    // A tied model's head is its embedding: a saved copy is accepted only when it is that tensor
    // bit for bit; any other head is a different model than tie_word_embeddings = true says.
    const std::string emb = root + probe;
    size_t e = 0;
    while (e < params.size() && params[e].name != emb) ++e;
    QKV_CHECK(e < params.size(), dir, ": no embedding ", emb, " to compare lm_head.weight with");
    const st::TensorInfo& t = *where.second;
    const std::vector<int64_t> emb_shape(params[e].tensor.shape().begin(), params[e].tensor.shape().end());
    QKV_CHECK(t.shape == emb_shape, where.first->path(), ": tensor \"lm_head.weight\" has shape ", json(t.shape).dump(),
              " but the tied embedding ", json(file_name(emb)).dump(), " has ", json(emb_shape).dump(),
              " (config.json says tie_word_embeddings = true)");
    const std::vector<float> head = where.first->read_f32(t);
    const float* embv = values[e].data<float>();
    for (size_t i = 0; i < head.size(); ++i)
      QKV_CHECK(std::memcmp(&head[i], &embv[i], sizeof(float)) == 0, where.first->path(),
                ": tensor \"lm_head.weight\" differs from the tied embedding ", json(file_name(emb)).dump(),
                " at element ", i, " (", head[i], " vs ", embv[i],
                "): config.json says tie_word_embeddings = true, so the head would be dropped and the model "
                "changed; set tie_word_embeddings to false if the head is its own");
  }
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor dst = params[i].tensor;
    copy_(dst, dst.device() == Device::cpu ? values[i] : values[i].to(dst.device()));
  }
}

HfModel read_hf_model(const std::string& dir, const std::string& tokenizer, bool tokenizer_optional) {
  std::error_code ec;
  QKV_CHECK(fs::is_directory(dir, ec), dir, ": not a directory (qkv import reads a Hugging Face model directory)");
  HfModel r;
  if (tokenizer_optional && tokenizer.empty() && !has_hf_tokenizer(dir)) {
    HfModelInfo info = read_hf_config(dir);
    r.architecture = info.architecture;
    r.config = std::move(info.config);
    r.model = build_model(r.config, r.config.model.vocab_size);
    load_hf_weights(dir, *r.model);
    return r;
  }
  r.tokenizer = read_hf_tokenizer(dir, tokenizer);
  const Tokenizer& tok = *r.tokenizer;
  HfModelInfo info = read_hf_config(dir, choose(kTokenizerKinds, tok.kind(), "the tokenizer's kind"), tok.vocab_size());
  const int64_t vocab = info.config.model.vocab_size;
  QKV_CHECK(tok.vocab_size() <= vocab, dir, ": the tokenizer has ", tok.vocab_size(),
            " tokens but config.json's vocab_size is ", vocab);
  // A tokenizer named on the command line is a claim about what the ids mean, and it must decode
  // every row: a byte tokenizer on a 50257-row model would leave ids 256.. without text. Rows past
  // the tokens of DIR's own tokenizer files are padding (qkv's model.vocab_size may exceed the
  // tokenizer's): encode never produces them and sample never draws them (train/sampler.h).
  QKV_CHECK(tokenizer.empty() || tok.vocab_size() == vocab, dir, ": --tokenizer ", tokenizer, " decodes ",
            tok.vocab_size(), " ids but config.json's vocab_size is ", vocab, "; ids ", tok.vocab_size(), "..",
            vocab - 1, " would have no text. Give the directory its tokenizer files instead");
  r.architecture = info.architecture;
  r.config = std::move(info.config);
  r.model = build_model(r.config, tok.vocab_size());
  load_hf_weights(dir, *r.model);
  return r;
}

HfImportResult import_hf(const std::string& dir, const std::string& out, const HfImportOptions& opts) {
  const HfModel m = read_hf_model(dir, opts.tokenizer);
  TrainState state;
  state.seed = static_cast<uint64_t>(m.config.train.seed);
  save_checkpoint(out, m.config, *m.model, nullptr, state, *m.tokenizer);
  HfImportResult r;
  r.checkpoint = out;
  r.architecture = m.architecture;
  r.tokenizer = m.tokenizer->kind();
  r.vocab_size = m.config.model.vocab_size;
  r.tensors = static_cast<int64_t>(m.model->named_parameters().size());
  r.parameters = m.model->parameter_count();
  return r;
}

}  // namespace qkv::train
