// What `qkv sample`, `qkv eval` and the Python module's qkv.load share: a checkpoint loaded for
// inference on a device, with the process settings (threads, numerics) it runs under.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "nn/transformer.h"
#include "tensor/numerics.h"
#include "train/checkpoint.h"

namespace qkv::train {

struct LoadedModel {
  CheckpointMeta meta;
  std::unique_ptr<nn::DecoderModel> model;
};

// The checkpoint's model in eval mode on `device`. Applies the checkpoint config's train.threads
// and the numerics mode: `numerics` when given, else the config's train.numerics.
LoadedModel load_for_inference(const std::string& path, Device device, std::optional<Numerics> numerics);

// The same from a Hugging Face model directory (train/hf_interop.h: what is read and refused), in
// memory: the network and weights `qkv import` would write, with meta.path = dir, meta.config the
// imported config and meta.tokenizer DIR's tokenizer, or null when DIR has no tokenizer files
// (the model then runs on ids alone). `tokenizer` "byte" claims the ids are bytes, as `qkv import
// --tokenizer byte` does (and is checked the same way).
LoadedModel load_hf_for_inference(const std::string& dir, Device device, std::optional<Numerics> numerics,
                                  const std::string& tokenizer = "");

}  // namespace qkv::train
