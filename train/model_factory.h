// From a resolved Config to the model: nn::ModelConfig (nn/ knows nothing of TOML) and the model.
#pragma once
#include <memory>

#include "nn/transformer.h"
#include "train/config.h"

namespace qkv::train {

// vocab_size: the tokenizer's when cfg.model.vocab_size is 0. Throws naming the key at fault.
nn::ModelConfig model_config(const Config& cfg, int64_t tokenizer_vocab);
std::unique_ptr<nn::DecoderModel> build_model(const Config& cfg, int64_t tokenizer_vocab);

}  // namespace qkv::train
