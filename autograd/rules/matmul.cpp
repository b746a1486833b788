// Linear algebra: matmul and linear. Backward products are GEMMs whose transposes are views, so
// tensor/cpu/matmul.cpp folds them into the BLAS call instead of copying.
#include <omp.h>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

Tensor mT(const Tensor& t) { return t.transpose(-1, -2); }

Shape batch_of(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// dA = dC·Bᵀ, dB = Aᵀ·dC (a, b at least 2-d), each summed over the batch dims it was broadcast along
// (bf16: recorded under autocast, so a, b and the incoming dC all hold bf16 values)
struct MatmulBackward : Node {
  Tensor a, b;
  bool bf16 = false;
  const char* name() const override { return "MatmulBackward"; }
  std::vector<Tensor> backward(const Tensor& dc) override {
    Tensor da, db;
    const Shape full = batch_of(dc);
    auto mm = [this](const Tensor& x, const Tensor& y) { return qkv::matmul(x, y, bf16); };
    if (needs_grad(0)) { da = batch_of(a) == full ? mm(dc, mT(b)) : sum_to(mm(dc, mT(b)), a.shape()); }
    if (needs_grad(1)) {
      if (batch_of(b) == full) {
        db = mm(mT(a), dc);
      } else if (numel_of(batch_of(b)) == 1 && batch_of(a) == full) {
        // b shared by every batch: sum_i A_iᵀ dC_i = (A viewed [rows, K])ᵀ (dC viewed [rows, N]),
        // one GEMM instead of a batch of products and a reduction.
        const int64_t k = a.size(-1), n = dc.size(-1);
        db = mm(mT(a.reshape({-1, k})), dc.reshape({-1, n})).view(b.shape());
      } else {
        db = sum_to(mm(mT(a), dc), b.shape());
      }
    }
    return {da, db};
  }
  void release() override { a = b = Tensor(); }
};

// dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy   (x and dy viewed as [rows, in] and [rows, out])
// dx and dW are independent products of equal cost. On two threads they run side by side, each a
// single-threaded GEMM (OpenBLAS runs single-threaded inside our parallel region): one fork/join
// instead of two, and no synchronisation inside either GEMM.
struct LinearBackward : Node {
  Tensor x, weight;
  bool has_bias = false;
  // Recorded under autocast: dy holds bf16 values, and x and weight too unless the products round
  // them (qkv::linear_rounds_bf16_operands: then dx's and dW's products do the same).
  bool bf16 = false;
  const char* name() const override { return "LinearBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    const int64_t in = weight.size(1), out = weight.size(0);
    const int64_t rows = in > 0 ? x.numel() / in : numel_of(Shape(x.shape().begin(), x.shape().end() - 1));
    const Tensor dy2 = dy.reshape({rows, out});
    const bool want_dx = needs_grad(0), want_dw = needs_grad(1), want_db = has_bias && needs_grad(2);
    Tensor dx, dw, db;
    if (want_dx) dx = Tensor::empty({rows, in}, dy.dtype(), dy.device());
    if (want_dw) dw = Tensor::empty({out, in}, dy.dtype(), dy.device());
    const Tensor x2 = want_dw ? x.reshape({rows, in}) : Tensor();
    const Tensor dyc = want_db ? dy2.contiguous() : Tensor();
    if (want_db) db = Tensor::empty({out}, dy.dtype(), dy.device());
    auto run = [&](int task) {
      if (task == 0 && want_dx) matmul_into(dy2, weight, dx, 1.0, 0.0, bf16);
      if (task == 1 && want_dw) matmul_into(dy2.transpose(0, 1), x2, dw, 1.0, 0.0, bf16);
      if (task == 2 && want_db) sum_rows_into(dyc, db);
    };
    const bool side_by_side = want_dx && want_dw && dy.device() == Device::cpu && omp_get_max_threads() == 2 &&
                              !omp_in_parallel() && rows * in * out >= (int64_t(1) << 20);
    if (side_by_side) {
      // dx and dW start at once; the bias sum goes to whichever thread finishes first.
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
      for (int task = 0; task < 3; ++task) run(task);
    } else {
      for (int task = 0; task < 3; ++task) run(task);
    }
    if (want_dx) dx = dx.view(x.shape());
    return {dx, dw, db};
  }
  void release() override { x = weight = Tensor(); }
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  QKV_CHECK(a_in.defined() && b_in.defined(), "[matmul] an operand is an undefined tensor");
  const bool bf16 = autograd::autocast_bf16() && a_in.dtype() == DType::f32;
  const Tensor a = autocast_input(a_in), b = autocast_input(b_in);  // bf16 autocast (else a_in, b_in)
  // Vector operands become matrices through recorded reshapes, so the rule only sees >= 2-d.
  if (a.dim() == 1 && autograd::any_requires_grad({&a, &b}))
    return squeeze(ag::matmul(unsqueeze(a, 0), b), b.dim() == 1 ? -1 : -2);
  if (b.dim() == 1 && autograd::any_requires_grad({&a, &b})) return squeeze(ag::matmul(a, unsqueeze(b, 1)), -1);
  Tensor out = qkv::matmul(a, b, bf16);
  if (!autograd::any_requires_grad({&a, &b})) return out;
  auto n = std::make_shared<MatmulBackward>();
  n->a = a;
  n->b = b;
  n->bf16 = bf16;
  return autocast_output(record(out, n, {a, b}));
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias) {
  // bf16 autocast: inputs rounded here, the incoming gradient rounded by autocast_output.
  const bool bf16 = autograd::autocast_bf16() && x_in.dtype() == DType::f32;
  // Inference (nothing to differentiate): W is rounded by the op itself, which in a decode loop
  // packs it once as bf16 instead of rounding a copy per call (qkv::linear_bf16_weight).
  if (bf16 && weight_in.dtype() == DType::f32 && !autograd::any_requires_grad({&x_in, &weight_in, &bias}))
    return qkv::linear_bf16_weight(autocast_input(x_in), weight_in, bias);
  // Where the product rounds its operands itself (the CPU's bf16 units, as they pack them), x and
  // W go to it as they are: the same values without a rounding pass over each.
  const bool rounded_by_product = bf16 && qkv::linear_rounds_bf16_operands(x_in, weight_in);
  const Tensor x = rounded_by_product ? x_in : autocast_input(x_in);
  const Tensor weight = rounded_by_product ? weight_in : autocast_input(weight_in);
  Tensor y = qkv::linear(x, weight, bias, bf16);
  if (!autograd::any_requires_grad({&x, &weight, &bias})) return y;
  auto n = std::make_shared<LinearBackward>();
  n->x = x;
  n->weight = weight;
  n->has_bias = bias.defined();
  n->bf16 = bf16;
  return autocast_output(n->has_bias ? record(y, n, {x, weight, bias}) : record(y, n, {x, weight}));
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_matmul_gradchecks(GradcheckRegistry& r) {
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  using V = std::vector<Tensor>;
  r.add({"matmul", "2-d [3,4]x[4,5]",
         [=] {
           return V{in({3, 4}, 1), in({4, 5}, 2)};
         },
         [](const V& x) { return ag::matmul(x[0], x[1]); }});
  r.add({"matmul", "batched broadcast [2,1,3,4]x[3,4,2]",
         [=] {
           return V{in({2, 1, 3, 4}, 3), in({3, 4, 2}, 4)};
         },
         [](const V& x) { return ag::matmul(x[0], x[1]); }});
  r.add({"matmul", "batched a [2,3,5,4] x shared b [4,3]",
         [=] {
           return V{in({2, 3, 5, 4}, 5), in({4, 3}, 6)};
         },
         [](const V& x) { return ag::matmul(x[0], x[1]); }});
  r.add({"matmul", "shared a [3,4] x batched b [2,4,5]",
         [=] {
           return V{in({3, 4}, 7), in({2, 4, 5}, 8)};
         },
         [](const V& x) { return ag::matmul(x[0], x[1]); }});
  r.add({"matmul", "transposed operands aT[4,3]^T x bT[5,4]^T",
         [=] {
           return V{in({4, 3}, 9), in({5, 4}, 10)};
         },
         [](const V& x) { return ag::matmul(ag::transpose(x[0], 0, 1), ag::transpose(x[1], 0, 1)); }});
  r.add({"matmul", "batched q @ k^T [2,3,5,4]x[2,3,6,4]^T",
         [=] {
           return V{in({2, 3, 5, 4}, 11), in({2, 3, 6, 4}, 12)};
         },
         [](const V& x) { return ag::matmul(x[0], ag::transpose(x[1], -1, -2)); }});
  r.add({"matmul", "odd sizes [7,13]x[13,11]",
         [=] {
           return V{in({7, 13}, 13), in({13, 11}, 14)};
         },
         [](const V& x) { return ag::matmul(x[0], x[1]); }});
  r.add({"matmul", "size-1 dims [1,4]x[4,1] and [3,1]x[1,2]",
         [=] {
           return V{in({1, 4}, 15), in({4, 1}, 16), in({3, 1}, 17), in({1, 2}, 18)};
         },
         [](const V& x) { return ag::add(ag::matmul(x[0], x[1]), ag::sum(ag::matmul(x[2], x[3]))); }});
  r.add({"matmul", "vector operands [4]x[4,3] and [2,3]x[3]",
         [=] {
           return V{in({4}, 19), in({4, 3}, 20), in({2, 3}, 21), in({3}, 22)};
         },
         [](const V& x) { return ag::mul(ag::matmul(x[0], x[1]), ag::sum(ag::matmul(x[2], x[3]))); }});
  r.add({"matmul", "strided narrow a[:, 1:4] x b",
         [=] {
           return V{in({3, 6}, 23), in({3, 2}, 24)};
         },
         [](const V& x) { return ag::matmul(ag::narrow(x[0], 1, 1, 3), x[1]); }});
  r.add({"linear", "3-d x [2,3,4], W [5,4], bias [5]",
         [=] {
           return V{in({2, 3, 4}, 25), in({5, 4}, 26), in({5}, 27)};
         },
         [](const V& x) { return ag::linear(x[0], x[1], x[2]); }});
  r.add({"linear", "3-d x [2,3,4], W [5,4], no bias",
         [=] {
           return V{in({2, 3, 4}, 28), in({5, 4}, 29)};
         },
         [](const V& x) { return ag::linear(x[0], x[1], Tensor()); }});
  r.add({"linear", "transposed x [4,3]^T, W [2,4], bias [2]",
         [=] {
           return V{in({4, 3}, 30), in({2, 4}, 31), in({2}, 32)};
         },
         [](const V& x) { return ag::linear(ag::transpose(x[0], 0, 1), x[1], x[2]); }});
}

}  // namespace qkv::autograd
