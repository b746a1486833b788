// Whole-model gradient check (`qkv gradcheck --config FILE`): the model a config describes, built
// in float64, its training loss on a seeded batch, and the backward's gradient compared with
// central differences of that loss.
//
// Legend: θ all parameters, L(θ) the mean cross-entropy of the batch (batch_loss, the training
// loss), g = ∇L(θ) from one backward, ε the step.
//   direction checks   K random directions v over ALL parameters at once (v ~ N(0, 1) per element,
//                      scaled to ‖v‖ = 1): analytic vᵀg against numeric (L(θ+εv) − L(θ−εv)) / 2ε
//                      (PyTorch's "fast" gradcheck: one scalar per direction, every parameter in it)
//   element checks     in every parameter tensor, its element of largest |g| plus E − 1 elements
//                      drawn uniformly (seeded): g_e against (L(θ+εe) − L(θ−εe)) / 2ε
//   determinism        L evaluated twice must be bitwise equal: dropout masks are a pure function of
//                      (seed, step, site) (nn::RngContext), so the training forward with dropout is a
//                      deterministic, differentiable function of θ; anything else fails here first
// A comparison passes when |analytic − numeric| <= atol + rtol·|numeric|. Its relative error is
// |analytic − numeric| / max(|analytic|, |numeric|), counted into the worst (max_rel_err) only when
// |numeric| > atol or the error exceeds atol (PyTorch's rule, as autograd/gradcheck.h): below the
// absolute floor a ratio measures finite-difference noise, not the backward.
//
// A comparison that fails at ε is repeated at ε/10, then ε/100, and passes if one of them does: a
// ReLU kink (or any non-smooth point) crossed within ±ε spoils one step and rarely the next, while a
// wrong backward fails at every step. A comparison that fails at all three reports its error at ε.
//
// Tolerance (defaults): ε = 1e-5, atol = 1e-8, rtol = 1e-5. The numeric derivative's error is
// rounding ≈ c·u·|L|/ε (u = 1.1e-16, L ≈ log V ≈ 4-7) plus truncation ≈ ε²·|L'''|/6. Measured on
// the shipped configs (shrunk): ~3e-10 absolute at ε = 1e-6 whatever the gradient's size
// (rounding), ~3e-11 at ε = 1e-5 for gradients below 1e-2 and up to 5e-10 (5e-9 relative) on the
// largest ones (truncation), so ε = 1e-5 balances the two. atol is 5x the worst absolute error a
// correct backward showed on any shipped config or model option (2e-9; README lists them), and
// rtol is 1000x below a 1% bug (the planted dK x 1.01 measures 0.0099 relative on every key
// weight, tests/nn/test_model_gradcheck.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "nn/transformer.h"
#include "train/config.h"

namespace qkv::analysis {

struct ModelGradcheckOptions {
  int directions = 4;    // K
  int elements = 4;      // E per parameter tensor (fewer when the tensor is smaller)
  uint64_t seed = 1234;  // batch, dropout masks, directions and element sample
  double eps = 1e-5, rtol = 1e-5, atol = 1e-8;
  int retries = 2;   // a failing comparison is repeated at eps/10, then eps/100
  std::string only;  // if set, a regular expression: element checks only on tensors whose name matches
};

struct ElementCheck {
  int64_t index = 0;  // flat, row-major
  double analytic = 0, numeric = 0;
  double step = 0;  // the ε of the attempt kept
};

// One parameter tensor's element checks.
struct ParamGradcheck {
  std::string name;
  Shape shape;
  std::vector<ElementCheck> elements;
  double max_abs_err = 0, max_rel_err = 0;
  int64_t worst = -1;  // index into elements of the largest |analytic − numeric|
  bool pass = true;
};

struct DirectionCheck {
  double analytic = 0, numeric = 0, step = 0, abs_err = 0, rel_err = 0;
  bool pass = true;
};

struct ModelGradcheckReport {
  double loss = 0, loss_again = 0;           // L(θ) and its second evaluation
  bool deterministic = false;                // loss == loss_again, bitwise
  std::string attention_kernel;              // what ran attention, in words
  std::vector<std::string> attention_nodes;  // attention nodes of the recorded graph, e.g.
                                             // PackedAttentionBackward (none inside recomputed blocks)
  std::vector<DirectionCheck> directions;
  std::vector<ParamGradcheck> params;
  int64_t evaluations = 0;  // loss evaluations (forwards) in all
  int64_t retried = 0;      // comparisons that failed at eps and were repeated with a smaller step
  bool pass = false;        // deterministic and every check passed
};

// The model of `cfg` initialised by `init_weights(seed)` (float32 draws) with every parameter then
// converted to float64 in place. Runs on the CPU in training mode (dropout on, masks fixed by the
// RngContext the caller passes each evaluation).
std::unique_ptr<nn::DecoderModel> build_float64_model(const nn::ModelConfig& cfg, uint64_t seed);

// A seeded batch of `rows` x `tokens` for `mode`, ids uniform in [0, vocab):
//   random_windows  x and y random ids;
//   padded_docs     row b holds a document of length in [2, tokens] (row 0 full, row 1 the shortest
//                   case of 2 when rows > 1), padded on `padding` side: key_padding, positions over the
//                   real tokens, y = -100 in padding (left padding leaves fully masked query rows);
//   packed_docs     each row cut into 1 to 3 pieces: segment_ids, positions restarting at 0 per
//                   piece, y = -100 on each piece's last token but the row's.
Batch gradcheck_batch(BatchMode mode, Padding padding, int64_t rows, int64_t tokens, int64_t vocab, uint64_t seed);

// What attention runs on for `cfg` in float64 on the CPU: the fused kernel (it has float64 tiles)
// unless model.attn_kernel = "reference".
std::string attention_kernel_description(const nn::ModelConfig& cfg);

// Runs the checks above on `model` (float64 parameters, on the CPU) with loss batch_loss(model,
// batch, rng). The model's parameters are perturbed in place and restored bit for bit; their .grad
// is left holding g. `progress`, if set, receives a line per parameter tensor.
ModelGradcheckReport run_model_gradcheck(const nn::DecoderModel& model, const Batch& batch, const nn::RngContext& rng,
                                         const ModelGradcheckOptions& opt,
                                         const std::function<void(const std::string&)>& progress = {});

// ---- From a config (what `qkv gradcheck --config` runs) ----

// The batch of a config's check: at most kMaxRows rows of at most kMaxTokens tokens (fewer when
// train.batch_size or the sequence length, train.seq_len or model.block_size, is smaller): a check
// evaluates the loss hundreds of times, and whether a backward is right does not depend on the
// batch's size. The batch follows data.batching and data.padding_side (their masks are checked too).
constexpr int64_t kMaxRows = 2, kMaxTokens = 16;
// model.vocab_size = 0 means the tokenizer's, which needs the corpus; the check uses a stand-in of
// the size the tokenizer would have where the config says it (bpe: data.bpe_vocab_size, byte: 256)
// and kStandInVocab for char (the corpus decides): any size checks the same code.
constexpr int64_t kStandInVocab = 64;

struct ConfigGradcheck {
  nn::ModelConfig model;  // as built (float64 parameters)
  bool vocab_stand_in = false;
  int64_t parameters = 0, parameter_tensors = 0;
  Batch batch;  // rows x tokens, the config's batching
  std::string attention_kernel;
  ModelGradcheckReport report;
};

// Resolves `cfg` (validated; train.device and train.dtype do not apply: the check runs on the CPU
// in float64), builds its model with init_weights(train.seed), converts it to float64, draws the
// batch (seed opt.seed) and runs the checks with dropout masks from RngContext{opt.seed, 0, 0}.
// `ops`, if set, replaces the model's attention ops (tests plant a wrong backward through it).
ConfigGradcheck run_config_gradcheck(const Config& cfg, const ModelGradcheckOptions& opt,
                                     std::shared_ptr<const nn::AttentionOps> ops = nullptr,
                                     const std::function<void(const std::string&)>& progress = {});

}  // namespace qkv::analysis
