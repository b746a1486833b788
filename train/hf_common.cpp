#include "train/hf_common.h"

#include "data/input_file.h"

namespace qkv::train::hf {

std::string read_text(const std::string& path) { return read_input_file(path, kJsonFileCap, "a Hugging Face file"); }

json read_json(const std::string& path) { return parse_json(read_text(path), path); }

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::strict) + "\n"; }

Gpt2BpeTokenizer byte_tokenizer_as_gpt2() {
  std::vector<std::string> vocab(256);
  for (int b = 0; b < 256; ++b)
    vocab[static_cast<size_t>(b)] = bytelevel::to_alphabet(std::string(1, static_cast<char>(b)));
  return Gpt2BpeTokenizer(std::move(vocab), {}, {});
}

}  // namespace qkv::train::hf
