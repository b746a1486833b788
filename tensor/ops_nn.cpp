// Front ends of the fused neural-net ops: embedding, layer/RMS norm, cross-entropy, dropout.
// They check shapes, dtypes and index ranges (so a bad id or target is one readable error, never
// an out-of-bounds read), make inputs contiguous where the kernel needs it, allocate the outputs
// on the inputs' device and call the CPU kernels (tensor/cpu/nn_kernels.h) or the CUDA ones
// (tensor/cuda/nn.cu, norm.cu, cross_entropy.cu). Ids and targets on the device are range-checked from a host copy.
#include "tensor/cpu/nn_kernels.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/ops_checks.h"

namespace qkv {

namespace {

template <class I>
void check_ids(const char* op, const Tensor& ids, int64_t v, const char* what, const char* range_of) {
  const I* p = ids.data<I>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = static_cast<int64_t>(p[i]);
    QKV_CHECK(id >= 0 && id < v, "[", op, "] ", what, " ", id, " at flat position ", i, " is out of range for ", v, " ",
              range_of);
  }
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// ids as a contiguous tensor (on their device) whose values all lie in [0, v).
Tensor checked_ids(const char* op, const Tensor& ids, int64_t v) {
  detail::require_defined(op, ids, "ids");
  QKV_CHECK(is_integral(ids.dtype()), "[", op, "] ids must be int32 or int64, not ", dtype_name(ids.dtype()));
  Tensor c = ids.contiguous();
  const Tensor h = c.to(Device::cpu);
  if (h.dtype() == DType::i32) check_ids<int32_t>(op, h, v, "id", "embeddings");
  else check_ids<int64_t>(op, h, v, "id", "embeddings");
  return c;
}

void check_norm_param(const char* op, const Tensor& p, const Tensor& x, const char* what) {
  if (!p.defined()) return;
  QKV_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), "[", op, "] x is ", shape_str(x.shape()), " but ", what, " is ",
            shape_str(p.shape()), ", not [", x.size(-1), "]");
  QKV_CHECK(p.dtype() == x.dtype(), "[", op, "] ", what, " is ", dtype_name(p.dtype()), " but x is ",
            dtype_name(x.dtype()));
  detail::require_same_device(op, x, p);
}

void check_norm_input(const char* op, const Tensor& x) {
  detail::require_defined(op, x, "x");
  detail::require_float(op, x, "x");
  QKV_CHECK(x.dim() >= 1, "[", op, "] x must have at least one dim, got a scalar");
}

void check_same_shape(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  detail::require_defined(op, a, an);
  detail::require_defined(op, b, bn);
  QKV_CHECK(a.shape() == b.shape(), "[", op, "] ", an, " is ", shape_str(a.shape()), " but ", bn, " is ",
            shape_str(b.shape()));
  QKV_CHECK(a.dtype() == b.dtype(), "[", op, "] ", an, " is ", dtype_name(a.dtype()), " but ", bn, " is ",
            dtype_name(b.dtype()));
  detail::require_same_device(op, a, b);
}

Shape drop_last(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

// A preallocated output of an _into op: contiguous, of the given shape and of x's dtype and device.
void check_out(const char* op, const Tensor& out, const char* what, const Shape& shape, const Tensor& like) {
  detail::require_defined(op, out, what);
  QKV_CHECK(out.shape() == shape, "[", op, "] ", what, " is ", shape_str(out.shape()), ", not ", shape_str(shape));
  QKV_CHECK(out.dtype() == like.dtype(), "[", op, "] ", what, " is ", dtype_name(out.dtype()), " but must be ",
            dtype_name(like.dtype()));
  QKV_CHECK(out.is_contiguous(), "[", op, "] ", what, " ", shape_str(out.shape()), " must be contiguous");
  detail::require_same_device(op, like, out);
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous() : t; }

}  // namespace

// ---- embedding ----

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  detail::require_defined("embedding", weight, "weight");
  detail::require_float("embedding", weight, "weight");
  QKV_CHECK(weight.dim() == 2, "[embedding] weight must be [V, C], got ", shape_str(weight.shape()));
  const int64_t v = weight.size(0), c = weight.size(1);
  const Tensor idc = checked_ids("embedding", ids, v);
  detail::require_same_device("embedding", weight, idc);
  const Tensor w = (c <= 1 || weight.stride(1) == 1) ? weight : weight.contiguous();
  Shape out_shape = ids.shape();
  out_shape.push_back(c);
  Tensor out = Tensor::empty(out_shape, weight.dtype(), weight.device());
  if (out.numel() > 0) {
    if (on_cuda(w)) cuda::embedding_forward(w, idc, out);
    else cpu::embedding_forward(w, idc, out);
  }
  return out;
}

namespace {

// Checks ids and dy [..ids.., C] of embedding_backward; returns the ids contiguous.
Tensor check_embedding_backward(const char* op, const Tensor& ids, const Tensor& dy, int64_t num_embeddings) {
  detail::require_defined(op, dy, "dy");
  detail::require_float(op, dy, "dy");
  QKV_CHECK(num_embeddings >= 0, "[", op, "] num_embeddings ", num_embeddings, " is negative");
  const Tensor idc = checked_ids(op, ids, num_embeddings);
  Shape expect = ids.shape();
  QKV_CHECK(dy.dim() == ids.dim() + 1, "[", op, "] ids are ", shape_str(ids.shape()), " but dy is ",
            shape_str(dy.shape()), ": dy must be [..ids.., C]");
  expect.push_back(dy.size(-1));
  QKV_CHECK(dy.shape() == expect, "[", op, "] ids are ", shape_str(ids.shape()), " but dy is ", shape_str(dy.shape()),
            ": dy must be [..ids.., C]");
  detail::require_same_device(op, dy, idc);
  return idc;
}

void run_embedding_backward(const Tensor& idc, const Tensor& dy, const Tensor& dweight) {
  if (dy.numel() == 0) return;
  const Tensor dy2 = dy.contiguous().view({idc.numel(), dy.size(-1)});
  if (on_cuda(dy)) cuda::embedding_backward(idc, dy2, dweight);
  else cpu::embedding_backward(idc, dy2, dweight);
}

}  // namespace

Tensor embedding_backward(const Tensor& ids, const Tensor& dy, int64_t num_embeddings) {
  const Tensor idc = check_embedding_backward("embedding_backward", ids, dy, num_embeddings);
  Tensor dweight = zeros({num_embeddings, dy.size(-1)}, dy.dtype(), dy.device());
  run_embedding_backward(idc, dy, dweight);
  return dweight;
}

void embedding_backward_into(const Tensor& ids, const Tensor& dy, const Tensor& dweight) {
  detail::require_defined("embedding_backward_into", dweight, "dweight");
  QKV_CHECK(dweight.dim() == 2, "[embedding_backward_into] dweight must be [V, C], got ", shape_str(dweight.shape()));
  const Tensor idc = check_embedding_backward("embedding_backward_into", ids, dy, dweight.size(0));
  check_out("embedding_backward_into", dweight, "dweight", {dweight.size(0), dy.size(-1)}, dy);
  run_embedding_backward(idc, dy, dweight);
}

// ---- column sums ----

void sum_rows_into(const Tensor& x, const Tensor& out) {
  detail::require_defined("sum_rows", x, "x");
  detail::require_float("sum_rows", x, "x");
  QKV_CHECK(x.dim() == 2, "[sum_rows] x must be [R, C], got ", shape_str(x.shape()));
  check_out("sum_rows", out, "out", {x.size(1)}, x);
  const Tensor xc = x.contiguous();
  if (on_cuda(xc)) cuda::sum_rows(xc, out);
  else cpu::sum_rows(xc, out);
}

Tensor sum_rows(const Tensor& x) {
  detail::require_defined("sum_rows", x, "x");
  QKV_CHECK(x.dim() == 2, "[sum_rows] x must be [R, C], got ", shape_str(x.shape()));
  Tensor out = Tensor::empty({x.size(1)}, x.dtype(), x.device());
  sum_rows_into(x, out);
  return out;
}

// ---- layer norm / rms norm ----

NormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_norm_input("layer_norm", x);
  check_norm_param("layer_norm", weight, x, "weight");
  check_norm_param("layer_norm", bias, x, "bias");
  QKV_CHECK(eps >= 0, "[layer_norm] eps ", eps, " is negative");
  const Tensor xc = x.contiguous();
  NormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.mean = Tensor::empty(drop_last(x.shape()), x.dtype(), x.device());
  r.rstd = Tensor::empty(drop_last(x.shape()), x.dtype(), x.device());
  if (on_cuda(x))
    cuda::layer_norm_forward(xc, contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps, r.y, r.mean,
                             r.rstd);
  else
    cpu::layer_norm_forward(xc, contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps, r.y, r.mean,
                            r.rstd);
  return r;
}

void layer_norm_backward_into(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                              bool accumulate_dx) {
  check_norm_input("layer_norm_backward", x);
  check_same_shape("layer_norm_backward", dy, "dy", x, "x");
  check_norm_param("layer_norm_backward", weight, x, "weight");
  const Shape rows = drop_last(x.shape());
  QKV_CHECK(mean.defined() && rstd.defined() && mean.shape() == rows && rstd.shape() == rows &&
                mean.dtype() == x.dtype() && rstd.dtype() == x.dtype(),
            "[layer_norm_backward] x is ", shape_str(x.shape()), " so mean and rstd must be ", dtype_name(x.dtype()),
            " ", shape_str(rows));
  check_out("layer_norm_backward", dx, "dx", x.shape(), x);
  if (dweight.defined()) {
    QKV_CHECK(weight.defined(), "[layer_norm_backward] dweight is wanted but there is no weight");
    check_out("layer_norm_backward", dweight, "dweight", {x.size(-1)}, x);
  }
  if (dbias.defined()) check_out("layer_norm_backward", dbias, "dbias", {x.size(-1)}, x);
  if (on_cuda(x))
    cuda::layer_norm_backward(dy.contiguous(), x.contiguous(), contiguous_or_undefined(weight), mean.contiguous(),
                              rstd.contiguous(), dx, dweight, dbias, accumulate_dx);
  else
    cpu::layer_norm_backward(dy.contiguous(), x.contiguous(), contiguous_or_undefined(weight), mean.contiguous(),
                             rstd.contiguous(), dx, dweight, dbias, accumulate_dx);
}

NormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) {
  check_norm_input("layer_norm_backward", x);
  NormGrads g;
  g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (weight.defined()) g.dweight = Tensor::empty({x.size(-1)}, x.dtype(), x.device());
  g.dbias = Tensor::empty({x.size(-1)}, x.dtype(), x.device());
  layer_norm_backward_into(dy, x, weight, mean, rstd, g.dx, g.dweight, g.dbias, /*accumulate_dx=*/false);
  return g;
}

NormResult rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_norm_input("rms_norm", x);
  check_norm_param("rms_norm", weight, x, "weight");
  QKV_CHECK(eps >= 0, "[rms_norm] eps ", eps, " is negative");
  NormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), x.device());
  r.rstd = Tensor::empty(drop_last(x.shape()), x.dtype(), x.device());
  if (on_cuda(x)) cuda::rms_norm_forward(x.contiguous(), contiguous_or_undefined(weight), eps, r.y, r.rstd);
  else cpu::rms_norm_forward(x.contiguous(), contiguous_or_undefined(weight), eps, r.y, r.rstd);
  return r;
}

NormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  check_norm_input("rms_norm_backward", x);
  check_same_shape("rms_norm_backward", dy, "dy", x, "x");
  check_norm_param("rms_norm_backward", weight, x, "weight");
  const Shape rows = drop_last(x.shape());
  QKV_CHECK(rstd.defined() && rstd.shape() == rows && rstd.dtype() == x.dtype(), "[rms_norm_backward] x is ",
            shape_str(x.shape()), " so rstd must be ", dtype_name(x.dtype()), " ", shape_str(rows));
  NormGrads g;
  g.dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (weight.defined()) g.dweight = Tensor::empty(weight.shape(), x.dtype(), x.device());
  if (on_cuda(x))
    cuda::rms_norm_backward(dy.contiguous(), x.contiguous(), contiguous_or_undefined(weight), rstd.contiguous(), g.dx,
                            g.dweight);
  else
    cpu::rms_norm_backward(dy.contiguous(), x.contiguous(), contiguous_or_undefined(weight), rstd.contiguous(), g.dx,
                           g.dweight);
  return g;
}

// ---- cross-entropy ----

namespace {

// Checks logits [N, V] and targets [N]; returns the logits with unit column stride, the targets
// contiguous, and the number of targets that count.
struct CeInputs {
  Tensor logits, targets;
  int64_t count = 0;
};

template <class I>
int64_t check_targets(const Tensor& t, int64_t v, int64_t ignore, const Shape& logits_shape) {
  const I* p = t.data<I>();
  int64_t count = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t ti = static_cast<int64_t>(p[i]);
    if (ti == ignore) continue;
    QKV_CHECK(ti >= 0 && ti < v, "[cross_entropy] target ", ti, " at row ", i, " is out of range for ", v,
              " classes (logits ", shape_str(logits_shape), ")");
    ++count;
  }
  return count;
}

CeInputs check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, int64_t ignore) {
  detail::require_defined(op, logits, "logits");
  detail::require_defined(op, targets, "targets");
  detail::require_same_device(op, logits, targets);
  detail::require_float(op, logits, "logits");
  QKV_CHECK(is_integral(targets.dtype()), "[", op, "] targets must be int32 or int64, not ",
            dtype_name(targets.dtype()));
  QKV_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0), "[", op, "] logits are ",
            shape_str(logits.shape()), " but targets are ", shape_str(targets.shape()), ": need [N, V] and [N]");
  CeInputs in;
  const int64_t v = logits.size(1);
  in.logits = (v <= 1 || logits.stride(1) == 1) ? logits : logits.contiguous();
  in.targets = targets.contiguous();
  const Tensor host_targets = in.targets.to(Device::cpu);
  in.count = host_targets.dtype() == DType::i32 ? check_targets<int32_t>(host_targets, v, ignore, logits.shape())
                                                : check_targets<int64_t>(host_targets, v, ignore, logits.shape());
  return in;
}

}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const CeInputs in = check_cross_entropy("cross_entropy", logits, targets, ignore_index);
  CrossEntropyResult r;
  r.count = in.count;
  r.lse = Tensor::empty({logits.size(0)}, logits.dtype(), logits.device());
  const double total = on_cuda(logits) ? cuda::cross_entropy_forward(in.logits, in.targets, ignore_index, r.lse)
                                       : cpu::cross_entropy_forward(in.logits, in.targets, ignore_index, r.lse);
  // All targets ignored: the mean over nothing is taken as 0 (PyTorch gives NaN), with zero grads.
  r.loss = full({}, in.count > 0 ? total / static_cast<double>(in.count) : 0.0, logits.dtype(), logits.device());
  return r;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                              int64_t count, int64_t ignore_index) {
  const CeInputs in = check_cross_entropy("cross_entropy_backward", logits, targets, ignore_index);
  QKV_CHECK(lse.defined() && lse.shape() == Shape{logits.size(0)} && lse.dtype() == logits.dtype(),
            "[cross_entropy_backward] logits are ", shape_str(logits.shape()), " so lse must be ",
            dtype_name(logits.dtype()), " [", logits.size(0), "]");
  detail::require_same_device("cross_entropy_backward", logits, lse);
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const double scale = count > 0 ? dloss / static_cast<double>(count) : 0.0;
  if (on_cuda(logits))
    cuda::cross_entropy_backward(in.logits, in.targets, lse.contiguous(), scale, ignore_index, dlogits);
  else cpu::cross_entropy_backward(in.logits, in.targets, lse.contiguous(), scale, ignore_index, dlogits);
  return dlogits;
}

void cross_entropy_backward_(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                             int64_t count, int64_t ignore_index) {
  const CeInputs in = check_cross_entropy("cross_entropy_backward_", logits, targets, ignore_index);
  QKV_CHECK(logits.is_contiguous(), "[cross_entropy_backward_] logits ", shape_str(logits.shape()),
            " must be contiguous to be overwritten");
  QKV_CHECK(lse.defined() && lse.shape() == Shape{logits.size(0)} && lse.dtype() == logits.dtype(),
            "[cross_entropy_backward_] logits are ", shape_str(logits.shape()), " so lse must be ",
            dtype_name(logits.dtype()), " [", logits.size(0), "]");
  detail::require_same_device("cross_entropy_backward_", logits, lse);
  // Each element is read before it is written, by the same thread: dlogits may be the logits.
  const double scale = count > 0 ? dloss / static_cast<double>(count) : 0.0;
  if (on_cuda(logits)) cuda::cross_entropy_backward(logits, in.targets, lse.contiguous(), scale, ignore_index, logits);
  else cpu::cross_entropy_backward(logits, in.targets, lse.contiguous(), scale, ignore_index, logits);
}

// ---- dropout ----

Tensor dropout(const Tensor& a, double p, uint64_t seed, uint64_t offset) {
  detail::require_defined("dropout", a, "input");
  QKV_CHECK(p >= 0.0 && p < 1.0, "[dropout] p must be in [0, 1), got ", p);
  if (p == 0.0) return a;
  detail::require_float("dropout", a);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (on_cuda(a)) cuda::dropout_forward(a.contiguous(), p, seed, offset, out);
  else cpu::dropout_forward(a.contiguous(), p, seed, offset, out);
  return out;
}

}  // namespace qkv
