// libFuzzer target for the tokenizer files qkv reads from a Hugging Face directory
// (train/hf_interop.h read_hf_tokenizer: tokenizer.json, vocab.json + merges.txt, or qkv's own
// qkv_tokenizer.json, whose "qkv" object goes through tokenizer_from_json). The first byte picks
// the file; the rest is its bytes (vocab.json and merges.txt: cut at the first 0x00), written to a
// directory of their own. Reading must give a tokenizer or throw qkv::Error. An accepted tokenizer
// must rebuild itself exactly from serialize() and decode(encode(s)) == s for the input's bytes.
// Anything else (a crash, a hang, a sanitizer report, another exception, a broken round trip) is a
// finding. Built and run by tests/fuzz/run_fuzz.sh.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "tensor/error.h"
#include "train/hf_interop.h"

namespace {

const std::string& directory() {
  static const std::string dir = [] {
    char name[] = "/tmp/qkv_fuzz_tokenizer_XXXXXX";
    if (!mkdtemp(name)) std::abort();
    return std::string(name);
  }();
  return dir;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string& dir = directory();
  const char* files[] = {"tokenizer.json", "vocab.json", "merges.txt", "qkv_tokenizer.json"};
  for (const char* f : files) std::remove((dir + "/" + f).c_str());
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      write(dir + "/tokenizer.json", bytes);
      break;
    case 1: {
      const size_t cut = bytes.find('\0');
      write(dir + "/vocab.json", bytes.substr(0, cut));
      write(dir + "/merges.txt", cut == std::string::npos ? std::string() : bytes.substr(cut + 1));
      break;
    }
    default:
      write(dir + "/qkv_tokenizer.json", bytes);
  }

  std::unique_ptr<qkv::Tokenizer> tok;
  try {
    tok = qkv::train::read_hf_tokenizer(dir, "");
  } catch (const qkv::Error&) { return 0; }
  const std::string saved = tok->serialize();
  std::unique_ptr<qkv::Tokenizer> back;
  try {
    back = qkv::tokenizer_from_json(saved);
  } catch (const qkv::Error&) { std::abort(); }  // serialize() wrote what its reader refuses
  if (back->serialize() != saved) std::abort();
  try {
    if (tok->decode(tok->encode(bytes)) != bytes) std::abort();
  } catch (const qkv::Error&) {
    // Only a char tokenizer refuses text: a character its vocabulary lacks.
    if (std::string(tok->kind()) != "char") std::abort();
  }
  return 0;
}
