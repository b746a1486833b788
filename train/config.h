// The run configuration: one TOML file with sections [model], [data], [train], [sample]
// (keys below), refined by `--set section.key=value` overrides, validated, and written back as the
// resolved TOML text stored in every checkpoint.
//
// Strictness is the point: an unknown section or key, or a value of the wrong type, is an error
// naming the file and the key ("configs/x.toml: unknown key model.n_layers (did you mean
// model.n_layer?)", "configs/x.toml: model.n_head must be an integer, got string"), so a typo
// never silently trains the default model.
//
// Every enumerated setting is read into its enum type at load (spellings: one table per enum,
// listed in config_schema.h), so the rest of the program compares enums, never spellings; parsing,
// to_toml and the error messages all go through that one table. 0 / unset optionals mean "the
// family default" (written "" for model.position, norm and activation); the resolved_*()
// accessors give the value actually used, and to_toml() writes the resolved values, so a
// checkpoint's config does not depend on what the defaults were when it was trained.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attention/attention.h"
#include "attention/linear/linear_attention.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "nn/transformer.h"
#include "tensor/dtype.h"
#include "tensor/numerics.h"
#include "tensor/value_range.h"
#include "train/schedule.h"

namespace qkv {

// model.attention_pattern: softmax attention under one of the sparse patterns (attention/pattern/pattern.h),
// or linear attention (whose pattern is full). Spellings: kAttentionPatterns (config_schema.h).
struct AttentionChoice {
  nn::AttentionPattern attention = nn::AttentionPattern::full;
  attn::Pattern sparse = attn::Pattern::full;
  constexpr bool operator==(const AttentionChoice&) const = default;
  constexpr bool linear() const { return attention == nn::AttentionPattern::linear; }
};

// The settings of a run, one member per config key. Each key's name, meaning, accepted range and
// the attention patterns it applies to are declared once, in its row of the key table
// (train/config.cpp, fields_of); `qkv keys` and docs/config.md list them all. A member's type and
// default here are the key's.
struct ModelSettings {
  nn::Family family = nn::Family::gpt2;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 0;
  int64_t n_embd = 128;
  int64_t block_size = 64;
  int64_t vocab_size = 0;
  double dropout = 0.0;
  double attn_dropout = 0.0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t ffn_hidden = 0;
  int64_t ffn_multiple_of = 64;
  std::optional<nn::Position> position;
  std::optional<nn::NormKind> norm;
  std::optional<nn::Activation> activation;
  std::optional<bool> bias;
  std::optional<bool> tie_embeddings;
  int64_t window = 0;
  double init_std = 0.02;
  attn::Kernel attn_kernel = attn::Kernel::fused;
  AttentionChoice attention_pattern;
  attn::LinearFeature linear_feature = attn::LinearFeature::elu1;
  int64_t linear_features = 0;
  int64_t linear_chunk = 64;
  int64_t pattern_stride = 0;
  int64_t pattern_local = 0;
  int64_t pattern_global = 1;
  std::string pattern_global_tokens;
  int64_t pattern_random_blocks = 2;
  int64_t pattern_block_size = 0;
  std::string pattern_layout = "local_global";
  int64_t pattern_seed = 0;

  nn::Position resolved_position() const;      // gpt2: learned, llama: rope
  nn::NormKind resolved_norm() const;          // gpt2: layernorm, llama: rmsnorm
  nn::Activation resolved_activation() const;  // gpt2: gelu_tanh, llama: swiglu
  bool resolved_bias() const;                  // gpt2: true, llama: false
  bool resolved_tie_embeddings() const;        // gpt2: true, llama: false
  int64_t resolved_n_kv_head() const;          // n_kv_head or n_head
  // gpt2: 4C. llama: h = int(2 * 4C / 3), rounded up to a multiple of ffn_multiple_of
  // (as Meta's Llama reference computes it; C = 128 gives 384).
  int64_t resolved_ffn_hidden() const;
  int64_t head_dim() const { return n_embd / n_head; }
  bool operator==(const ModelSettings&) const = default;
};

struct DataSettings {
  std::string path;
  TokenizerKind tokenizer = TokenizerKind::character;
  int64_t bpe_vocab_size = 512;
  DocSeparator separator = DocSeparator::blank_line;
  double val_fraction = 0.1;
  BatchMode batching = BatchMode::random_windows;
  Padding padding_side = Padding::right;
  bool random_tokens = false;
  bool operator==(const DataSettings&) const = default;
};

struct TrainSettings {
  Device device = Device::cpu;
  DType dtype = DType::f32;
  int64_t batch_size = 12;
  int64_t grad_accum = 1;
  int64_t seq_len = 0;
  int64_t resolved_seq_len(int64_t block_size) const { return seq_len > 0 ? seq_len : block_size; }
  int64_t max_steps = 100;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  train::LrScheduleKind lr_schedule = train::LrScheduleKind::cosine;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;
  int64_t seed = 1337;
  std::string out_dir = "runs/default";
  int64_t eval_interval = 100;
  int64_t eval_batches = 20;
  int64_t checkpoint_interval = 0;
  int64_t keep_last = 3;
  int64_t max_bad_steps = 5;
  bool recompute = false;
  int64_t threads = 0;
  int64_t log_interval = 10;
  int64_t zero = 0;
  int64_t dp_bucket_kb = 4096;
  bool dp_overlap = true;
  bool cuda_mma = true;
  std::optional<Numerics> numerics;  // unset: resolved_numerics()
  // invariant on the CPU, where its kernels run at the standard ones' speed (docs/consistency.md);
  // standard on CUDA, whose invariant GEMM is a plain tiled kernel without tensor cores.
  Numerics resolved_numerics() const {
    return numerics.value_or(device == Device::cuda ? Numerics::standard : Numerics::invariant);
  }
  bool operator==(const TrainSettings&) const = default;
};

struct SampleSettings {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t seed = 1337;
  std::string prompt;
  bool operator==(const SampleSettings&) const = default;
};

struct Config {
  ModelSettings model;
  DataSettings data;
  TrainSettings train;
  SampleSettings sample;

  // A copy with every family default filled in (position, norm, activation, bias,
  // tie_embeddings, n_kv_head, ffn_hidden) and train.numerics by the device; vocab_size stays as
  // is (the tokenizer decides it).
  Config resolved() const;
  bool operator==(const Config&) const = default;
};

// Reads and parses `path`, applies each override ("section.key=value") in order, validates.
// Errors (qkv::Error) name the file (or "--set") and the key: one line each.
Config parse_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text; `origin` names it in messages (a file name, "checkpoint run.h5").
Config parse_config_text(const std::string& text, const std::string& origin,
                         const std::vector<std::string>& overrides = {});

// Applies one "section.key=value". The value is read as a TOML value (3e-4, true, "llama");
// text that is not valid TOML is taken as a bare string (model.family=llama), and a string key
// always takes the text verbatim unless it is a quoted TOML string. Whitespace around the key and
// the value is dropped (quote a string to keep it). Errors start with "--set <assignment>: ".
void apply_override(Config& cfg, const std::string& assignment);

// Range and consistency checks (n_embd % n_head, n_head % n_kv_head, probabilities in range,
// the model's rules, ...): the one validator of a config. (Spellings are checked as they are read.)
// Throws "<origin>: <message>".
void validate(const Config& cfg, const std::string& origin);

// The resolved config as TOML text, every key in declaration order. parse_config_text of the
// result gives back cfg.resolved() exactly (doubles are written in shortest round-trip form).
std::string to_toml(const Config& cfg);

// The range a numeric key's table entry declares (a command-line option that sets the same value
// takes it from here); an internal error for any other key.
IntRange int_key_range(std::string_view key);
RealRange real_key_range(std::string_view key);

// Every key as "section.key", in declaration order (for help text and tests).
std::vector<std::string> config_keys();

// One key as the reference states it (from the key table).
struct KeyDoc {
  std::string key, section, type;
  std::string default_value;         // TOML text, or how an unset default resolves ("the family's")
  bool default_is_value = true;      // false: default_value says how it resolves
  std::string accepts, meaning;      // accepts: "" where the type says it all
  std::vector<std::string> used_by;  // attention patterns it applies to (empty: every one)
};
std::vector<KeyDoc> key_docs();

// Every key as Markdown tables, one per section (key, type, default, accepted range, meaning, the
// attention patterns it applies to), from key_docs(): docs/config.md, printed by `qkv keys`.
std::string config_reference();

// "section.key=value" overrides that put model.attention_pattern, model.window and every key of one
// attention pattern only back to their defaults (plain full attention): what a reader that
// compares tensors, not attention, applies to a stored config (train/checkpoint.cpp).
std::vector<std::string> attention_defaults();

}  // namespace qkv
