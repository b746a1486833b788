// Elementwise ops: forward calls the raw op; each backward is the local derivative times dy,
// summed back to the input's shape (sum_to) where the forward broadcast.
// Saved tensors are detached views (same storage, no autograd slot), so a node never keeps its
// own output's graph alive through a reference cycle.
#include <cmath>

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"

namespace qkv::ag {
using autograd::Node;
using autograd::record;

namespace {

// d(a + b) = (sum_to(dy, a), sum_to(dy, b))
struct AddBackward : Node {
  Shape a_shape, b_shape;
  const char* name() const override { return "AddBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    return {needs_grad(0) ? sum_to(dy, a_shape) : Tensor(), needs_grad(1) ? sum_to(dy, b_shape) : Tensor()};
  }
};

// d(a - b) = (sum_to(dy, a), -sum_to(dy, b))
struct SubBackward : Node {
  Shape a_shape, b_shape;
  const char* name() const override { return "SubBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    return {needs_grad(0) ? sum_to(dy, a_shape) : Tensor(), needs_grad(1) ? qkv::neg(sum_to(dy, b_shape)) : Tensor()};
  }
};

// d(a * b) = (sum_to(dy * b, a), sum_to(dy * a, b))
struct MulBackward : Node {
  Tensor a, b;
  const char* name() const override { return "MulBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    return {needs_grad(0) ? sum_to(qkv::mul(dy, b), a.shape()) : Tensor(),
            needs_grad(1) ? sum_to(qkv::mul(dy, a), b.shape()) : Tensor()};
  }
  void release() override { a = b = Tensor(); }
};

// d(a / b) = (sum_to(dy / b, a), sum_to(-dy * a / b^2, b))
struct DivBackward : Node {
  Tensor a, b;
  const char* name() const override { return "DivBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    Tensor da, db;
    const Tensor g = qkv::div(dy, b);  // dy / b, shared by both
    if (needs_grad(0)) da = sum_to(g, a.shape());
    if (needs_grad(1)) db = sum_to(qkv::neg(qkv::div(qkv::mul(g, a), b)), b.shape());
    return {da, db};
  }
  void release() override { a = b = Tensor(); }
};

// d(a + s) = dy
struct AddScalarBackward : Node {
  const char* name() const override { return "AddScalarBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {dy}; }
};

// d(a * s) = s dy
struct MulScalarBackward : Node {
  double s = 1;
  const char* name() const override { return "MulScalarBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::mul(dy, s)}; }
};

// d(a^p) = p a^(p-1) dy
struct PowBackward : Node {
  Tensor a;
  double p = 1;
  const char* name() const override { return "PowBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    if (p == 0) return {qkv::mul(dy, 0.0)};
    return {qkv::mul(dy, qkv::mul(qkv::pow(a, p - 1), p))};
  }
  void release() override { a = Tensor(); }
};

// d(-a) = -dy
struct NegBackward : Node {
  const char* name() const override { return "NegBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::neg(dy)}; }
};

// d(e^a) = y dy
struct ExpBackward : Node {
  Tensor y;
  const char* name() const override { return "ExpBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::mul(dy, y)}; }
  void release() override { y = Tensor(); }
};

// d(log a) = dy / a
struct LogBackward : Node {
  Tensor a;
  const char* name() const override { return "LogBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::div(dy, a)}; }
  void release() override { a = Tensor(); }
};

// d(sqrt a) = dy / (2 y)
struct SqrtBackward : Node {
  Tensor y;
  const char* name() const override { return "SqrtBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::div(qkv::mul(dy, 0.5), y)}; }
  void release() override { y = Tensor(); }
};

// d(a^-1/2) = -0.5 y^3 dy
struct RsqrtBackward : Node {
  Tensor y;
  const char* name() const override { return "RsqrtBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::mul(dy, qkv::mul(qkv::pow(y, 3.0), -0.5))}; }
  void release() override { y = Tensor(); }
};

// d(tanh a) = (1 - y^2) dy
struct TanhBackward : Node {
  Tensor y;
  const char* name() const override { return "TanhBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::mul(dy, qkv::rsub(qkv::mul(y, y), 1.0))}; }
  void release() override { y = Tensor(); }
};

// d(sigmoid a) = y (1 - y) dy
struct SigmoidBackward : Node {
  Tensor y;
  const char* name() const override { return "SigmoidBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::mul(dy, qkv::mul(y, qkv::rsub(y, 1.0)))}; }
  void release() override { y = Tensor(); }
};

// d(relu a) = dy where a > 0
struct ReluBackward : Node {
  Tensor a;
  const char* name() const override { return "ReluBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {relu_backward(a, dy)}; }
  void release() override { a = Tensor(); }
};

// d(gelu a) = gelu'(a) dy (tanh form or erf form, fused kernel)
struct GeluBackward : Node {
  Tensor a;
  GeluApprox approx = GeluApprox::tanh;
  const char* name() const override { return "GeluBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {gelu_backward(a, dy, approx)}; }
  void release() override { a = Tensor(); }
};

// z = a + bias (bias along the last dim): dz = gelu'(z) dy (one fused kernel from a and bias, z is
// never stored); da = dz, dbias = the column sums of dz (fixed order, as a Linear's bias gradient).
struct BiasGeluBackward : Node {
  Tensor a, bias;
  GeluApprox approx = GeluApprox::tanh;
  const char* name() const override { return "BiasGeluBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    const Tensor dz = bias_gelu_backward(a, bias, dy, approx);
    Tensor dbias;
    if (needs_grad(1)) {
      const int64_t C = bias.size(0);
      const Tensor rows = dz.reshape({C > 0 ? dz.numel() / C : 0, C});
      dbias = sum_rows(rows);
    }
    return {needs_grad(0) ? dz : Tensor(), dbias};
  }
  void release() override {
    a = Tensor();
    bias = Tensor();
  }
};

// d(a sigmoid a) = s (1 + a (1 - s)) dy, s = sigmoid(a)
struct SiluBackward : Node {
  Tensor a;
  const char* name() const override { return "SiluBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {silu_backward(a, dy)}; }
  void release() override { a = Tensor(); }
};

// d(where(c, a, b)) = (sum_to(dy where c, a), sum_to(dy where !c, b))
struct WhereBackward : Node {
  Tensor cond;
  Shape a_shape, b_shape;
  const char* name() const override { return "WhereBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override {
    const Tensor c = cond.expand(dy.shape());
    Tensor da, db;
    if (needs_grad(0)) da = sum_to(qkv::masked_fill(dy, logical_not(c), 0.0), a_shape);
    if (needs_grad(1)) db = sum_to(qkv::masked_fill(dy, c, 0.0), b_shape);
    return {da, db};
  }
  void release() override { cond = Tensor(); }
};

// d(masked_fill(a, m, v)) = dy where !m
struct MaskedFillBackward : Node {
  Tensor mask;
  const char* name() const override { return "MaskedFillBackward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {qkv::masked_fill(dy, mask, 0.0)}; }
  void release() override { mask = Tensor(); }
};

template <class N>
Tensor binary_node(Tensor out, const Tensor& a, const Tensor& b) {
  auto n = std::make_shared<N>();
  if constexpr (requires { n->a_shape; }) {
    n->a_shape = a.shape();
    n->b_shape = b.shape();
  } else {
    n->a = a.detach();
    n->b = b.detach();
  }
  return record(out, n, {a, b});
}

// Unary node saving what its rule reads: the output (member y) or the input (member a).
template <class N>
Tensor unary_node(Tensor out, const Tensor& a) {
  auto n = std::make_shared<N>();
  if constexpr (requires { n->y; }) n->y = out.detach();
  if constexpr (requires { n->a; }) n->a = a.detach();
  return record(out, n, {a});
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = qkv::add(a, b);
  return autograd::any_requires_grad({&a, &b}) ? binary_node<AddBackward>(out, a, b) : out;
}
Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = qkv::sub(a, b);
  return autograd::any_requires_grad({&a, &b}) ? binary_node<SubBackward>(out, a, b) : out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = qkv::mul(a, b);
  return autograd::any_requires_grad({&a, &b}) ? binary_node<MulBackward>(out, a, b) : out;
}
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = qkv::div(a, b);
  return autograd::any_requires_grad({&a, &b}) ? binary_node<DivBackward>(out, a, b) : out;
}

Tensor add(const Tensor& a, double s) {
  Tensor out = qkv::add(a, s);
  if (!autograd::any_requires_grad({&a})) return out;
  return record(out, std::make_shared<AddScalarBackward>(), {a});
}
Tensor mul(const Tensor& a, double s) {
  Tensor out = qkv::mul(a, s);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<MulScalarBackward>();
  n->s = s;
  return record(out, n, {a});
}
Tensor pow(const Tensor& a, double exponent) {
  Tensor out = qkv::pow(a, exponent);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<PowBackward>();
  n->a = a.detach();
  n->p = exponent;
  return record(out, n, {a});
}
Tensor neg(const Tensor& a) {
  Tensor out = qkv::neg(a);
  if (!autograd::any_requires_grad({&a})) return out;
  return record(out, std::make_shared<NegBackward>(), {a});
}

#define QKV_UNARY_AG(fn, Node)                                                 \
  Tensor fn(const Tensor& a) {                                                 \
    Tensor out = qkv::fn(a);                                                   \
    return autograd::any_requires_grad({&a}) ? unary_node<Node>(out, a) : out; \
  }
QKV_UNARY_AG(exp, ExpBackward)
QKV_UNARY_AG(log, LogBackward)
QKV_UNARY_AG(sqrt, SqrtBackward)
QKV_UNARY_AG(rsqrt, RsqrtBackward)
QKV_UNARY_AG(tanh, TanhBackward)
QKV_UNARY_AG(sigmoid, SigmoidBackward)
QKV_UNARY_AG(relu, ReluBackward)
QKV_UNARY_AG(silu, SiluBackward)
#undef QKV_UNARY_AG

Tensor gelu(const Tensor& a, GeluApprox approx) {
  Tensor out = qkv::gelu(a, approx);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<GeluBackward>();
  n->a = a.detach();
  n->approx = approx;
  return record(out, n, {a});
}

Tensor bias_gelu(const Tensor& a, const Tensor& bias, GeluApprox approx) {
  Tensor out = qkv::bias_gelu(a, bias, approx);
  if (!autograd::any_requires_grad({&a, &bias})) return out;
  auto n = std::make_shared<BiasGeluBackward>();
  n->a = a.detach();
  n->bias = bias.detach();
  n->approx = approx;
  return record(out, n, {a, bias});
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = qkv::where(cond, a, b);
  if (!autograd::any_requires_grad({&a, &b})) return out;
  auto n = std::make_shared<WhereBackward>();
  n->cond = cond;
  n->a_shape = a.shape();
  n->b_shape = b.shape();
  return record(out, n, {a, b});
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  Tensor out = qkv::masked_fill(a, mask, value);
  if (!autograd::any_requires_grad({&a})) return out;
  auto n = std::make_shared<MaskedFillBackward>();
  n->mask = mask.expand(a.shape());
  return record(out, n, {a});
}

namespace {

// x rounded to bfloat16 and widened back (one rounding, ties to even: the float32 -> bf16 cast).
Tensor rounded(const Tensor& x) { return round_to_bf16(x); }

// d round_bf16(x) = dy: the rounding is treated as the identity (straight through), as a dtype cast is
struct RoundBf16Backward : Node {
  const char* name() const override { return "RoundBf16Backward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {dy}; }
};

// d round_grad_bf16(y) = bf16(dy)
struct RoundGradBf16Backward : Node {
  const char* name() const override { return "RoundGradBf16Backward"; }
  std::vector<Tensor> backward(const Tensor& dy) override { return {rounded(dy)}; }
};

void require_f32(const char* op, const Tensor& t) {
  QKV_CHECK(t.defined() && t.dtype() == DType::f32, "[", op, "] needs a float32 tensor, got ",
            t.defined() ? dtype_name(t.dtype()) : "undefined");
}

}  // namespace

Tensor round_bf16(const Tensor& x) {
  require_f32("round_bf16", x);
  Tensor out = rounded(x);
  if (!autograd::any_requires_grad({&x})) return out;
  return record(out, std::make_shared<RoundBf16Backward>(), {x});
}

Tensor round_grad_bf16(const Tensor& y) {
  require_f32("round_grad_bf16", y);
  if (!autograd::any_requires_grad({&y})) return y;
  // A new handle on y's data: the node's output must be a tensor of its own.
  Tensor out = y.detach();
  return record(out, std::make_shared<RoundGradBf16Backward>(), {y});
}

Tensor autocast_input(const Tensor& x) {
  if (!(autograd::autocast_bf16() && x.defined() && x.dtype() == DType::f32)) return x;
  // On the GPU the GEMM converts its operands to bf16 storage for cuBLAS, and that conversion
  // rounds (nearest, ties to even) exactly as round_bf16 does, in forward and when the saved
  // operand is converted again in backward: a separate rounding pass would only add a read and a
  // write of x.
  if (x.device() == Device::cuda) return x;
  return round_bf16(x);
}

Tensor autocast_output(const Tensor& y) {
  return autograd::autocast_bf16() && y.defined() && y.dtype() == DType::f32 ? round_grad_bf16(y) : y;
}

}  // namespace qkv::ag

namespace qkv::autograd {

void register_elementwise_gradchecks(GradcheckRegistry& r) {
  using V = std::vector<Tensor>;
  using X = const std::vector<Tensor>&;
  auto in = [](Shape s, uint64_t seed) { return randn(s, seed, 0, 0.0, 1.0, DType::f64); };
  // Positive-domain inputs (log, sqrt, rsqrt, pow, divisors) kept in [0.5, 2].
  auto pos = [](Shape s, uint64_t seed) { return rand(s, seed, 0, 0.5, 2.0, DType::f64); };
  auto tr = [](const Tensor& t) { return ag::transpose(t, 0, 1); };

  r.add({"add", "[3,4] + [3,4]",
         [=] {
           return V{in({3, 4}, 1), in({3, 4}, 2)};
         },
         [](X x) { return ag::add(x[0], x[1]); }});
  r.add({"add", "broadcast [2,3,4] + [3,1]",
         [=] {
           return V{in({2, 3, 4}, 3), in({3, 1}, 4)};
         },
         [](X x) { return ag::add(x[0], x[1]); }});
  r.add({"add", "transposed [5,3]^T + [1]",
         [=] {
           return V{in({5, 3}, 5), in({1}, 6)};
         },
         [=](X x) { return ag::add(tr(x[0]), x[1]); }});
  r.add({"add", "size-1 dims [1,5] + [4,1]",
         [=] {
           return V{in({1, 5}, 7), in({4, 1}, 8)};
         },
         [](X x) { return ag::add(x[0], x[1]); }});
  r.add({"sub", "[2,5] - [5]", [=] { return V{in({2, 5}, 9), in({5}, 10)}; }, [](X x) { return ag::sub(x[0], x[1]); }});
  r.add({"sub", "[3,1,2] - [3,4,2]",
         [=] {
           return V{in({3, 1, 2}, 11), in({3, 4, 2}, 12)};
         },
         [](X x) { return ag::sub(x[0], x[1]); }});
  r.add({"mul", "[3,4] * [3,4]",
         [=] {
           return V{in({3, 4}, 13), in({3, 4}, 14)};
         },
         [](X x) { return ag::mul(x[0], x[1]); }});
  r.add({"mul", "broadcast [2,1,3] * [4,1]",
         [=] {
           return V{in({2, 1, 3}, 15), in({4, 1}, 16)};
         },
         [](X x) { return ag::mul(x[0], x[1]); }});
  r.add({"mul", "transposed [5,3]^T * [3,5]",
         [=] {
           return V{in({5, 3}, 17), in({3, 5}, 18)};
         },
         [=](X x) { return ag::mul(tr(x[0]), x[1]); }});
  r.add({"mul", "one input used twice x * x", [=] { return V{in({7}, 19)}; }, [](X x) { return ag::mul(x[0], x[0]); }});
  r.add({"div", "[3,4] / [3,4]",
         [=] {
           return V{in({3, 4}, 20), pos({3, 4}, 21)};
         },
         [](X x) { return ag::div(x[0], x[1]); }});
  r.add({"div", "broadcast [2,3] / [3]",
         [=] {
           return V{in({2, 3}, 22), pos({3}, 23)};
         },
         [](X x) { return ag::div(x[0], x[1]); }});
  r.add({"div", "broadcast [3,1] / transposed [4,3]^T",
         [=] {
           return V{in({3, 1}, 24), pos({4, 3}, 25)};
         },
         [=](X x) { return ag::div(x[0], tr(x[1])); }});
  r.add({"add_scalar", "[3,5] + 2.5", [=] { return V{in({3, 5}, 26)}; }, [](X x) { return ag::add(x[0], 2.5); }});
  r.add({"mul_scalar", "transposed [4,3]^T * -1.5",
         [=] {
           return V{in({4, 3}, 27)};
         },
         [=](X x) { return ag::mul(tr(x[0]), -1.5); }});
  for (double p : {2.0, 3.0, 0.5, -1.5, 1.7}) {
    r.add({"pow", cat("[2,3,3] ^ ", p, " (positive inputs)"),
           [=] {
             return V{pos({2, 3, 3}, 28)};
           },
           [p](X x) { return ag::pow(x[0], p); }});
  }
  r.add({"pow", "signed [9] ^ 2", [=] { return V{in({9}, 29)}; }, [](X x) { return ag::pow(x[0], 2.0); }});
  r.add({"neg", "[3,4]", [=] { return V{in({3, 4}, 30)}; }, [](X x) { return ag::neg(x[0]); }});
  r.add({"exp", "[2,5]", [=] { return V{in({2, 5}, 31)}; }, [](X x) { return ag::exp(x[0]); }});
  r.add({"exp", "transposed [5,1]^T", [=] { return V{in({5, 1}, 32)}; }, [=](X x) { return ag::exp(tr(x[0])); }});
  r.add({"log", "[3,4] positive", [=] { return V{pos({3, 4}, 33)}; }, [](X x) { return ag::log(x[0]); }});
  r.add({"sqrt", "[3,4] positive", [=] { return V{pos({3, 4}, 34)}; }, [](X x) { return ag::sqrt(x[0]); }});
  r.add({"sqrt", "transposed [4,3]^T positive",
         [=] {
           return V{pos({4, 3}, 35)};
         },
         [=](X x) { return ag::sqrt(tr(x[0])); }});
  r.add({"rsqrt", "[2,7] positive", [=] { return V{pos({2, 7}, 36)}; }, [](X x) { return ag::rsqrt(x[0]); }});
  r.add({"tanh", "[3,4]", [=] { return V{in({3, 4}, 37)}; }, [](X x) { return ag::tanh(x[0]); }});
  r.add({"tanh", "wide inputs [11] (std 3)", [=] { return V{randn({11}, 38, 0, 0.0, 3.0, DType::f64)}; },
         [](X x) { return ag::tanh(x[0]); }});
  r.add({"sigmoid", "[3,4]", [=] { return V{in({3, 4}, 39)}; }, [](X x) { return ag::sigmoid(x[0]); }});
  r.add({"sigmoid", "wide inputs [11] (std 6)", [=] { return V{randn({11}, 40, 0, 0.0, 6.0, DType::f64)}; },
         [](X x) { return ag::sigmoid(x[0]); }});
  r.add({"relu", "[4,5]", [=] { return V{in({4, 5}, 41)}; }, [](X x) { return ag::relu(x[0]); }});
  r.add({"relu", "transposed [3,2]^T", [=] { return V{in({3, 2}, 42)}; }, [=](X x) { return ag::relu(tr(x[0])); }});
  r.add({"gelu", "tanh approximation [3,5]",
         [=] {
           return V{in({3, 5}, 43)};
         },
         [](X x) { return ag::gelu(x[0], GeluApprox::tanh); }});
  r.add({"gelu", "exact erf [3,5]",
         [=] {
           return V{in({3, 5}, 44)};
         },
         [](X x) { return ag::gelu(x[0], GeluApprox::none); }});
  r.add({"gelu", "tanh approximation transposed [4,3]^T (std 3)",
         [=] {
           return V{randn({4, 3}, 45, 0, 0.0, 3.0, DType::f64)};
         },
         [=](X x) { return ag::gelu(tr(x[0]), GeluApprox::tanh); }});
  r.add({"bias_gelu", "tanh approximation [2,3,5] + [5]",
         [=] {
           return V{in({2, 3, 5}, 48), in({5}, 49)};
         },
         [](X x) { return ag::bias_gelu(x[0], x[1], GeluApprox::tanh); }});
  r.add({"bias_gelu", "exact erf, transposed [4,3]^T + [4] (std 3)",
         [=] {
           return V{randn({4, 3}, 50, 0, 0.0, 3.0, DType::f64), in({4}, 51)};
         },
         [=](X x) { return ag::bias_gelu(tr(x[0]), x[1], GeluApprox::none); }});
  r.add({"silu", "[3,5]", [=] { return V{in({3, 5}, 46)}; }, [](X x) { return ag::silu(x[0]); }});
  r.add({"silu", "size-1 dims [1,6,1] (std 4)",
         [=] {
           return V{randn({1, 6, 1}, 47, 0, 0.0, 4.0, DType::f64)};
         },
         [](X x) { return ag::silu(x[0]); }});
  // Fixed masks drawn from a seed: both sides of where get some elements.
  auto mask = [](Shape s, uint64_t seed) {
    return gt(rand(s, seed, 0, 0.0, 1.0, DType::f64), full({}, 0.5, DType::f64));
  };
  r.add({"where", "[3,4] ? [3,4] : [3,4]",
         [=] {
           return V{in({3, 4}, 48), in({3, 4}, 49)};
         },
         [=](X x) {
           return ag::where(mask({3, 4}, 50), x[0], x[1]);
         }});
  r.add({"where", "broadcast [3,1] ? [3,4] : [4]",
         [=] {
           return V{in({3, 4}, 51), in({4}, 52)};
         },
         [=](X x) {
           return ag::where(mask({3, 1}, 53), x[0], x[1]);
         }});
  r.add({"masked_fill", "[3,4] mask [3,4]",
         [=] {
           return V{in({3, 4}, 54)};
         },
         [=](X x) {
           return ag::masked_fill(x[0], mask({3, 4}, 55), -7.0);
         }});
  r.add({"masked_fill", "transposed [5,2]^T mask [5]",
         [=] {
           return V{in({5, 2}, 56)};
         },
         [=](X x) { return ag::masked_fill(tr(x[0]), mask({5}, 57), 3.0); }});
}

}  // namespace qkv::autograd
