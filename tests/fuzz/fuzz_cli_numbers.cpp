// libFuzzer target for the command line's number parser (app/options.h). The first bytes pick a
// range, the rest is the argument's text. Every input must be accepted exactly when an independent
// reading accepts it (decimal digits with an optional sign, in 128-bit arithmetic; strtod for reals,
// whole text, finite, in range), with the same value; a refusal must be qkv::Error naming the
// option. Anything else (a crash, a sanitizer report, a disagreement) is a finding. Built and run
// by tests/fuzz/run_fuzz.sh.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "app/options.h"
#include "tensor/error.h"

namespace {

// The integer `text` spells (sign, then one or more decimal digits), or nullopt; the value is exact.
std::optional<__int128> reference_int(const std::string& text) {
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i == text.size()) return std::nullopt;
  __int128 v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    v = v * 10 + (text[i] - '0');
    if (v > (static_cast<__int128>(1) << 100)) v = static_cast<__int128>(1) << 100;  // saturates far past int64
  }
  return negative ? -v : v;
}

void refused_by_name(const qkv::Error& e, const char* name) {
  if (std::strncmp(e.what(), name, std::strlen(name)) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t ends[] = {0, 1, -5, 100, 1 << 20, qkv::kIntMax, -qkv::kIntMax - 1};
  const qkv::IntRange ints{std::min(ends[data[0] % 7], ends[data[1] % 7]),
                           std::max(ends[data[0] % 7], ends[data[1] % 7])};
  const qkv::RealRange reals{std::min<double>(ends[data[0] % 7], ends[data[1] % 7]),
                             std::max<double>(ends[data[0] % 7], ends[data[1] % 7]), (data[0] & 0x80) != 0,
                             (data[1] & 0x80) != 0};
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  const std::optional<__int128> want = reference_int(text);
  const bool int_ok = want && *want >= ints.lo && *want <= ints.hi;
  try {
    const int64_t got = qkv::app::parse_int("--n", text, ints);
    if (!int_ok || got != *want) std::abort();
  } catch (const qkv::Error& e) {
    if (int_ok) std::abort();
    refused_by_name(e, "--n");
  }

  char* end = nullptr;
  const double value =
      text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || text.find('\0') != std::string::npos
          ? NAN
          : std::strtod(text.c_str(), &end);
  const bool real_ok = end == text.c_str() + text.size() && reals.contains(value);
  try {
    const double got = qkv::app::parse_real("--x", text, reals);
    if (!real_ok || got != value) std::abort();
  } catch (const qkv::Error& e) {
    if (real_ok) std::abort();
    refused_by_name(e, "--x");
  }
  return 0;
}
