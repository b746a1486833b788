// libFuzzer target for the safetensors header parser (data/safetensors.h): the input is a whole
// file. Any input must either parse into a header whose tensors tile the data exactly, or be
// refused with qkv::Error; anything else (a crash, a sanitizer report, another exception, an
// accepted header that breaks the rules) is a finding. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "data/safetensors.h"
#include "tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const qkv::safetensors::Header h = qkv::safetensors::parse_header("fuzz.safetensors", bytes, size);
    // An accepted header: every tensor inside the data, extents matching, total = data size.
    uint64_t total = 0;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || h.buffer_offset + t.end > size) std::abort();
      uint64_t bytes_needed = static_cast<uint64_t>(qkv::safetensors::dtype_size(t.dtype));
      for (int64_t d : t.shape) bytes_needed *= static_cast<uint64_t>(d);
      if (bytes_needed != t.end - t.begin) std::abort();
      total += t.end - t.begin;
    }
    if (total != size - h.buffer_offset) std::abort();
  } catch (const qkv::Error&) {}
  return 0;
}
