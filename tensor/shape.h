// Shapes and strides (in elements), with overflow-checked element counts.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace qkv {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2,3]"
int64_t checked_numel(const Shape& s);  // throws on negative dims or int64 overflow
Strides contiguous_strides(const Shape& s);
int normalize_dim(int dim, int ndim, const char* op);  // -1 -> ndim-1, checked
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace qkv
