#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace qkv::autograd {

// <u, y> in float64.
static double dot_all(const Tensor& u, const Tensor& y) {
  const std::vector<double> a = u.to_vector(), b = y.to_vector();
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

GradcheckResult run_gradcheck(const GradcheckCase& c, const GradcheckOptions& opt) {
  GradcheckResult res{c.op, c.name};
  try {
    std::vector<Tensor> inputs = c.make_inputs();
    std::vector<bool> wrt(inputs.size(), false);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool is_f64 = inputs[i].defined() && inputs[i].dtype() == DType::f64;
      wrt[i] = c.wrt.empty() ? is_f64 : (i < c.wrt.size() && c.wrt[i]);
      if (wrt[i]) {
        QKV_CHECK(is_f64, "[gradcheck] input ", i, " of ", c.op, " must be float64");
        inputs[i] = inputs[i].contiguous().clone();
        inputs[i].set_requires_grad(true);
      }
    }
    Tensor y = c.fn(inputs);
    QKV_CHECK(y.dtype() == DType::f64, "[gradcheck] ", c.op, " returned ", dtype_name(y.dtype()), ", not float64");
    const Tensor u = randn(y.shape(), opt.seed, 0, 0.0, 1.0, DType::f64);
    backward(y, u);

    NoGradGuard no_grad;
    bool pass = true;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!wrt[i]) continue;
      Tensor g = inputs[i].grad();
      std::vector<double> analytic = g.defined() ? g.to_vector() : std::vector<double>(inputs[i].numel(), 0.0);
      double* x = inputs[i].data<double>();
      for (int64_t e = 0; e < inputs[i].numel(); ++e) {
        const double orig = x[e];
        x[e] = orig + opt.eps;
        const double fp = dot_all(u, c.fn(inputs));
        x[e] = orig - opt.eps;
        const double fm = dot_all(u, c.fn(inputs));
        x[e] = orig;
        const double numeric = (fp - fm) / (2 * opt.eps);
        const double err = std::fabs(analytic[e] - numeric);
        if (!std::isfinite(analytic[e]) || !(err <= opt.atol + opt.rtol * std::fabs(numeric))) pass = false;
        res.max_abs_err = std::max(res.max_abs_err, std::isfinite(err) ? err : INFINITY);
        const double rel = err / std::max(std::fabs(numeric), 1e-12);
        if (std::fabs(numeric) > opt.atol || err > opt.atol) res.max_rel_err = std::max(res.max_rel_err, rel);
      }
    }
    res.pass = pass;
  } catch (const std::exception& e) {
    res.pass = false;
    res.error = e.what();
  }
  return res;
}

}  // namespace qkv::autograd
