#include "tensor/shape.h"

#include <limits>

#include "tensor/error.h"

namespace qkv {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t checked_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    QKV_CHECK(d >= 0, "[shape] negative dimension in ", shape_str(s));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      fail("[shape] element count of ", shape_str(s), " overflows int64");
    n *= d;
  }
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i] > 0 ? s[i] : 1;
  }
  return st;
}

int normalize_dim(int dim, int ndim, const char* op) {
  int d = dim < 0 ? dim + ndim : dim;
  QKV_CHECK(d >= 0 && d < ndim, "[", op, "] dim ", dim, " out of range for a ", ndim, "-d tensor");
  return d;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    QKV_CHECK(da == db || da == 1 || db == 1, "[", op, "] shapes ", shape_str(a), " and ", shape_str(b),
              " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace qkv
