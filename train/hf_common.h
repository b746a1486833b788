// What the Hugging Face export (train/hf_export.cpp) and import (train/hf_import.cpp) share: the
// readers of its JSON and text files, the JSON writer, the one table of config.json keys and the
// byte tokenizer as GPT-2 files (rules: train/hf_interop.h).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <variant>

#include "data/byte_level_bpe.h"
#include "train/config.h"

namespace qkv::train::hf {

using nlohmann::json;

// config.json, the sharded index, vocab.json, merges.txt and tokenizer files: regular files of
// at most kJsonFileCap bytes (data/input_file.h).
std::string read_text(const std::string& path);
json read_json(const std::string& path);

// Pretty-printed, one newline at the end; invalid UTF-8 throws.
std::string dump(const json& j);

// The [model] settings a Hugging Face config.json holds one to one: the name each architecture's
// config gives it (nullptr: that config has none) and the value Transformers takes when the key is
// absent or null (nullopt: required). Export writes them and import reads them from this one list.
// A qkv 0 means the family's default (ffn_hidden: 4C for gpt2; n_kv_head: n_head).
struct HfField {
  std::variant<int64_t ModelSettings::*, double ModelSettings::*> setting;
  const char* gpt2;   // GPT2Config
  const char* llama;  // LlamaConfig and MistralConfig
  std::optional<double> gpt2_absent = std::nullopt, llama_absent = std::nullopt;
};
inline const HfField kHfFields[] = {
    {&ModelSettings::vocab_size, "vocab_size", "vocab_size"},
    {&ModelSettings::block_size, "n_positions", "max_position_embeddings"},
    {&ModelSettings::n_embd, "n_embd", "hidden_size"},
    {&ModelSettings::n_layer, "n_layer", "num_hidden_layers"},
    {&ModelSettings::n_head, "n_head", "num_attention_heads"},
    {&ModelSettings::n_kv_head, nullptr, "num_key_value_heads", std::nullopt, 0},
    {&ModelSettings::ffn_hidden, "n_inner", "intermediate_size", 0, std::nullopt},
    {&ModelSettings::norm_eps, "layer_norm_epsilon", "rms_norm_eps", 1e-5, 1e-6},
    {&ModelSettings::rope_theta, nullptr, "rope_theta", std::nullopt, 10000.0},
    {&ModelSettings::dropout, "resid_pdrop", nullptr, 0.1, std::nullopt},
    {&ModelSettings::attn_dropout, "attn_pdrop", "attention_dropout", 0.1, 0.0},
};

// qkv's byte tokenizer as GPT-2 files: the 256 byte tokens, token b at id b, and no merge, so
// GPT-2's byte-level BPE gives every byte its own id, the byte (read_hf_tokenizer reads such files
// back as the byte tokenizer).
Gpt2BpeTokenizer byte_tokenizer_as_gpt2();

}  // namespace qkv::train::hf
