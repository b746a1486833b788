// Reduction and softmax front ends: normalise dims, check dtypes, shape the result on the input's
// device, call tensor/cpu/reduce.cpp or tensor/cuda/reduce.cu.
#include <algorithm>

#include "tensor/cpu/reduce.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"

namespace qkv {

namespace {

using detail::require_defined;
using detail::require_float;

void check_input(const char* op, const Tensor& a) {
  require_defined(op, a, "input");
  require_float(op, a);
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// Marks the reduced dims (each once; negative dims count from the end).
std::vector<bool> reduce_mask(const char* op, const Tensor& a, const std::vector<int>& dims) {
  std::vector<bool> red(a.dim(), false);
  for (int d : dims) {
    const int nd = normalize_dim(d, a.dim(), op);
    QKV_CHECK(!red[nd], "[", op, "] dim ", d, " listed twice for ", shape_str(a.shape()));
    red[nd] = true;
  }
  return red;
}

Tensor reduce_sum(const char* op, const Tensor& a, const std::vector<bool>& red, bool keepdim, bool mean) {
  Shape kshape = a.shape(), out_shape;
  int64_t count = 1;
  for (int d = 0; d < a.dim(); ++d) {
    if (red[d]) {
      count *= a.size(d);
      kshape[d] = 1;
    } else {
      out_shape.push_back(a.size(d));
    }
  }
  QKV_CHECK(!mean || count > 0, "[", op, "] mean over an empty set of elements of ", shape_str(a.shape()));
  Tensor out = Tensor::empty(kshape, a.dtype(), a.device());
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
  if (on_cuda(a)) cuda::sum_forward(a, red, out, scale);
  else cpu::sum_forward(a, red, out, scale);
  return keepdim ? out : out.view(out_shape);
}

Tensor softmax_impl(const char* op, const Tensor& a, int dim, bool log) {
  check_input(op, a);
  const int d = normalize_dim(dim, a.dim(), op);
  QKV_CHECK(a.size(d) > 0, "[", op, "] dim ", dim, " of ", shape_str(a.shape()), " is empty");
  Tensor y = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::softmax_forward(a, d, y, log);
  else cpu::softmax_forward(a, d, y, log);
  return y;
}

Tensor softmax_backward_impl(const char* op, const Tensor& y, const Tensor& dy, int dim, bool log) {
  check_input(op, y);
  require_defined(op, dy, "dy");
  detail::require_same_device(op, y, dy);
  detail::require_same_dtype(op, y, dy);
  QKV_CHECK(y.shape() == dy.shape(), "[", op, "] y is ", shape_str(y.shape()), " but dy is ", shape_str(dy.shape()));
  const int d = normalize_dim(dim, y.dim(), op);
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
  if (y.size(d) > 0) {
    if (on_cuda(y)) cuda::softmax_backward(y, dy, d, dx, log);
    else cpu::softmax_backward(y, dy, d, dx, log);
  }
  return dx;
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  check_input("sum", a);
  return reduce_sum("sum", a, reduce_mask("sum", a, dims), keepdim, false);
}

Tensor sum(const Tensor& a) {
  check_input("sum", a);
  return reduce_sum("sum", a, std::vector<bool>(a.dim(), true), false, false);
}

Tensor mean(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  check_input("mean", a);
  return reduce_sum("mean", a, reduce_mask("mean", a, dims), keepdim, true);
}

Tensor mean(const Tensor& a) {
  check_input("mean", a);
  return reduce_sum("mean", a, std::vector<bool>(a.dim(), true), false, true);
}

namespace {
std::pair<Tensor, Tensor> max_impl(const char* op, const Tensor& a, int dim, bool keepdim) {
  check_input(op, a);
  const int d = normalize_dim(dim, a.dim(), op);
  QKV_CHECK(a.size(d) > 0, "[", op, "] dim ", dim, " of ", shape_str(a.shape()), " is empty");
  Shape kshape = a.shape();
  kshape[d] = 1;
  Tensor values = Tensor::empty(kshape, a.dtype(), a.device());
  Tensor indices = Tensor::empty(kshape, DType::i64, a.device());
  if (on_cuda(a)) cuda::max_forward(a, d, values, indices);
  else cpu::max_forward(a, d, values, indices);
  if (keepdim) return {values, indices};
  return {values.squeeze(d), indices.squeeze(d)};
}
}  // namespace

Tensor max(const Tensor& a, int dim, bool keepdim) { return max_impl("max", a, dim, keepdim).first; }
Tensor argmax(const Tensor& a, int dim, bool keepdim) { return max_impl("argmax", a, dim, keepdim).second; }

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  require_defined("sum_to", grad, "gradient");
  if (grad.shape() == shape) return grad;
  QKV_CHECK(shape.size() <= grad.shape().size() && broadcast_shapes(shape, grad.shape(), "sum_to") == grad.shape(),
            "[sum_to] ", shape_str(grad.shape()), " is not a broadcast of ", shape_str(shape));
  check_input("sum_to", grad);
  const size_t lead = grad.shape().size() - shape.size();
  std::vector<bool> red(grad.dim(), false);
  for (size_t d = 0; d < grad.shape().size(); ++d) red[d] = d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1);
  Tensor s = reduce_sum("sum_to", grad, red, true, false);
  return s.view(shape);
}

Tensor softmax(const Tensor& a, int dim) { return softmax_impl("softmax", a, dim, false); }
Tensor log_softmax(const Tensor& a, int dim) { return softmax_impl("log_softmax", a, dim, true); }

Tensor softmax_backward(const Tensor& y, const Tensor& dy, int dim) {
  return softmax_backward_impl("softmax_backward", y, dy, dim, false);
}
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int dim) {
  return softmax_backward_impl("log_softmax_backward", y, dy, dim, true);
}

}  // namespace qkv
