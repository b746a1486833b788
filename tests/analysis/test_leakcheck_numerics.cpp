// leakcheck's training-vs-inference consistency checks (analysis/leakcheck.h) under both numerics
// modes: under numerics = invariant every one measures exactly 0 on models with ragged sizes and
// fails on a planted fault, even one far below the float32 rounding bound; under standard the
// same checks measure the nonzero rounding gap and pass their tolerance; the report and --json
// carry both modes side by side.
#include <catch2/catch.hpp>

#include <omp.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "analysis/leakcheck.h"
#include "analysis/leakcheck_internal.h"
#include "analysis/png.h"
#include "attention/attention.h"
#include "autograd/grad_mode.h"
#include "model_fixtures.h"
#include "tensor/cpu/gemm/gemm.h"
#include "tensor/numerics.h"
#include "tensor/ops.h"

using namespace qkv;
namespace fs = std::filesystem;

namespace {

// gpt2, n_embd 100 (head size 25): every kernel meets its ragged edges. Dropout on, so the
// trainer_vs_sampler check must zero it to compare.
std::unique_ptr<nn::DecoderModel> gpt2_odd(int64_t n_embd = 100, int64_t ffn = 300) {
  nn::ModelConfig c = test::ragged_gpt2(ffn, /*block_size=*/40);
  c.n_embd = n_embd;
  c.dropout = 0.1;
  c.attn_dropout = 0.1;
  return test::eval_model(c, 21);
}

// llama: RoPE, GQA 10:5, RMSNorm, SwiGLU, n_embd 100 (head size 10), ffn 172.
std::unique_ptr<nn::DecoderModel> llama_odd() {
  nn::ModelConfig c = test::llama_family(test::ragged_gpt2(/*ffn_hidden=*/172, /*block_size=*/40));
  c.n_head = 10;
  c.n_kv_head = 5;
  return test::eval_model(c, 22);
}

const analysis::LeakCheck& find(const std::vector<analysis::LeakCheck>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return c;
  FAIL("no check named " << name);
  return v.front();
}

void expect_exact(const analysis::LeakCheck& c, int64_t positions) {
  INFO(c.name << " = " << c.value << " (threshold " << c.threshold << "): " << c.detail);
  CHECK(c.value == 0.0);
  CHECK(c.threshold == 0.0);
  CHECK(c.pass);
  CHECK(c.diverges_at == -1);
  CHECK(static_cast<int64_t>(c.per_position.size()) == positions);
  for (double v : c.per_position) CHECK(v == 0.0);
}

// The library's attention with its output scaled by (1 + 2^-20) whenever the call sees more keys
// than queries (a KV-cache decode or a later prefill chunk): a decode path off by about one part
// in a million, far inside the float32 rounding bound the standard mode must allow.
class DecodeSkew : public nn::AttentionOps {
 public:
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& o) const override {
    const Tensor y = AttentionOps::attention(q, k, v, o);
    return k.size(2) > q.size(2) ? mul(y, 1.0 + std::ldexp(1.0, -20)) : y;
  }
};

// The library's attention plus 1e-6 when the call holds more than one row (a batch-dependent
// kernel), or when more than one OpenMP thread is allowed (a thread-dependent one).
class BatchOrThreadSkew : public nn::AttentionOps {
 public:
  explicit BatchOrThreadSkew(bool threads) : threads_(threads) {}
  // The batch-dependent skew sits in RoPE, which sees the whole batch: under invariant numerics a
  // padded batch's attention runs one document per call.
  Tensor rope(const Tensor& x, const Tensor& positions, double theta, int64_t cached) const override {
    const Tensor y = AttentionOps::rope(x, positions, theta, cached);
    return !threads_ && x.size(0) > 1 ? add(y, 1e-6) : y;
  }
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& o) const override {
    const Tensor y = AttentionOps::attention(q, k, v, o);
    return threads_ && omp_get_max_threads() > 1 ? add(y, 1e-6) : y;
  }

 private:
  bool threads_;
};

}  // namespace

namespace {
// The exact consistency checks on tiny gpt2 and llama models (run under the caller's numerics and
// autocast settings; bf16_models: the models themselves set to bf16 inference, as
// load_for_inference sets a model trained in bf16).
void expect_invariant_consistency(bool bf16_models = false) {
  analysis::LeakCheckOptions o;
  for (const auto& model : {gpt2_odd(), llama_odd()}) {
    INFO(nn::family_name(model->config().family));
    model->set_bf16_autocast(bf16_models);
    const int64_t L = model->config().block_size;
    const auto checks = analysis::run_consistency_checks(*model, o);
    CHECK(checks.size() == analysis::consistency_check_names().size());
    for (const char* name : {"kv_decode", "chunked_prefill", "batch_composition", "thread_count", "trainer_vs_sampler"})
      expect_exact(find(checks, name), name == std::string("batch_composition") ? L - L / 4 : L);
    expect_exact(find(checks, "batched_generation"), L / 2);  // one position per generated token
    const auto& trainer = find(checks, "trainer_vs_sampler");
    if (model->config().dropout > 0) CHECK(trainer.detail.find("set to 0") != std::string::npos);
    CHECK(find(checks, "chunked_prefill").detail.find("chunks of 1: 0, 7: 0, whole (40): 0") != std::string::npos);
    // Generation through the cache and by full recompute: the same tokens, with no tie excuse.
    const auto tvi = analysis::check_train_vs_inference(*model, o);
    CHECK(find(tvi, "greedy_generation").value == 0.0);
  }
}
}  // namespace

TEST_CASE("numerics = invariant: decode, chunks, batch, threads and the trainer give the same bits",
          "[leakcheck][invariant][exact][long]") {
  const NumericsGuard mode(Numerics::invariant);
  expect_invariant_consistency();
}

// bf16 autocast (train.dtype = "bf16"): the operands of every product are rounded to bf16 and the
// products summed in float32 in the invariant kernels' one order, so the promise holds in bf16 too.
TEST_CASE("numerics = invariant under bf16 autocast: decode, chunks, batch, threads and the trainer give the same bits",
          "[leakcheck][invariant][bf16][exact][long]") {
  const NumericsGuard mode(Numerics::invariant);
  SECTION("autocast on around the checks") {
    const autograd::AutocastGuard autocast(true);
    expect_invariant_consistency();
  }
  SECTION("models set to bf16 inference (decode from bf16 panels)") { expect_invariant_consistency(true); }
}

TEST_CASE("a model set to bf16 inference computes its forward under bf16 autocast", "[bf16][exact]") {
  const auto model = gpt2_odd();
  const std::vector<int32_t> ids = test::stride_tokens(12, model->config().vocab_size);
  auto logits = [&] {
    nn::ForwardArgs args;
    args.ids = from_vector_i64(std::vector<int64_t>(ids.begin(), ids.end()), {1, 12});
    return model->forward(args).contiguous();
  };
  const Tensor plain = logits();
  Tensor under;
  {
    const autograd::AutocastGuard autocast(true);
    under = logits();
  }
  model->set_bf16_autocast(true);
  const Tensor flagged = logits();
  REQUIRE(std::memcmp(flagged.data<float>(), under.data<float>(), under.numel() * sizeof(float)) == 0);
  REQUIRE(std::memcmp(flagged.data<float>(), plain.data<float>(), plain.numel() * sizeof(float)) != 0);
}

TEST_CASE("numerics = invariant: padded and packed sequences give the same bits as alone",
          "[leakcheck][invariant][exact][long]") {
  // Right padding is exact with the invariant kernels; left padding and packing need attention per
  // document (nn/transformer.cpp under numerics = invariant).
  const NumericsGuard mode(Numerics::invariant);
  analysis::LeakCheckOptions o;
  for (const auto& model : {gpt2_odd(), llama_odd()}) {
    INFO(nn::family_name(model->config().family));
    const auto checks = analysis::run_consistency_checks(*model, o);
    for (const char* name : {"padding_invariance", "packing_invariance"}) {
      const auto& c = find(checks, name);
      INFO(name << " = " << c.value << ": " << c.detail);
      CHECK(c.value == 0.0);
      CHECK(c.threshold == 0.0);
      CHECK(c.diverges_at == -1);
    }
  }
}

TEST_CASE("numerics = invariant: linear attention's recurrent decode keeps a rounding bound",
          "[leakcheck][invariant][exact]") {
  // The recurrent state sums S = Σ φ(k) vᵀ one token at a time, the chunked form chunk by chunk:
  // two orders of one sum, so only the whole-sequence comparisons can be exact.
  const NumericsGuard mode(Numerics::invariant);
  auto base = llama_odd();
  nn::ModelConfig c = base->config();
  c.attention_pattern = nn::AttentionPattern::linear;
  c.linear_chunk = 4;
  c.linear_features = c.head_dim();
  nn::DecoderModel model(c);
  model.init_weights(23);
  model.eval();
  const auto checks = analysis::run_consistency_checks(model, {});
  for (const char* name : {"kv_decode", "chunked_prefill", "trainer_vs_sampler"}) {
    const auto& k = find(checks, name);
    INFO(name << " = " << k.value << " (threshold " << k.threshold << "): " << k.detail);
    CHECK(k.pass);
    CHECK(k.threshold > 0);
    CHECK(k.detail.find("recurrent state") != std::string::npos);
  }
  for (const char* name : {"batch_composition", "thread_count"})
    expect_exact(find(checks, name), name == std::string("thread_count") ? 40 : 30);
}

TEST_CASE("numerics = standard: the consistency checks measure a nonzero rounding gap within tolerance",
          "[leakcheck][invariant][long]") {
  // Wide enough that qkv's GEMV (decoding) and OpenBLAS's GEMM (the whole sequence) sum in other
  // orders. (qkv's own GEMM kernels sum each element in one order fixed by k, so on them these gaps
  // can be 0: the BLAS is forced here to show the tolerance path at work.)
  const auto model = gpt2_odd(256, 1024);
  const NumericsGuard mode(Numerics::standard);
  const cpu::GemmKernelGuard gemm(cpu::GemmKernel::blas);
  const auto checks = analysis::run_consistency_checks(*model, {});
  const auto &kv = find(checks, "kv_decode"), &chunks = find(checks, "chunked_prefill");
  INFO("kv_decode " << kv.value << " (" << kv.detail << "); chunked_prefill " << chunks.value << " (" << chunks.detail
                    << ")");
  CHECK(std::max(kv.value, chunks.value) > 0);
  for (const auto& c : checks) {
    INFO(c.name << " = " << c.value << " (threshold " << c.threshold << "): " << c.detail);
    CHECK(c.pass);
    CHECK(c.threshold > 0);  // the rounding bound, not exactness
    CHECK(c.detail.find("numerics = standard") != std::string::npos);
  }
}

TEST_CASE("numerics = invariant: the exact checks fail on planted faults, even ones inside rounding",
          "[leakcheck][invariant][exact][long]") {
  analysis::LeakCheckOptions o;
  SECTION("the self-test's planted faults") {
    const NumericsGuard mode(Numerics::invariant);
    struct Expect {
      analysis::Fault fault;
      bool llama;
    };
    for (const Expect e :
         {Expect{analysis::Fault::top_left_causal, false}, Expect{analysis::Fault::rope_cache_relative, true}}) {
      auto model = e.llama ? llama_odd() : gpt2_odd();
      const analysis::PlantedFault planted(*model, e.fault);
      const auto checks = analysis::run_consistency_checks(*model, o);
      for (const char* name : {"kv_decode", "chunked_prefill", "trainer_vs_sampler"}) {
        const auto& c = find(checks, name);
        INFO(analysis::fault_name(e.fault) << ": " << name << " = " << c.value << " (" << c.detail << ")");
        CHECK_FALSE(c.pass);
        CHECK(c.value > 1e-3);
      }
    }
  }
  SECTION("a decode path off by one part in a million: inside the standard tolerance, caught exactly") {
    auto model = llama_odd();
    model->set_attention_ops(std::make_shared<const DecodeSkew>());
    for (const Numerics mode : {Numerics::standard, Numerics::invariant}) {
      const NumericsGuard guard(mode);
      const auto checks = analysis::run_consistency_checks(*model, o);
      for (const char* name : {"kv_decode", "chunked_prefill", "trainer_vs_sampler"}) {
        const auto& c = find(checks, name);
        INFO((mode == Numerics::invariant ? "invariant " : "standard ")
             << name << " = " << c.value << " (threshold " << c.threshold << ")");
        CHECK(c.value > 0);
        CHECK(c.pass == (mode == Numerics::standard));
      }
      // The whole-sequence paths never see the skew.
      if (mode == Numerics::invariant) CHECK(find(checks, "batch_composition").value == 0.0);
    }
  }
  SECTION("a batch-dependent and a thread-dependent attention") {
    const NumericsGuard mode(Numerics::invariant);
    for (const bool threads : {false, true}) {
      auto model = llama_odd();
      model->set_attention_ops(std::make_shared<const BatchOrThreadSkew>(threads));
      const int before = omp_get_max_threads();
      const auto checks = analysis::run_consistency_checks(*model, o);
      CHECK(omp_get_max_threads() == before);  // thread_count restores the count
      const auto& caught = find(checks, threads ? "thread_count" : "batch_composition");
      INFO(caught.name << " = " << caught.value << ": " << caught.detail);
      CHECK_FALSE(caught.pass);
      CHECK(caught.value > 1e-7);
      if (!threads) CHECK_FALSE(find(checks, "trainer_vs_sampler").pass);  // 4 training rows vs 1 decoded
    }
  }
}

TEST_CASE("the report and --json put both numerics modes side by side", "[leakcheck][invariant][long]") {
  const auto model = gpt2_odd(256, 1024);
  const NumericsGuard process_mode(Numerics::invariant);
  const cpu::GemmKernelGuard gemm(cpu::GemmKernel::blas);  // a nonzero standard gap (case above)
  const analysis::NumericsComparison cmp = analysis::compare_numerics_modes(*model, {});
  CHECK(numerics() == Numerics::invariant);  // the process's mode is restored
  const auto& names = analysis::consistency_check_names();
  REQUIRE(cmp.standard.size() == names.size());
  REQUIRE(cmp.invariant.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    CHECK(cmp.standard[i].name == names[i]);
    CHECK(cmp.invariant[i].name == names[i]);
    CHECK(cmp.invariant[i].threshold == 0.0);
    CHECK(cmp.standard[i].threshold > 0.0);
  }
  CHECK(cmp.invariant[0].value == 0.0);  // kv_decode
  CHECK(std::max(cmp.standard[0].value, cmp.standard[1].value) > 0.0);

  const nlohmann::json j = analysis::leakcheck_json({}, nullptr, &cmp);
  REQUIRE(j["consistency"].size() == names.size());
  const auto& kv = j["consistency"][0];
  CHECK(kv["name"] == "kv_decode");
  CHECK(kv["invariant"]["max_abs_delta"] == 0.0);
  CHECK(kv["invariant"]["diverges_at"].is_null());
  CHECK(kv["standard"]["max_abs_delta"].get<double>() == cmp.standard[0].value);
  CHECK(kv["standard"]["per_position"].size() == 40);
  CHECK_FALSE(analysis::leakcheck_json({}, nullptr).contains("consistency"));

  const std::string table = analysis::numerics_comparison_table(cmp);
  CHECK(table.find("trainer_vs_sampler") != std::string::npos);

  const fs::path dir = fs::temp_directory_path() / ("qkv_leakcheck_numerics_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  analysis::LeakCheckReport r;
  r.subject = "odd gpt2";
  analysis::write_leakcheck_report(dir.string(), r, nullptr, *model, {1, 2, 3, 4, 5, 6}, nullptr, &cmp);
  std::ifstream in(dir / "index.html");
  const std::string html((std::istreambuf_iterator<char>(in)), {});
  CHECK(html.find("Training vs inference consistency") != std::string::npos);
  for (const auto& name : names) {
    const std::string file = "consistency_" + name + ".png";
    INFO(file);
    CHECK(html.find(file) != std::string::npos);
    const analysis::Image img = analysis::read_png((dir / file).string());
    CHECK(img.width() == 640);
    // Both series are drawn: the standard gap's blue and the invariant zeros' orange on the floor.
    int blue = 0, orange = 0;
    for (int y = 0; y < img.height(); ++y)
      for (int x = 0; x < img.width(); ++x) {
        const analysis::Rgb p = img.get(x, y);
        blue += p == analysis::Rgb{31, 119, 180};
        orange += p == analysis::Rgb{230, 110, 0};
      }
    CHECK(blue > 20);
    CHECK(orange > 20);
  }
  fs::remove_all(dir);
}
