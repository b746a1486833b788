// What `qkv sample` and `qkv eval` share: a checkpoint loaded for inference on a device, with the
// process settings (threads, numerics) it runs under.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"

namespace qkv::app {

struct LoadedModel {
  train::CheckpointMeta meta;
  std::unique_ptr<nn::DecoderModel> model;
};

// The checkpoint's model in eval mode on `device` (cpu | cuda, checked first). Applies the
// checkpoint config's train.threads and the numerics mode: `numerics` when given, else the
// config's train.numerics.
LoadedModel load_for_inference(const std::string& path, const std::string& device, std::optional<Numerics> numerics);

}  // namespace qkv::app
