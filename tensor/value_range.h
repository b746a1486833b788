// The range a numeric setting accepts, stated once where the setting is declared (a config key in
// train/config.cpp's table, a command-line option in app/) and checked, described and documented
// from that one statement.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

namespace qkv {

inline constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();

// lo..hi, both included.
struct IntRange {
  int64_t lo = 0, hi = kIntMax;
  constexpr bool contains(int64_t v) const { return v >= lo && v <= hi; }
};

// A finite number from lo to hi; an end marked open is excluded.
struct RealRange {
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const;
};

// "an integer in [0, 100]", "a finite number in (0, 1]".
std::string describe(IntRange r);
std::string describe(const RealRange& r);

}  // namespace qkv
