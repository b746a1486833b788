// libFuzzer target for the run configuration's parser (train/config.h). The input is TOML text,
// then, after each 0x00 byte, one `--set` assignment. It must either give a Config or be refused
// with qkv::Error; an accepted config must round-trip: parse_config_text(to_toml(cfg)) ==
// cfg.resolved() (config.h's promise). Each assignment is also applied alone to the defaults,
// where it must take or throw qkv::Error. Anything else (a crash, a hang, a sanitizer report,
// another exception, a broken round trip) is a finding. Built and run by tests/fuzz/run_fuzz.sh.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  size_t cut = bytes.find('\0');
  const std::string text = bytes.substr(0, cut);
  std::vector<std::string> overrides;
  while (cut != std::string::npos) {
    const size_t next = bytes.find('\0', cut + 1);
    overrides.push_back(bytes.substr(cut + 1, next == std::string::npos ? std::string::npos : next - cut - 1));
    cut = next;
  }

  try {
    const qkv::Config cfg = qkv::parse_config_text(text, "fuzz.toml", overrides);
    const std::string written = qkv::to_toml(cfg);
    qkv::Config back;
    try {
      back = qkv::parse_config_text(written, "written.toml");
    } catch (const qkv::Error&) {
      std::abort();  // to_toml wrote what its own parser refuses
    }
    if (!(back == cfg.resolved())) std::abort();
  } catch (const qkv::Error&) {}

  for (const std::string& o : overrides) {
    qkv::Config cfg;
    try {
      qkv::apply_override(cfg, o);
    } catch (const qkv::Error&) {}
  }
  return 0;
}
