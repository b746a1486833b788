// Hugging Face export: a qkv checkpoint to a directory transformers loads (rules: train/hf_interop.h).
#include "train/hf_interop.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <variant>

#include "data/byte_level_bpe.h"
#include "data/safetensors.h"
#include "tensor/error.h"
#include "train/atomic_file.h"
#include "train/checkpoint.h"
#include "train/hf_common.h"
#include "train/model_factory.h"

namespace qkv::train {

namespace fs = std::filesystem;
namespace st = qkv::safetensors;
using hf::dump;
using hf::json;

namespace {

// What the export writes: the HF class and, for MistralForCausalLM, its sliding window.
struct ExportTarget {
  std::string arch;
  int64_t sliding_window = 0;  // > 0: MistralForCausalLM's sliding_window
};

// Refuses, naming the [model] key, what the family's HF class cannot express exactly; `mc` is the
// model the checkpoint holds (its resolved attention pattern).
ExportTarget check_exportable(const Config& cfg, const nn::ModelConfig& mc, const std::string& ckpt) {
  const ModelSettings& m = cfg.model;
  const bool gpt2 = m.family == nn::Family::gpt2;
  const auto refuse = [&](const std::string& key, std::string_view value, const char* cls, const char* why) {
    fail(ckpt, ": model.", key, " = ", value, " cannot be exported: ", cls, " ", why);
  };
  const char* family_cls = gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM (and MistralForCausalLM)";
  if (m.attention_pattern.linear())
    refuse("attention_pattern", "linear", family_cls, "has softmax attention only (linear attention is another model)");
  const attn::Pattern sparse = m.attention_pattern.sparse;
  if (sparse != attn::Pattern::full && sparse != attn::Pattern::window)
    refuse("attention_pattern", attn::pattern_name(sparse), family_cls,
           "attends to every earlier position; a sparse pattern would be dropped and the model would change");
  // A causal sliding window: key j visible from position p iff p - w < j <= p, both for qkv's
  // model.window (attention/attention.h) and for the "window" pattern of width l (its local width,
  // default the pattern block size); the two ANDed are the narrower window. Mistral's mask is the
  // same rule (transformers' masking_utils: kv_idx > q_idx - sliding_window, kv_idx <= q_idx).
  int64_t window = mc.window;
  if (sparse == attn::Pattern::window) {
    const int64_t l = mc.pattern.local > 0 ? mc.pattern.local : mc.pattern.block_size;
    window = window > 0 ? std::min(window, l) : l;
  }
  if (gpt2) {
    const char* cls = "GPT2LMHeadModel";
    if (window > 0)
      refuse(m.window > 0 ? "window" : "attention_pattern",
             m.window > 0 ? std::to_string(m.window) : std::string("window"), cls,
             "has no sliding-window attention (a llama-family model exports it as MistralForCausalLM)");
    if (m.resolved_position() != nn::Position::learned)
      refuse("position", name_of(m.resolved_position()), cls, "has learned positions only");
    if (m.resolved_norm() != nn::NormKind::layernorm)
      refuse("norm", name_of(m.resolved_norm()), cls, "has LayerNorm only");
    if (m.resolved_activation() == nn::Activation::swiglu) refuse("activation", "swiglu", cls, "has no gated MLP");
    if (!m.resolved_bias()) refuse("bias", "false", cls, "always has biases");
    if (m.resolved_n_kv_head() != m.n_head)
      refuse("n_kv_head", std::to_string(m.resolved_n_kv_head()), cls,
             "has no grouped-query attention (n_kv_head must equal n_head)");
    return {"GPT2LMHeadModel", 0};
  }
  const char* cls = "LlamaForCausalLM";
  if (m.resolved_position() != nn::Position::rope)
    refuse("position", name_of(m.resolved_position()), cls, "has RoPE positions only");
  if (m.resolved_norm() != nn::NormKind::rmsnorm) refuse("norm", name_of(m.resolved_norm()), cls, "has RMSNorm only");
  if (m.resolved_activation() != nn::Activation::swiglu)
    refuse("activation", name_of(m.resolved_activation()), cls, "has a SwiGLU MLP only");
  if (m.resolved_bias())
    refuse("bias", "true", cls, "has no biases in its MLP (attention_bias alone cannot express them)");
  if (window > 0) return {"MistralForCausalLM", window};
  return {"LlamaForCausalLM", 0};
}

const char* gpt2_activation_name(nn::Activation a) {
  if (a == nn::Activation::gelu_tanh) return "gelu_new";
  if (a == nn::Activation::gelu) return "gelu";
  return "relu";
}

// The <|endoftext|>-style token of a gpt2_bpe tokenizer (its first added token), or -1.
int32_t special_token(const Tokenizer& tok) {
  if (std::string(tok.kind()) != Gpt2BpeTokenizer::kKind) return -1;
  const auto& added = static_cast<const Gpt2BpeTokenizer&>(tok).added();
  return added.empty() ? -1 : added.front();
}

json config_json(const Config& cfg, const ExportTarget& target, int64_t vocab, int32_t special,
                 const std::string& dtype) {
  const ModelSettings& m = cfg.model;
  const std::string& arch = target.arch;
  const json eos = special >= 0 ? json(special) : json(nullptr);
  json j;
  j["architectures"] = {arch};
  j["tie_word_embeddings"] = m.resolved_tie_embeddings();
  j["initializer_range"] = m.init_std;
  j["torch_dtype"] = dtype == "bf16" ? "bfloat16" : "float32";
  j["bos_token_id"] = eos;
  j["eos_token_id"] = eos;
  j["use_cache"] = true;
  const bool gpt2 = arch == "GPT2LMHeadModel";
  const ModelSettings resolved = cfg.resolved().model;
  for (const hf::HfField& f : hf::kHfFields)
    if (const char* name = gpt2 ? f.gpt2 : f.llama)
      std::visit([&](auto setting) { j[name] = resolved.*setting; }, f.setting);
  j["vocab_size"] = vocab;  // the tokenizer's when model.vocab_size is 0
  if (gpt2) {
    j["model_type"] = "gpt2";
    j["n_ctx"] = m.block_size;
    j["activation_function"] = gpt2_activation_name(m.resolved_activation());
    j["embd_pdrop"] = m.dropout;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
  } else {
    j["model_type"] = target.sliding_window > 0 ? "mistral" : "llama";
    j["hidden_act"] = "silu";
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    if (target.sliding_window > 0) j["sliding_window"] = target.sliding_window;
    else j["pretraining_tp"] = 1;
  }
  return j;
}

// GPT-2's tokenizer files for `g`: vocab.json, merges.txt, and a tokenizer_config.json naming
// GPT2Tokenizer (no prefix space, no BOS added) and its special token, the first added one. A
// tokenizer without one says so with nulls: absent keys make transformers' GPT2Tokenizer add
// "<|endoftext|>" as a new token, which would turn that text into an id the model never saw.
void write_gpt2_tokenizer_files(const Gpt2BpeTokenizer& g, int64_t block_size,
                                std::map<std::string, std::string>& files) {
  files["vocab.json"] = g.vocab_json() + "\n";
  files["merges.txt"] = g.merges_txt();
  // tokenizer.json too: transformers 5 loads a Mistral's tokenizer (TokenizersBackend) from that
  // file alone. Merges as "a b" strings, which the tokenizers of transformers 4 and 5 both read.
  json added_tokens = json::array();
  for (int32_t id : g.added())
    added_tokens.push_back({{"id", id},
                            {"content", g.vocab()[static_cast<size_t>(id)]},
                            {"single_word", false},
                            {"lstrip", false},
                            {"rstrip", false},
                            {"normalized", false},
                            {"special", true}});
  json merges = json::array();
  for (const auto& [a, b] : g.merges()) merges.push_back(a + " " + b);
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", added_tokens},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", byte_level},
                          {"decoder", byte_level},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", ""},
                            {"end_of_word_suffix", ""},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"vocab", json::parse(g.vocab_json())},
                            {"merges", merges}}}};
  files["tokenizer.json"] = tokenizer.dump(1, ' ', false, json::error_handler_t::strict) + "\n";
  json cfg = {{"tokenizer_class", "GPT2Tokenizer"},
              {"add_prefix_space", false},
              {"add_bos_token", false},
              {"model_max_length", block_size},
              {"clean_up_tokenization_spaces", false},
              {"errors", "replace"}};
  json decoder = json::object();
  for (int32_t id : g.added())
    decoder[std::to_string(id)] = {{"content", g.vocab()[static_cast<size_t>(id)]},
                                   {"special", true},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false},
                                   {"normalized", false}};
  cfg["added_tokens_decoder"] = decoder;
  json special = json::object();
  const json token = g.added().empty() ? json(nullptr) : json(g.vocab()[static_cast<size_t>(g.added().front())]);
  for (const char* k : {"bos_token", "eos_token", "unk_token"}) {
    cfg[k] = token;
    if (!token.is_null()) special[k] = token;
  }
  cfg["pad_token"] = nullptr;
  files["tokenizer_config.json"] = dump(cfg);
  files["special_tokens_map.json"] = dump(special);
}

// Files describing the tokenizer; returns "hf" when they are an HF tokenizer, "mapping" otherwise.
std::string tokenizer_files(const Tokenizer& tok, int64_t block_size, std::map<std::string, std::string>& files) {
  if (std::string(tok.kind()) == Gpt2BpeTokenizer::kKind) {
    write_gpt2_tokenizer_files(static_cast<const Gpt2BpeTokenizer&>(tok), block_size, files);
    return "hf";
  }
  if (std::string(tok.kind()) == tokenizer_kind_name(TokenizerKind::byte)) {
    write_gpt2_tokenizer_files(hf::byte_tokenizer_as_gpt2(), block_size, files);
    return "hf";
  }
  json ids = json::array();
  static const char* hex = "0123456789abcdef";
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    std::string bytes, h;
    tok.append_token(i, bytes);
    for (unsigned char c : bytes) h += hex[c >> 4], h += hex[c & 15];
    ids.push_back(h);
  }
  json m = {{"format", "qkv-tokenizer-mapping"},
            {"version", 1},
            {"note",
             "Not a Hugging Face tokenizer: token id i stands for the bytes id_to_bytes_hex[i]; "
             "encoding follows qkv's rule for this kind (see qkv's data/tokenizer.h). "
             "`qkv import` restores the tokenizer from the \"qkv\" entry."},
            {"kind", tok.kind()},
            {"id_to_bytes_hex", ids},
            {"qkv", json::parse(tok.serialize())}};
  files["qkv_tokenizer.json"] = m.dump(1, ' ', false, json::error_handler_t::strict) + "\n";
  // Without a tokenizer_config.json, transformers 5's AutoTokenizer builds an empty GPT2Tokenizer
  // from config.json's model_type and turns every text into the unknown token, silently. A class
  // no version of transformers has makes AutoTokenizer (4.x and 5.x) raise instead.
  files["tokenizer_config.json"] =
      dump({{"tokenizer_class", "QkvTokenizerMappingNotForTransformers"},
            {"note", "This model's tokenizer is not a Hugging Face tokenizer; see qkv_tokenizer.json."}});
  return "mapping";
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes `files` into a fresh temporary directory beside `dir`, then renames it to `dir`.
void write_directory_atomic(const std::string& dir, const std::map<std::string, std::string>& files) {
  std::error_code ec;
  QKV_CHECK(!fs::exists(dir, ec), dir, ": already exists (export never overwrites; remove it or choose another --out)");
  fs::path target = fs::absolute(dir);
  if (!target.has_filename()) target = target.parent_path();
  QKV_CHECK(fs::is_directory(target.parent_path(), ec), dir, ": its parent directory ", target.parent_path().string(),
            " does not exist");
  std::random_device rd;
  const std::string tmp = target.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd() % 1000000);
  QKV_CHECK(fs::create_directory(tmp, ec) && !ec, tmp, ": cannot create (", ec.message(), ")");
  try {
    for (const auto& [name, bytes] : files) write_file_atomic(tmp + "/" + name, bytes);
    fsync_dir(tmp);
    fs::rename(tmp, target, ec);
    QKV_CHECK(!ec, dir, ": cannot move the finished directory into place (", ec.message(), ")");
    fsync_dir(target.parent_path().string());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

HfExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const HfExportOptions& opts) {
  QKV_CHECK(opts.dtype == "f32" || opts.dtype == "bf16", "--dtype ", opts.dtype, " is not f32 or bf16");
  CheckpointMeta meta = read_checkpoint_meta(checkpoint);
  const Config cfg = meta.config.resolved();
  auto model = build_model(cfg, meta.tokenizer->vocab_size());
  const ExportTarget target = check_exportable(cfg, model->config(), checkpoint);
  load_model_weights(checkpoint, *model);
  const int64_t vocab = model->config().vocab_size;

  HfExportResult r;
  r.dir = out_dir;
  r.architecture = target.arch;
  r.dtype = opts.dtype;
  const st::DType dt = opts.dtype == "bf16" ? st::DType::BF16 : st::DType::F32;
  std::vector<st::WriteTensor> tensors;
  for (const nn::NamedParameter& p : model->named_parameters()) {
    const bool conv1d = is_conv1d_weight(cfg.model.family, p.name);
    Tensor t = p.tensor.to(Device::cpu);
    t = conv1d ? t.transpose(0, 1).contiguous() : t.contiguous();
    st::WriteTensor w;
    w.name = p.name;
    w.dtype = dt;
    w.shape = std::vector<int64_t>(t.shape().begin(), t.shape().end());
    w.data = st::encode_f32(t.data<float>(), t.numel(), dt);
    r.parameters += t.numel();
    tensors.push_back(std::move(w));
  }
  r.tensors = static_cast<int64_t>(tensors.size());

  std::map<std::string, std::string> files;
  files["model.safetensors"] =
      st::serialize(tensors, {{"format", "pt"}, {"qkv_source", fs::path(checkpoint).filename().string()}});
  r.bytes = static_cast<int64_t>(files["model.safetensors"].size());
  tensors.clear();
  const int32_t special = special_token(*meta.tokenizer);
  files["config.json"] = dump(config_json(cfg, target, vocab, special, opts.dtype));
  const json eos = special >= 0 ? json(special) : json(nullptr);
  files["generation_config.json"] = dump({{"bos_token_id", eos}, {"eos_token_id", eos}});
  r.tokenizer = tokenizer_files(*meta.tokenizer, cfg.model.block_size, files);
  for (const auto& [name, _] : files) r.files.push_back(name);
  write_directory_atomic(out_dir, files);
  return r;
}

}  // namespace qkv::train
