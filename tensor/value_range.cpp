#include "tensor/value_range.h"

#include <cmath>
#include <sstream>

#include "tensor/error.h"

namespace qkv {
namespace {

std::string number_text(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

}  // namespace

bool RealRange::contains(double v) const {
  return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
}

std::string describe(IntRange r) { return cat("an integer in [", r.lo, ", ", r.hi, "]"); }

std::string describe(const RealRange& r) {
  return cat("a finite number in ", r.lo_open ? "(" : "[", number_text(r.lo), ", ", number_text(r.hi),
             r.hi_open ? ")" : "]");
}

}  // namespace qkv
