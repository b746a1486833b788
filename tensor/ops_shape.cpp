// Shape ops that copy: cat, split (views), index_select and its vjp index_add. They move whole
// slices, so each is a loop of the strided copy / add kernels over slices (each slice a memcpy-like
// run when the layout allows); index_select spreads slices over OpenMP threads. Device tensors go
// through copy_ / add_, which dispatch to the CUDA kernels; indices are read on the host.
#include <omp.h>

#include "tensor/cpu/copy.h"
#include "tensor/cpu/elementwise.h"
#include "tensor/cpu/loops.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"

namespace qkv {

namespace {

using detail::require_defined;

// Reads a 1-d int32/int64 index tensor, checking every entry lies in [0, bound).
std::vector<int64_t> read_index(const char* op, const Tensor& index, int64_t bound, const Shape& of, int dim) {
  require_defined(op, index, "index");
  QKV_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, "[", op, "] index must be int32 or int64, not ",
            dtype_name(index.dtype()));
  QKV_CHECK(index.dim() == 1, "[", op, "] index must be 1-d, not ", shape_str(index.shape()));
  std::vector<int64_t> idx(static_cast<size_t>(index.numel()));
  const Tensor c = index.to(Device::cpu).to(DType::i64).contiguous();
  const int64_t* p = c.data<int64_t>();
  for (size_t i = 0; i < idx.size(); ++i) {
    QKV_CHECK(p[i] >= 0 && p[i] < bound, "[", op, "] index ", p[i], " at position ", i, " is out of range for dim ",
              dim, " of ", shape_str(of));
    idx[i] = p[i];
  }
  return idx;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int dim) {
  QKV_CHECK(!tensors.empty(), "[cat] no tensors given");
  const Tensor& first = tensors[0];
  require_defined("cat", first, "tensor 0");
  const int d = normalize_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    require_defined("cat", t, "an input");
    detail::require_same_device("cat", first, t);
    QKV_CHECK(t.dtype() == first.dtype(), "[cat] tensor 0 is ", dtype_name(first.dtype()), " but tensor ", i, " is ",
              dtype_name(t.dtype()));
    bool ok = t.dim() == first.dim();
    for (int k = 0; ok && k < t.dim(); ++k) ok = k == d || t.size(k) == first.size(k);
    QKV_CHECK(ok, "[cat] along dim ", dim, ": tensor 0 is ", shape_str(first.shape()), " but tensor ", i, " is ",
              shape_str(t.shape()));
    out_shape[d] += t.size(d);
  }
  Tensor out = Tensor::empty(out_shape, first.dtype(), first.device());
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    if (t.size(d) > 0) copy_(out.narrow(d, at, t.size(d)), t);
    at += t.size(d);
  }
  return out;
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int dim) {
  require_defined("split", a, "input");
  const int d = normalize_dim(dim, a.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    QKV_CHECK(s >= 0, "[split] negative size ", s);
    total += s;
  }
  QKV_CHECK(total == a.size(d), "[split] sizes add up to ", total, " but dim ", dim, " of ", shape_str(a.shape()),
            " is ", a.size(d));
  std::vector<Tensor> parts;
  parts.reserve(sizes.size());
  int64_t at = 0;
  for (int64_t s : sizes) {
    parts.push_back(a.narrow(d, at, s));
    at += s;
  }
  return parts;
}

Tensor index_select(const Tensor& a, int dim, const Tensor& index) {
  require_defined("index_select", a, "input");
  const int d = normalize_dim(dim, a.dim(), "index_select");
  const std::vector<int64_t> idx = read_index("index_select", index, a.size(d), a.shape(), dim);
  Shape out_shape = a.shape();
  out_shape[d] = static_cast<int64_t>(idx.size());
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  const int64_t n = static_cast<int64_t>(idx.size());
  if (a.device() != Device::cpu) {
    for (int64_t i = 0; i < n; ++i) copy_(out.select(d, i), a.select(d, idx[static_cast<size_t>(i)]));
    return out;
  }
  // Slices are disjoint in `out`: safe to copy in parallel (copy_cast stays serial inside).
#pragma omp parallel for schedule(static) if (n > 1 && out.numel() >= 2 * cpu::kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) cpu::copy_cast(a.select(d, idx[static_cast<size_t>(i)]), out.select(d, i));
  return out;
}

Tensor index_add(const Shape& shape, int dim, const Tensor& index, const Tensor& src) {
  require_defined("index_add", src, "src");
  QKV_CHECK(src.dtype() == DType::f32 || src.dtype() == DType::f64 || is_integral(src.dtype()),
            "[index_add] no kernel for ", dtype_name(src.dtype()));
  const int d = normalize_dim(dim, static_cast<int>(shape.size()), "index_add");
  const std::vector<int64_t> idx = read_index("index_add", index, shape[d], shape, dim);
  Shape expect = shape;
  expect[d] = static_cast<int64_t>(idx.size());
  QKV_CHECK(src.shape() == expect, "[index_add] src is ", shape_str(src.shape()), " but ", idx.size(),
            " indices into dim ", dim, " of ", shape_str(shape), " need ", shape_str(expect));
  Tensor out = zeros(shape, src.dtype(), src.device());
  // Repeated indices add into the same slice, so slices go one after another.
  for (size_t i = 0; i < idx.size(); ++i) add_(out.select(d, idx[i]), src.select(d, static_cast<int64_t>(i)));
  return out;
}

}  // namespace qkv
