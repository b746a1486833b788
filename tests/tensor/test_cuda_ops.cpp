// CUDA kernels against the CPU kernels (themselves tested against float64 references): the same
// op on the same inputs, moved to the device and back. Cases carry the [cuda] tag and report
// "skipped: no CUDA device" where none is present (CI has no GPU; scripts/gpu_check.sh runs them
// on a machine with one).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "compare_util.h"
#include "attention/attention.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "nn/transformer.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"
#include "train/clip.h"
#include "train/config.h"
#include "train/model_factory.h"
#include "train/optimizer.h"

using namespace qkv;

namespace {

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }
Tensor host(const Tensor& t) { return t.to(Device::cpu); }

// max |a - b| / max(|b|, tiny) over equally shaped tensors, a on the device, b on the host.
double rel_err(const Tensor& a_dev, const Tensor& b) {
  REQUIRE(a_dev.device() == Device::cuda);
  REQUIRE(a_dev.shape() == b.shape());
  const auto x = host(a_dev).to_vector(), y = b.to_vector();
  double d = 0, s = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(std::isfinite(x[i]) == std::isfinite(y[i]));
    if (std::isfinite(y[i])) d = std::max(d, std::fabs(x[i] - y[i]));
    s = std::max(s, std::fabs(y[i]));
  }
  return d / s;
}

}  // namespace

TEST_CASE("device round trip keeps every dtype's bits; strided device copies compact views", "[cuda]") {
  if (!test::cuda_device_present()) return;
  const Tensor x = randn({3, 5, 7}, 1);
  CHECK(max_abs_diff(host(gpu(x)), x) == 0.0);
  for (DType t : {DType::f64, DType::i32, DType::i64, DType::bf16, DType::f16, DType::boolean}) {
    INFO(dtype_name(t));
    const Tensor xt = x.to(t);
    CHECK(max_abs_diff(host(gpu(xt)).to(DType::f64), xt.to(DType::f64)) == 0.0);
    // Conversions on the device equal the host's.
    CHECK(max_abs_diff(host(gpu(x).to(t)).to(DType::f64), xt.to(DType::f64)) == 0.0);
  }
  const Tensor view = x.permute({2, 0, 1}).narrow(1, 1, 2);  // non-contiguous
  CHECK(max_abs_diff(host(gpu(x).permute({2, 0, 1}).narrow(1, 1, 2).contiguous()), view.contiguous()) == 0.0);
  Tensor dst = zeros({7, 2, 5}, DType::f32, Device::cuda);
  copy_(dst, view);  // host source, device destination
  CHECK(max_abs_diff(host(dst), view.contiguous()) == 0.0);
  fill_(dst, 2.5);
  CHECK(host(dst).to_vector() == std::vector<double>(70, 2.5));
}

TEST_CASE("CUDA elementwise ops match the CPU kernels, broadcast and strided operands included", "[cuda]") {
  if (!test::cuda_device_present()) return;
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const double tol = t == DType::f32 ? 1e-6 : 1e-13;
    const Tensor a = randn({4, 1, 6}, 2, 0, 0.0, 2.0, t), b = randn({3, 1}, 3, 0, 0.0, 2.0, t);
    const Tensor pos = add(abs(a), 0.5);
    const Tensor ga = gpu(a), gb = gpu(b), gpos = gpu(pos);
    CHECK(rel_err(add(ga, gb), add(a, b)) <= tol);
    CHECK(rel_err(sub(ga, gb), sub(a, b)) <= tol);
    CHECK(rel_err(mul(ga, gb), mul(a, b)) <= tol);
    CHECK(rel_err(div(ga, gb), div(a, b)) <= tol);
    CHECK(rel_err(maximum(ga, gb), maximum(a, b)) <= tol);
    CHECK(rel_err(add(ga.transpose(0, 2), gb), add(a.transpose(0, 2), b)) <= tol);
    CHECK(rel_err(neg(ga), neg(a)) <= tol);
    CHECK(rel_err(exp(ga), exp(a)) <= 4 * tol);
    CHECK(rel_err(log(gpos), log(pos)) <= 4 * tol);
    CHECK(rel_err(sqrt(gpos), sqrt(pos)) <= tol);
    CHECK(rel_err(rsqrt(gpos), rsqrt(pos)) <= tol);
    CHECK(rel_err(tanh(ga), tanh(a)) <= 4 * tol);
    CHECK(rel_err(sigmoid(ga), sigmoid(a)) <= 4 * tol);
    CHECK(rel_err(relu(ga), relu(a)) == 0.0);
    CHECK(rel_err(abs(ga), abs(a)) == 0.0);
    CHECK(rel_err(gelu(ga, GeluApprox::tanh), gelu(a, GeluApprox::tanh)) <= 4 * tol);
    CHECK(rel_err(gelu(ga, GeluApprox::none), gelu(a, GeluApprox::none)) <= 4 * tol);
    CHECK(rel_err(silu(ga), silu(a)) <= 4 * tol);
    CHECK(rel_err(add(ga, 1.5), add(a, 1.5)) <= tol);
    CHECK(rel_err(mul(ga, -3.0), mul(a, -3.0)) <= tol);
    CHECK(rel_err(rsub(ga, 2.0), rsub(a, 2.0)) <= tol);
    CHECK(rel_err(rdiv(gpos, 2.0), rdiv(pos, 2.0)) <= tol);
    CHECK(rel_err(pow(gpos, 2.0), pow(pos, 2.0)) <= tol);
    CHECK(rel_err(pow(gpos, 1.7), pow(pos, 1.7)) <= 4 * tol);
    const Tensor dy = randn(a.shape(), 4, 0, 0.0, 1.0, t), gdy = gpu(dy);
    CHECK(rel_err(gelu_backward(ga, gdy, GeluApprox::tanh), gelu_backward(a, dy, GeluApprox::tanh)) <= 4 * tol);
    CHECK(rel_err(gelu_backward(ga, gdy, GeluApprox::none), gelu_backward(a, dy, GeluApprox::none)) <= 4 * tol);
    CHECK(rel_err(silu_backward(ga, gdy), silu_backward(a, dy)) <= 4 * tol);
    CHECK(rel_err(relu_backward(ga, gdy), relu_backward(a, dy)) == 0.0);
    {
      const Tensor x = randn({5, 7}, 6, 0, 0.0, 2.0, t).transpose(0, 1), bias = randn({5}, 7, 0, 0.0, 1.0, t);
      const Tensor g = randn({7, 5}, 8, 0, 0.0, 1.0, t);
      for (GeluApprox approx : {GeluApprox::tanh, GeluApprox::none}) {
        CHECK(rel_err(bias_gelu(gpu(x), gpu(bias), approx), bias_gelu(x, bias, approx)) <= 4 * tol);
        CHECK(rel_err(bias_gelu_backward(gpu(x), gpu(bias), gpu(g), approx), bias_gelu_backward(x, bias, g, approx)) <=
              4 * tol);
      }
    }
    // In place, broadcast source and a strided destination.
    Tensor acc = a.expand({4, 3, 6}).contiguous(), gacc = gpu(acc);
    add_(gacc, gb, 0.5);
    add_(acc, b, 0.5);
    CHECK(rel_err(gacc, acc) <= tol);
    mul_(gacc.transpose(0, 1), 3.0);
    mul_(acc.transpose(0, 1), 3.0);
    CHECK(rel_err(gacc, acc) <= tol);
  }
  const Tensor i = from_vector_i64({1, -2, 3, 4}, {2, 2});
  CHECK(max_abs_diff(host(add(gpu(i), gpu(i))), add(i, i)) == 0.0);
}

TEST_CASE("cuBLAS matmul and linear match the CPU GEMMs: transposes folded, batch dims broadcast", "[cuda]") {
  if (!test::cuda_device_present()) return;
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    // float32 GEMM-bound: within cuBLAS's fp32 accumulation (no TF32: cuBLAS's default math mode).
    const double tol = t == DType::f32 ? 1e-5 : 1e-12;
    const Tensor a = randn({2, 3, 17, 33}, 5, 0, 0.0, 1.0, t), b = randn({3, 33, 9}, 6, 0, 0.0, 1.0, t);
    CHECK(rel_err(matmul(gpu(a), gpu(b)), matmul(a, b)) <= tol);
    const Tensor bt = randn({9, 33}, 7, 0, 0.0, 1.0, t);
    CHECK(rel_err(matmul(gpu(a), gpu(bt).transpose(0, 1)), matmul(a, bt.transpose(0, 1))) <= tol);
    const Tensor at = randn({33, 17}, 8, 0, 0.0, 1.0, t);
    CHECK(rel_err(matmul(gpu(at).transpose(0, 1), gpu(b)), matmul(at.transpose(0, 1), b)) <= tol);
    const Tensor v = randn({33}, 9, 0, 0.0, 1.0, t);
    CHECK(rel_err(matmul(gpu(a), gpu(v)), matmul(a, v)) <= tol);
    Tensor out = randn({17, 9}, 10, 0, 0.0, 1.0, t), gout = gpu(out);
    matmul_into(gpu(a).select(0, 1).select(0, 2), gpu(b).select(0, 0), gout, 0.5, 2.0);
    matmul_into(a.select(0, 1).select(0, 2), b.select(0, 0), out, 0.5, 2.0);
    CHECK(rel_err(gout, out) <= tol);
    const Tensor x = randn({4, 5, 33}, 11, 0, 0.0, 1.0, t), w = randn({12, 33}, 12, 0, 0.0, 1.0, t),
                 bias = randn({12}, 13, 0, 0.0, 1.0, t);
    CHECK(rel_err(linear(gpu(x), gpu(w), gpu(bias)), linear(x, w, bias)) <= tol);
    CHECK(rel_err(linear(gpu(x), gpu(w), Tensor()), linear(x, w, Tensor())) <= tol);
  }
}

TEST_CASE("device ops refuse mixed devices and dtypes without a kernel, by name", "[cuda]") {
  if (!test::cuda_device_present()) return;
  const Tensor a = gpu(randn({4, 4}, 1));
  CHECK_THROWS_WITH(add(a, randn({4, 4}, 2)), Catch::Contains("is on cuda but b is on cpu"));
  CHECK_THROWS_WITH(exp(a.to(DType::bf16)), Catch::Contains("must be float32 or float64, not bfloat16"));
}

TEST_CASE("CUDA embedding, norms, cross-entropy and dropout match the CPU kernels", "[cuda]") {
  if (!test::cuda_device_present()) return;
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const double tol = t == DType::f32 ? 1e-5 : 1e-12;
    // Embedding: repeated ids, so the backward's per-id sums are exercised; int32 and int64 ids.
    const Tensor w = randn({11, 40}, 20, 0, 0.0, 1.0, t);
    const Tensor ids = from_vector_i64({3, 0, 3, 10, 7, 3, 0, 5}, {2, 4});
    for (const Tensor& id : {ids, ids.to(DType::i32)}) {
      CHECK(rel_err(embedding(gpu(w), gpu(id)), embedding(w, id)) == 0.0);
      const Tensor dy = randn({2, 4, 40}, 21, 0, 0.0, 1.0, t);
      // Same order of additions per row as the CPU: bitwise equal.
      CHECK(rel_err(embedding_backward(gpu(id), gpu(dy), 11), embedding_backward(id, dy, 11)) == 0.0);
    }
    CHECK_THROWS_WITH(embedding(gpu(w), gpu(from_vector_i64({11}, {1}))), Catch::Contains("out of range"));

    // Norms over 300 rows of 77 (several column-sum chunks), with and without affine parameters.
    const Tensor x = randn({3, 100, 77}, 22, 0, 0.5, 2.0, t), nw = randn({77}, 23, 0, 1.0, 0.3, t),
                 nb = randn({77}, 24, 0, 0.0, 0.3, t), dy = randn({3, 100, 77}, 25, 0, 0.0, 1.0, t);
    const NormResult c = layer_norm(x, nw, nb, 1e-5), g = layer_norm(gpu(x), gpu(nw), gpu(nb), 1e-5);
    CHECK(rel_err(g.y, c.y) <= tol);
    CHECK(rel_err(g.mean, c.mean) <= tol);
    CHECK(rel_err(g.rstd, c.rstd) <= tol);
    const NormGrads cg = layer_norm_backward(dy, x, nw, c.mean, c.rstd);
    const NormGrads gg = layer_norm_backward(gpu(dy), gpu(x), gpu(nw), g.mean, g.rstd);
    CHECK(rel_err(gg.dx, cg.dx) <= 10 * tol);
    CHECK(rel_err(gg.dweight, cg.dweight) <= 10 * tol);
    CHECK(rel_err(gg.dbias, cg.dbias) <= 10 * tol);
    const NormResult cr = rms_norm(x, nw, 1e-6), gr = rms_norm(gpu(x), gpu(nw), 1e-6);
    CHECK(rel_err(gr.y, cr.y) <= tol);
    const NormGrads crg = rms_norm_backward(dy, x, nw, cr.rstd),
                    grg = rms_norm_backward(gpu(dy), gpu(x), gpu(nw), gr.rstd);
    CHECK(rel_err(grg.dx, crg.dx) <= 10 * tol);
    CHECK(rel_err(grg.dweight, crg.dweight) <= 10 * tol);
    const NormResult cn = layer_norm(x, Tensor(), Tensor(), 1e-5), gn = layer_norm(gpu(x), Tensor(), Tensor(), 1e-5);
    CHECK(rel_err(gn.y, cn.y) <= tol);

    // Cross-entropy with an ignored target and a row of -inf but one logit.
    Tensor logits = randn({6, 1000}, 26, 0, 0.0, 3.0, t);
    const Tensor targets = from_vector_i64({5, -100, 999, 0, 17, 3}, {6});
    const CrossEntropyResult ce = cross_entropy(logits, targets), gce = cross_entropy(gpu(logits), gpu(targets));
    CHECK(gce.count == ce.count);
    CHECK(std::fabs(gce.loss.item() - ce.loss.item()) <= tol * std::fabs(ce.loss.item()));
    CHECK(rel_err(gce.lse, ce.lse) <= tol);
    CHECK(rel_err(cross_entropy_backward(gpu(logits), gpu(targets), gce.lse, 1.0, gce.count),
                  cross_entropy_backward(logits, targets, ce.lse, 1.0, ce.count)) <= tol);
    CHECK_THROWS_WITH(cross_entropy(gpu(logits), gpu(from_vector_i64({1, 2, 3, 4, 5, 1000}, {6}))),
                      Catch::Contains("target 1000 at row 5 is out of range"));

    // Dropout: the same Philox keep decisions as the CPU, so the same elements survive.
    const Tensor a = randn({5, 333}, 27, 0, 0.0, 1.0, t);
    CHECK(rel_err(dropout(gpu(a), 0.3, 99, 1234), dropout(a, 0.3, 99, 1234)) <= tol);
  }
}

TEST_CASE("CUDA reductions and softmax match the CPU kernels along any dims and strides", "[cuda]") {
  if (!test::cuda_device_present()) return;
  for (DType t : {DType::f32, DType::f64}) {
    INFO(dtype_name(t));
    const double tol = t == DType::f32 ? 1e-6 : 1e-13;
    const Tensor a = randn({5, 300, 7}, 30, 0, 0.0, 2.0, t), ga = gpu(a);
    CHECK(rel_err(sum(ga), sum(a)) <= tol);
    CHECK(rel_err(sum(ga, {1}), sum(a, {1})) <= tol);
    CHECK(rel_err(sum(ga, {0, 2}, true), sum(a, {0, 2}, true)) <= tol);
    CHECK(rel_err(mean(ga, {-1}), mean(a, {-1})) <= tol);
    CHECK(rel_err(sum(ga.transpose(0, 2), {1}), sum(a.transpose(0, 2), {1})) <= tol);
    CHECK(rel_err(sum_to(ga, {300, 1}), sum_to(a, {300, 1})) <= tol);
    CHECK(rel_err(max(ga, 1), max(a, 1)) == 0.0);
    CHECK(max_abs_diff(host(argmax(ga, 1)), argmax(a, 1)) == 0.0);
    // Ties and NaN: the first maximum wins, NaN counts as the maximum.
    const Tensor tie = from_vector({1, 3, 3, 2, 0, NAN, 5, NAN}, {2, 4}, t);
    CHECK(max_abs_diff(host(argmax(gpu(tie), 1)), argmax(tie, 1)) == 0.0);
    for (int dim : {0, 1, 2}) {
      INFO("dim " << dim);
      CHECK(rel_err(softmax(ga, dim), softmax(a, dim)) <= 4 * tol);
      CHECK(rel_err(log_softmax(ga, dim), log_softmax(a, dim)) <= 4 * tol);
      const Tensor y = softmax(a, dim), ly = log_softmax(a, dim), dy = randn(a.shape(), 31, 0, 0.0, 1.0, t);
      CHECK(rel_err(softmax_backward(gpu(y), gpu(dy), dim), softmax_backward(y, dy, dim)) <= 4 * tol);
      CHECK(rel_err(log_softmax_backward(gpu(ly), gpu(dy), dim), log_softmax_backward(ly, dy, dim)) <= 4 * tol);
    }
  }
}

TEST_CASE("CUDA comparisons, selection and shape copies match the CPU; attention runs the reference path", "[cuda]") {
  if (!test::cuda_device_present()) return;
  const Tensor a = randn({4, 6}, 40), b = randn({1, 6}, 41);
  const Tensor ga = gpu(a), gb = gpu(b);
  CHECK(max_abs_diff(host(gt(ga, gb)).to(DType::f32), gt(a, b).to(DType::f32)) == 0.0);
  CHECK(max_abs_diff(host(lt(ga, gb)).to(DType::f32), lt(a, b).to(DType::f32)) == 0.0);
  CHECK(max_abs_diff(host(eq(ga, ga)).to(DType::f32), eq(a, a).to(DType::f32)) == 0.0);
  const Tensor m = gt(a, b), gm = gpu(m);
  CHECK(max_abs_diff(host(logical_not(gm)).to(DType::f32), logical_not(m).to(DType::f32)) == 0.0);
  CHECK(max_abs_diff(host(logical_and(gm, gpu(lt(a, b)))).to(DType::f32), logical_and(m, lt(a, b)).to(DType::f32)) ==
        0.0);
  CHECK(rel_err(where(gm, ga, gb), where(m, a, b)) == 0.0);
  CHECK(rel_err(masked_fill(ga, gm, -7.0), masked_fill(a, m, -7.0)) == 0.0);
  CHECK(rel_err(cat({ga, gb, ga}, 0), cat({a, b, a}, 0)) == 0.0);
  const Tensor idx = from_vector_i64({3, 0, 3}, {3});
  CHECK(rel_err(index_select(ga, 0, gpu(idx)), index_select(a, 0, idx)) == 0.0);
  const Tensor src = randn({3, 6}, 42);
  CHECK(rel_err(index_add({4, 6}, 0, idx, gpu(src)), index_add({4, 6}, 0, idx, src)) <= 1e-6);

  // Attention on device tensors (GQA 4:2, causal, key padding, dropout): the composed reference
  // path, then the CUDA fused kernels, each equal to the CPU's reference kernel.
  const Tensor q = randn({2, 4, 5, 8}, 43), k = randn({2, 2, 7, 8}, 44), v = randn({2, 2, 7, 8}, 45);
  attn::AttentionOptions o;
  o.causal = true;
  o.kernel = attn::Kernel::reference;
  o.key_padding = from_vector({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}, {2, 7}, DType::f32).to(DType::boolean);
  o.dropout_p = 0.25;
  o.dropout_seed = 3;
  const Tensor cpu_out = attn::attention(q, k, v, o);
  attn::AttentionOptions og = o;
  og.key_padding = gpu(o.key_padding);
  CHECK(rel_err(attn::attention(gpu(q), gpu(k), gpu(v), og), cpu_out) <= 1e-5);
  og.kernel = attn::Kernel::fused;  // the CUDA fused kernels, with the same dropout draw
  CHECK(rel_err(attn::attention(gpu(q), gpu(k), gpu(v), og), cpu_out) <= 1e-5);
}

TEST_CASE("a tiny gpt2 and llama on the device: logits, loss, gradients and AdamW steps match the CPU", "[cuda]") {
  if (!test::cuda_device_present()) return;
  for (const std::string family : {"gpt2", "llama"}) {
    INFO(family);
    Config cfg;
    apply_override(cfg, "model.family=" + family);
    cfg.model.vocab_size = 37;
    cfg.model.n_layer = 2;
    cfg.model.n_head = 4;
    cfg.model.n_kv_head = 2;
    cfg.model.n_embd = 32;
    cfg.model.block_size = 16;
    cfg.model.dropout = 0.1;  // the same Philox masks on both devices
    auto on_cpu = train::build_model(cfg, 37), on_gpu = train::build_model(cfg, 37);
    on_cpu->init_weights(5);
    on_gpu->init_weights(5);
    on_gpu->to(Device::cuda);
    REQUIRE(on_gpu->device() == Device::cuda);
    auto params_of = [](const nn::DecoderModel& m) {
      std::vector<train::OptimParam> ps;
      for (const auto& p : m.named_parameters()) ps.push_back({p.name, p.tensor, p.decay});
      return ps;
    };
    train::AdamW opt_cpu(params_of(*on_cpu), {}), opt_gpu(params_of(*on_gpu), {});
    std::vector<int64_t> ids(2 * 16), tgt(2 * 16);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7 + 3) % 37);
      tgt[i] = static_cast<int64_t>((i * 5 + 1) % 37);
    }
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      std::vector<double> losses;
      for (nn::DecoderModel* m : {on_cpu.get(), on_gpu.get()}) {
        nn::ForwardArgs a;
        a.ids = from_vector_i64(ids, {2, 16});  // host ids: forward moves them to the model's device
        a.rng = {9, static_cast<uint64_t>(step), 0};
        Tensor logits = m->forward(a);
        CHECK(logits.device() == m->device());
        Tensor loss = ag::cross_entropy(ag::reshape(logits, {-1, 37}), from_vector_i64(tgt, {32}).to(m->device()));
        losses.push_back(loss.item());
        autograd::zero_grad(m->parameters());
        autograd::backward(loss);
      }
      CHECK(std::fabs(losses[1] - losses[0]) <= 1e-5 * std::fabs(losses[0]));
      const auto pc = on_cpu->named_parameters(), pg = on_gpu->named_parameters();
      for (size_t i = 0; i < pc.size(); ++i) {
        INFO(pc[i].name);
        CHECK(rel_err(pg[i].tensor.grad(), pc[i].tensor.grad()) <= 1e-4);
        // AdamW's first steps move each weight by about lr·sign(g) whatever |g| is, so gradients
        // that are zero up to rounding (gpt2's key bias: softmax ignores a shift shared by all
        // keys) would step in directions that differ between the devices. The step is compared
        // on the same gradients: the CPU's, copied to the device.
        copy_(pg[i].tensor.grad(), pc[i].tensor.grad());
      }
      opt_cpu.step(1e-2, 1.0f);
      opt_gpu.step(1e-2, 1.0f);
      for (size_t i = 0; i < pc.size(); ++i) CHECK(rel_err(pg[i].tensor, pc[i].tensor) <= 1e-5);
    }
  }
}

TEST_CASE("CUDA fused attention matches the CPU fused kernel: masks, GQA, ALiBi, dropout, gradients", "[cuda]") {
  if (!test::cuda_device_present()) return;
  struct Case {
    const char* name;
    int64_t Hq, Hkv, Nq, Nk, D;
    bool causal;
    int64_t window;
    bool padding, lengths, segments, alibi;
    double dropout;
    DType dtype = DType::f32;
  };
  const std::vector<Case> cases = {
      {"causal MHA", 4, 4, 33, 33, 16, true, 0, false, false, false, false, 0.0},
      {"causal GQA 4:2, decode-shaped Nq < Nk", 4, 2, 5, 40, 32, true, 0, false, false, false, false, 0.0},
      {"window 7, MQA", 4, 1, 30, 30, 24, true, 7, false, false, false, false, 0.0},
      {"left padding (fully masked rows)", 2, 2, 12, 12, 8, true, 0, true, false, false, false, 0.0},
      {"key lengths, no causal", 2, 1, 9, 14, 8, false, 0, false, true, false, false, 0.0},
      {"packed segments + ALiBi", 4, 2, 20, 20, 16, true, 0, false, false, true, true, 0.0},
      {"dropout 0.2, head dim 100", 2, 2, 17, 17, 100, true, 0, false, false, false, false, 0.2},
      // The widest rows (8 per lane) and the smallest shared-memory tile (8 float64 rows).
      {"float64, head dim 256, window 5 + key lengths (fully masked rows)", 2, 1, 19, 23, 256, true, 5, false, true,
       false, false, 0.0, DType::f64},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const int64_t B = 2;
    Tensor q = randn({B, c.Hq, c.Nq, c.D}, 50, 0, 0.0, 1.0, c.dtype),
           k = randn({B, c.Hkv, c.Nk, c.D}, 51, 0, 0.0, 1.0, c.dtype),
           v = randn({B, c.Hkv, c.Nk, c.D}, 52, 0, 0.0, 1.0, c.dtype);
    attn::AttentionOptions o;
    o.causal = c.causal;
    o.window = c.window;
    if (c.padding) {
      std::vector<double> kp(static_cast<size_t>(B * c.Nk), 1.0);
      for (int64_t j = 0; j < 4; ++j) kp[static_cast<size_t>(c.Nk + j)] = 0.0;  // batch 1: 4 pads on the left
      o.key_padding = from_vector(kp, {B, c.Nk}).to(DType::boolean);
    }
    if (c.lengths) o.key_lengths = {c.Nk, 5};
    if (c.segments) {
      std::vector<int64_t> seg(static_cast<size_t>(B * c.Nk));
      for (size_t t = 0; t < seg.size(); ++t) seg[t] = static_cast<int64_t>((t % static_cast<size_t>(c.Nk)) / 7);
      o.segment_ids = from_vector_i64(seg, {B, c.Nk});
    }
    if (c.alibi) o.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    if (c.dropout > 0) {
      o.dropout_p = c.dropout;
      o.dropout_seed = 77;
      o.dropout_offset = 5;
    }
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    const Tensor out = attn::attention(q, k, v, o);
    const Tensor dout = randn(out.shape(), 53, 0, 0.0, 1.0, c.dtype);
    autograd::backward(out, dout);

    Tensor gq = gpu(q.clone()), gk = gpu(k.clone()), gv = gpu(v.clone());
    for (Tensor* t : {&gq, &gk, &gv}) t->set_requires_grad(true);
    attn::AttentionOptions og = o;
    if (o.key_padding.defined()) og.key_padding = gpu(o.key_padding);
    if (o.segment_ids.defined()) og.segment_ids = gpu(o.segment_ids);
    const Tensor gout = attn::attention(gq, gk, gv, og);
    REQUIRE(gout.grad_fn());
    CHECK(std::string(gout.grad_fn()->name()) == "CudaAttentionBackward");
    autograd::backward(gout, gpu(dout));
    CHECK(rel_err(gout, out) <= 1e-5);
    CHECK(rel_err(gq.grad(), q.grad()) <= 1e-4);
    CHECK(rel_err(gk.grad(), k.grad()) <= 1e-4);
    CHECK(rel_err(gv.grad(), v.grad()) <= 1e-4);
  }
  // The untiled kernels of attention/cuda/dev/, same arithmetic per row, are compared with these
  // directly in test_cuda_attention_tiles.cpp.
}

TEST_CASE("attention_packed on the device: its own node, equal to attention on the split views, fp32 and bf16",
          "[cuda]") {
  if (!test::cuda_device_present()) return;
  struct Case {
    int64_t hq, hkv, D;
    double dropout;
    bool bf16;  // autocast: the tensor-core kernels (D 64)
  };
  for (const Case c : {Case{4, 4, 16, 0.0, false}, Case{4, 2, 24, 0.2, false}, Case{2, 1, 64, 0.0, true}}) {
    INFO("Hq=" << c.hq << " Hkv=" << c.hkv << " D=" << c.D << " dropout " << c.dropout << (c.bf16 ? " bf16" : ""));
    const int64_t B = 2, N = 70, H = c.hq + 2 * c.hkv;
    const Tensor qkv0 = randn({B, N, H, c.D}, 60 + c.hq, 0, 0.0, 1.0), dout = randn({B, N, c.hq, c.D}, 61, 0, 0.0, 1.0);
    attn::AttentionOptions o;
    o.causal = true;
    o.dropout_p = c.dropout;
    o.dropout_seed = 3;
    o.dropout_offset = 9;
    // packed(dev, split): out and dqkv from attention_packed, or from attention on the split views.
    auto run = [&](Device dev, bool split) {
      autograd::AutocastGuard autocast(c.bf16);
      Tensor qkv = qkv0.to(dev);
      qkv.set_requires_grad(true);
      Tensor out;
      if (split) {
        auto heads = [&](int64_t s0, int64_t n) { return ag::transpose(ag::narrow(qkv, 2, s0, n), 1, 2); };
        out = ag::transpose(attn::attention(heads(0, c.hq), heads(c.hq, c.hkv), heads(c.hq + c.hkv, c.hkv), o), 1, 2);
      } else {
        out = attn::attention_packed(qkv, c.hq, c.hkv, o);
        CHECK(out.is_contiguous());
        if (dev == Device::cuda && !c.bf16) {  // (under autocast the output's node rounds the gradient)
          REQUIRE(out.grad_fn());
          CHECK(std::string(out.grad_fn()->name()) == "CudaPackedAttentionBackward");
        }
      }
      autograd::backward(out, dout.to(dev));
      return std::make_pair(host(out), host(qkv.grad()));
    };
    const auto [p_out, p_grad] = run(Device::cuda, false);
    const auto [s_out, s_grad] = run(Device::cuda, true);
    const auto [c_out, c_grad] = run(Device::cpu, false);
    CHECK(max_abs_diff(p_out, s_out) == 0.0);
    CHECK(max_abs_diff(p_grad, s_grad) == 0.0);
    // Against the CPU: float32 kernels to rounding; the tensor-core ones to bf16's precision.
    CHECK(rel_err(gpu(p_out), c_out) <= (c.bf16 ? 2e-2 : 1e-5));
    CHECK(rel_err(gpu(p_grad), c_grad) <= (c.bf16 ? 5e-2 : 1e-4));
  }
}

TEST_CASE("KV-cached decoding on the device reproduces the device's full forward", "[cuda]") {
  if (!test::cuda_device_present()) return;
  Config cfg;
  cfg.model.family = nn::Family::llama;  // RoPE at absolute positions, GQA
  cfg.model.vocab_size = 29;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.n_kv_head = 2;
  cfg.model.n_embd = 32;
  cfg.model.block_size = 16;
  auto m = train::build_model(cfg, 29);
  m->init_weights(8);
  m->eval();
  m->to(Device::cuda);
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> ids(12);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 11 + 2) % 29);
  nn::ForwardArgs full;
  full.ids = from_vector_i64(ids, {1, 12});
  const Tensor want = m->forward(full);
  nn::ModelCache cache = m->make_cache(1, 12);
  std::vector<Tensor> parts;
  for (int64_t t = 0; t < 12; t += 5) {
    const int64_t n = std::min<int64_t>(5, 12 - t);
    nn::ForwardArgs a;
    a.ids = from_vector_i64(std::vector<int64_t>(ids.begin() + t, ids.begin() + t + n), {1, n});
    a.cache = &cache;
    parts.push_back(m->forward(a));
  }
  CHECK(rel_err(cat(parts, 1), host(want)) <= 1e-5);
}

TEST_CASE("the global gradient norm of device tensors equals the host's", "[cuda]") {
  if (!test::cuda_device_present()) return;
  const std::vector<Tensor> host_ts = {randn({300, 7}, 60), randn({5}, 61),
                                       randn({2, 2, 2}, 62, 0, 0.0, 1.0, DType::f64)};
  std::vector<Tensor> dev_ts;
  for (const Tensor& t : host_ts) dev_ts.push_back(gpu(t));
  const double want = train::global_norm(host_ts), got = train::global_norm(dev_ts);
  CHECK(std::fabs(got - want) <= 1e-12 * want);
}

TEST_CASE("backward from a device scalar, and from a host gradient for a device root", "[cuda]") {
  if (!test::cuda_device_present()) return;
  Tensor x = gpu(randn({3, 4}, 70));
  x.set_requires_grad(true);
  autograd::backward(ag::sum(ag::mul(x, x)));  // seed of ones made on the root's device
  CHECK(rel_err(x.grad(), mul(host(x), 2.0)) <= 1e-6);
  Tensor y = gpu(randn({2, 2}, 71));
  y.set_requires_grad(true);
  autograd::backward(ag::mul(y, 3.0), full({2, 2}, 1.0));  // host gradient moved to the device
  CHECK(rel_err(y.grad(), full({2, 2}, 3.0)) <= 1e-6);
}

TEST_CASE("max's gradient on the device goes to the first maximum, as on the host", "[cuda]") {
  if (!test::cuda_device_present()) return;
  const Tensor a = from_vector({1, 5, 5, 2, 7, 0}, {2, 3});
  Tensor h = a.clone(), d = gpu(a);
  h.set_requires_grad(true);
  d.set_requires_grad(true);
  autograd::backward(ag::sum(ag::max(h, 1)));
  autograd::backward(ag::sum(ag::max(d, 1)));
  CHECK(rel_err(d.grad(), h.grad()) == 0.0);
}

TEST_CASE("bf16 autocast on the device (tensor-core GEMMs) equals the CPU's bf16 autocast", "[cuda]") {
  if (!test::cuda_device_present()) return;
  Tensor x = randn({64, 96}, 80), w = randn({48, 96}, 81), b = randn({48}, 82);
  Tensor gx = gpu(x), gw = gpu(w), gb = gpu(b);
  for (Tensor* t : {&x, &w, &b, &gx, &gw, &gb}) t->set_requires_grad(true);
  const Tensor dy = randn({64, 48}, 83);
  {
    autograd::AutocastGuard bf16(true);
    autograd::backward(ag::linear(x, w, b), dy);
    autograd::backward(ag::linear(gx, gw, gb), gpu(dy));
    // Batched matmul with a transposed operand, as attention's reference path uses.
    const Tensor a = randn({3, 16, 32}, 84), c = randn({3, 24, 32}, 85);
    CHECK(rel_err(ag::matmul(gpu(a), gpu(c).transpose(1, 2)), ag::matmul(a, c.transpose(1, 2))) <= 1e-5);
  }
  CHECK(rel_err(ag::linear(gx, gw, gb), ag::linear(x, w, b)) <= 1e-5);  // outside: float32 both
  CHECK(rel_err(gx.grad(), x.grad()) <= 1e-5);
  CHECK(rel_err(gw.grad(), w.grad()) <= 1e-5);
  CHECK(rel_err(gb.grad(), b.grad()) <= 1e-5);
}
