// From a resolved Config to the model: nn::ModelConfig (nn/ knows nothing of TOML) and the model;
// and the one answer to "is this the same model?".
#pragma once
#include <memory>
#include <optional>

#include "nn/transformer.h"
#include "train/config.h"
#include "train/config_schema.h"
#include "train/memory_budget.h"

namespace qkv::train {

// vocab_size: the tokenizer's when cfg.model.vocab_size is 0. Runs nn::ModelConfig::validate.
// Throws naming the key at fault.
nn::ModelConfig model_config(const Config& cfg, int64_t tokenizer_vocab);
// build_model first checks that the model fits this machine for `use` (train/memory_budget.h:
// the parameters and one sequence's KV cache, or a whole training step), refusing with both
// figures before anything is allocated.
std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab,
                                              ModelUse use = ModelUse::inference);

// The first [model] key, in the config's declaration order, whose value differs between models
// `a` and `b`, with both values as to_toml writes them (key "model.n_embd", a "64", b "32");
// nullopt for the same model. Every field of nn::ModelConfig is compared except `recompute`
// (train.recompute: how backward is computed, not what). model.ffn_multiple_of is compared as the
// ffn_hidden it resolves to, model.vocab_size as the size used.
// The one "same model?" equality: checkpoint saving (the config describes the model being saved)
// and --resume (the checkpoint describes the model being trained) both ask it.
std::optional<ConfigDifference> model_difference(const nn::ModelConfig& a, const nn::ModelConfig& b);

}  // namespace qkv::train
