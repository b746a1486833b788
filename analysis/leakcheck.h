// Leakage and consistency evaluation (`qkv leakcheck`): checks that a model reads no future token,
// that every way of feeding it tokens (KV cache, chunked prefill, padding, packing) gives the
// parallel forward's answer, that the attention masks mean what attention.h says, that each layer's
// attention (forward and backward) equals a naive float64 implementation on its real inputs, that
// dropout is off in eval, and that validation text does not repeat the training text. A self-test
// plants each known attention bug (Fault below) and proves the checks catch it.
//
// Every model check runs on a fixed, seeded probe batch sized to the model (probe length
// L = min(block_size, max_probe_len), tokens uniform in [0, vocab)) and on an eval-mode copy of
// the model (the caller's model is never modified). Each result is one row of the table:
//   name        value (what was measured)                              threshold   passes when
//   future_token_perturbation  max over t, positions <= t, logits and every layer's hidden state,
//               of max|Δ| / max|unperturbed| when tokens > t change      0           value <= thr
//               (each perturbed row is compared with the probe at the same batch row of a batch of
//               the same shape: identical rounding, so a model that reads no future token gives
//               exactly 0 whatever the BLAS kernel, and any change is a leak)
//   The consistency checks: one sequence's logits computed two ways that are mathematically
//   equal; value max |Δlogit| (trainer_vs_sampler: max |Δ log-prob|), per_position the gap at
//   each position of the sequence, diverges_at the first position whose greedy argmax differs.
//   Threshold: under numerics() == invariant exactly 0 (tensor/numerics.h: a token's logits are
//   bitwise a function of its prefix and the weights); under standard the float32 rounding bound
//   rounding_tolerance times max |logit| (2x that for log-probs), as the paths group their sums
//   differently. model.attention_pattern = linear keeps the rounding bound in both modes for the
//   checks that decode through its recurrent state (another summation than the chunked form).
//   kv_decode   the parallel forward vs one token at a time with the KV cache
//   chunked_prefill  the parallel forward vs prefill in chunks of 1, 7, 64 and the whole probe
//   padding_invariance  sequences alone vs in right- and left-padded batches (key padding)
//   packing_invariance  documents alone vs packed into rows (segment_ids, per-document positions)
//   batch_composition  the probe alone vs at row 5 of 8 rows of other lengths, right-padded
//   thread_count  the parallel forward on 1 vs 2 OpenMP threads
//   trainer_vs_sampler  per-token log-probs (train::token_logprobs) from the training step's
//               forward (training mode, dropout zeroed on a copy, grad mode on, 4 rows) vs
//               decoding the same tokens one at a time through the KV cache
//   batched_generation  prompts of 4 lengths (1 token to L/2) generated together by
//               train::generate_batch (continuous batching: each row prefilled alone, then one
//               forward per step for every row, each row with its own KV cache) vs each prompt
//               decoded alone through a batch-1 KV cache on the tokens the batch drew; per step
//               max |Δlogit| over the rows (a row fed another row's cache moves its logits by
//               far more than rounding)
//   greedy_generation  tokens that differ, KV cache vs full recompute     0 (standard: a first
//               difference after a tie within rounding is not counted)
//   padding_target_loss  |Δloss| / loss, ignore_index on pads vs alone    rounding tolerance
//   mask.*      masked weights (exactly 0), row sums, fully masked rows, bottom-right alignment,
//               window boundary, fused kernel vs naive float64          see each
//   reference_attention  max over layers of max|Δout| / max(max|out|, floor) against naive
//               float64                                                  1e-4
//   reference_attention_backward  max over layers and dq, dk, dv of max|Δ| / max(max|ref|, floor):
//               the model's attention backward (through RoPE) on its real q/k/v with a seeded dO
//               against the naive float64 vjp                           1e-4
//               (floor: a share of the largest value the quantity can take for these inputs,
//               leak::attention_floors, so an exactly-zero reference, e.g. dK when each row sees
//               one key, measures rounding against the inputs' scale)
//   kernel_probes  the same comparisons on inputs sized by the probe, not the model: 320 keys,
//               logits past exp overflow with a growing max, every pattern at its parameters'
//               edges; linear attention over several chunks (leakcheck_probes.cpp)   1e-3
//   dropout_discipline  max|Δ| between eval runs, eval vs dropout-free, train runs with one seed
//               (and train runs with two seeds must differ)              0
//   data.val_ngram_share, data.duplicated_docs   (with a dataset)        0.05, 0
//   permutation_equivariance  (only models with position = none, no window; otherwise listed as
//               skipped with the reason, never passed) attention without positions is
//               permutation-equivariant (seed 1 §16). On a copy with the causal mask lifted (the
//               model's own attention ops wrapped): max over logits and every layer of
//               max|h(πx) − π h(x)| / max|h| for a seeded shuffle π of the probe   rounding tolerance
//   permutation_equivariance.causal_prefix  the model as it runs (causal): max relative change of
//               the FIRST block's output (and a one-block model's logits) at positions t >= s when
//               tokens [0, s) are shuffled (s in {2, L/4, L/2, L-1})      rounding tolerance
//               Its detail states a finding, not a leak: a one-block model sees its context as a
//               bag of tokens and cannot tell order; with >= 2 blocks the deeper ones can (they
//               read block 0 at positions < s, whose prefixes did change: the causal mask alone
//               leaks position), and the detail gives how much. Failing means something puts
//               position into a model that has none (a kernel reading indices, a wrong mask).
//   "rounding tolerance" is leak::rounding_tolerance (u·sqrt(K)·(2 + 6·n_layer)): these two
//   compare sums over keys taken in another order, so they are not exact.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/png.h"
#include "data/dataset.h"
#include "nn/transformer.h"

namespace qkv::analysis {

struct LeakCheck {
  std::string name;
  double value = 0, threshold = 0;
  bool pass = false;
  std::string detail;  // how it was measured, and where the worst case is
  // The consistency checks (consistency_check_names): the gap at each position of the compared
  // sequence (max over rows / chunk sizes / sides), and the first position where the two ways'
  // greedy next token (argmax of the logits) differs, -1 when never.
  std::vector<double> per_position;
  int64_t diverges_at = -1;
};

struct LeakCheckOptions {
  uint64_t seed = 0x1eac4ec4;                     // probe tokens
  int64_t max_probe_len = 64;                     // probe length L = min(block_size, this)
  int64_t greedy_tokens = 0;                      // generated tokens compared; 0 = min(block_size, 64)
  std::vector<int64_t> chunk_sizes = {1, 7, 64};  // chunked_prefill; the whole probe is always added
  int ngram_n = 32;
  double max_ngram_share = 0.05;
  int64_t max_duplicated_docs = 0;
  // The families of model checks run_model_checks runs (model_check_families()); empty = every one.
  std::vector<std::string> families;
};

// ---- the checks (each on an eval copy of `model`; none modifies it) ----
// Checks that do not apply to a model (name, reason); run_model_checks leaves them out and reports
// list them as skipped, never as passed:
//   padding and packing invariance under a sparse pattern anchored at absolute positions (global,
//     bigbird, block_sparse);
//   mask.* for model.attention_pattern = linear (it forms no weights; reference_attention and its
//     backward compare it with its own naive float64 loops);
//   the permutation checks unless permutation_not_applicable() is empty.
std::vector<std::pair<std::string, std::string>> not_applicable_checks(const nn::ModelConfig& c);
std::vector<std::pair<std::string, std::string>> not_applicable_checks(const nn::DecoderModel& model);
LeakCheck check_future_perturbation(const nn::DecoderModel& model, const LeakCheckOptions& o);
// kv_decode, chunked_prefill, greedy_generation
std::vector<LeakCheck> check_train_vs_inference(const nn::DecoderModel& model, const LeakCheckOptions& o);
// padding_invariance, padding_target_loss
std::vector<LeakCheck> check_padding(const nn::DecoderModel& model, const LeakCheckOptions& o);
LeakCheck check_packing(const nn::DecoderModel& model, const LeakCheckOptions& o);
// batch_composition, thread_count, trainer_vs_sampler (leakcheck_consistency.cpp)
LeakCheck check_batch_composition(const nn::DecoderModel& model, const LeakCheckOptions& o);
LeakCheck check_thread_count(const nn::DecoderModel& model, const LeakCheckOptions& o);
LeakCheck check_trainer_vs_sampler(const nn::DecoderModel& model, const LeakCheckOptions& o);
// batched_generation (leakcheck_consistency.cpp): prompts of different lengths through
// train::generate_batch together vs each decoded alone (batch 1, its own KV cache).
LeakCheck check_batched_generation(const nn::DecoderModel& model, const LeakCheckOptions& o);
// mask.* on synthetic q, k, v shaped like the model's attention (heads, head dim, window)
std::vector<LeakCheck> check_mask_semantics(const nn::DecoderModel& model, const LeakCheckOptions& o);
LeakCheck check_reference_attention(const nn::DecoderModel& model, const LeakCheckOptions& o);
// The same probe and captured q/k/v; the attention op the model calls (and, for a model that trains
// through attention_packed, that op too) differentiated with a seeded dO.
LeakCheck check_reference_attention_backward(const nn::DecoderModel& model, const LeakCheckOptions& o);
// kernel_probes (leakcheck_probes.cpp): the model's attention ops on inputs sized by the probe,
// not the model (320 keys, logits past exp overflow with a growing max, each pattern at its
// parameters' edges; linear: several chunks), forward and backward against naive float64.
LeakCheck check_kernel_probes(const nn::DecoderModel& model, const LeakCheckOptions& o);
// On copies with dropout = attn_dropout = 0.1 (or the model's own when > 0) and with none.
LeakCheck check_dropout(const nn::DecoderModel& model, const LeakCheckOptions& o);
// data.val_ngram_share, data.duplicated_docs. A check with nothing to examine (val has no
// ngram_n-token window, or no document) is listed in `skipped` with the reason, never passed.
struct DataLeakageChecks {
  std::vector<LeakCheck> checks;
  std::vector<std::pair<std::string, std::string>> skipped;  // name, reason
};
DataLeakageChecks check_data_leakage(const TokenSplit& train, const TokenSplit& val, const LeakCheckOptions& o);

// permutation_equivariance and permutation_equivariance.causal_prefix; throws when
// permutation_not_applicable(model.config()) is not empty.
std::vector<LeakCheck> check_permutation_equivariance(const nn::DecoderModel& model, const LeakCheckOptions& o);
// Why the permutation checks do not apply to a model ("" when they do): positions, a window.
std::string permutation_not_applicable(const nn::ModelConfig& c);

// Every model check above that applies, in table order (not_applicable_checks below lists the
// rest). A check that throws is recorded as failed (value inf) with the error as its detail.
std::vector<LeakCheck> run_model_checks(const nn::DecoderModel& model, const LeakCheckOptions& o);
// The families run_model_checks runs, in table order, by the names LeakCheckOptions::families
// takes: one per check function above (train_vs_inference: kv_decode, chunked_prefill,
// greedy_generation; padding: padding_invariance, padding_target_loss; mask: mask.*;
// permutation_equivariance: both permutation checks); the others report the check they name.
const std::vector<std::string>& model_check_families();

// ---- training vs inference consistency, in both numerics modes ----
// The consistency checks, in table order: kv_decode, chunked_prefill, padding_invariance,
// packing_invariance, batch_composition, thread_count, trainer_vs_sampler, batched_generation.
const std::vector<std::string>& consistency_check_names();
// Those of them that apply to `model` (not_applicable_checks), run in the process's numerics mode.
std::vector<LeakCheck> run_consistency_checks(const nn::DecoderModel& model, const LeakCheckOptions& o);
// The same checks run under each mode in turn (NumericsGuard), whatever the process's mode.
struct NumericsComparison {
  std::vector<LeakCheck> standard, invariant;  // the same names in the same order
};
NumericsComparison compare_numerics_modes(const nn::DecoderModel& model, const LeakCheckOptions& o);

// A copy of `model` (same weights, copied by parameter name) built from `cfg`, which may differ in
// dropout / kernel / window but must have the same parameter shapes. Eval mode, with the model's
// attention ops and bf16 inference setting.
std::unique_ptr<nn::DecoderModel> copy_model(const nn::DecoderModel& model, const nn::ModelConfig& cfg);

// ---- self-test ----
struct SelfTestModel {
  std::string name, description;
  std::unique_ptr<nn::DecoderModel> model;
};
// The models the self-test plants faults in: the user's model and a probe model built to expose
// every fault (llama-style: RoPE, GQA 4:2, sliding window, multi-head, strong attention).
std::vector<SelfTestModel> self_test_models(const nn::DecoderModel& user_model);

// The known attention bugs the self-test plants. Each lives in the self-test's own code
// (leakcheck_selftest.cpp): an nn::AttentionOps installed on a model (PlantedFault) that passes
// wrong mask rules to the attention op (attn::MaskRules), composes a wrong softmax, or changes
// RoPE or the options; the library and the model have no fault switch.
enum class Fault {
  none,
  causal_reversed,            // causal keeps j >= pos_i instead of j <= pos_i (reads the future)
  softmax_over_queries,       // softmax along the query axis instead of the key axis
  ignore_key_padding,         // key_padding / key_lengths ignored
  mask_after_softmax,         // weights multiplied by the mask after softmax instead of -inf before
  top_left_causal,            // causal without the Nk - Nq offset (query i at position i)
  window_off_by_one,          // window keeps pos_i - w <= j (one key too many)
  gqa_modulo,                 // query head h reads kv head h % Hkv instead of h / (Hq / Hkv)
  scale_d_model,              // scale by 1/sqrt(d_model) instead of 1/sqrt(head dim)
  rope_cache_relative,        // RoPE applied by position within the cache chunk, not absolute position
  dropout_in_eval,            // attention dropout left on in eval mode
  linear_chunk_future,        // linear attention's causal chunk also reads its own later keys
  strided_offset_off_by_one,  // strided pattern keeps (pos_i - j + 1) mod s == 0 instead of (pos_i - j) mod s == 0
  global_reads_future,        // a global query position sees every key, ignoring the causal mask
  softmax_no_max_shift,       // online softmax takes exp(logit) without subtracting the running max
  softmax_no_rescale,         // online softmax keeps O and the row sum unscaled when the running max grows
  cross_row_cache,            // continuous batching: row b appends to and reads row b + 1's cache
};
const char* fault_name(Fault f);
// The attention ops that run a model with `f` planted (the library's for Fault::none).
std::shared_ptr<const nn::AttentionOps> faulty_attention(Fault f);
// Plants `f` in `model` for the guard's lifetime (its attention ops replaced, then restored).
// Copies made for the checks (copy_model) carry the planted ops.
class PlantedFault {
 public:
  PlantedFault(nn::DecoderModel& model, Fault f);
  ~PlantedFault();
  PlantedFault(const PlantedFault&) = delete;
  PlantedFault& operator=(const PlantedFault&) = delete;

 private:
  nn::DecoderModel& model_;
  std::shared_ptr<const nn::AttentionOps> prev_;
};

struct CaughtBy {
  std::string check, model;
  double value = 0, threshold = 0;
};
struct FaultOutcome {
  Fault fault = Fault::none;
  bool detected = false;
  std::vector<CaughtBy> caught_by;
  std::string exposed_by;  // which probe conditions the fault needs
};
struct SelfTestResult {
  std::vector<std::pair<std::string, std::string>> models;  // name, description
  std::vector<FaultOutcome> faults;
  std::vector<CaughtBy> false_alarms;  // checks that failed with no fault planted
  int planted() const { return static_cast<int>(faults.size()); }
  int detected() const;
  bool pass() const { return detected() == planted() && false_alarms.empty(); }
};
// `progress` (optional) receives one line per model run.
SelfTestResult run_self_test(const nn::DecoderModel& user_model, const LeakCheckOptions& o,
                             const std::function<void(const std::string&)>& progress = {});
// The faults the self-test plants, and what each needs to show.
std::vector<Fault> planted_faults();
const char* fault_condition(Fault f);

// ---- output ----
struct LeakCheckReport {
  std::string subject;  // what was checked ("checkpoint X", "config Y (fresh init)")
  std::vector<LeakCheck> checks;
  std::vector<std::pair<std::string, std::string>> skipped;  // name, reason
  int passed() const;
  int failed() const;
};
// --json: {"checks":[{"name","value","threshold","pass","detail"}],"passed","failed"} (the
// consistency checks add "per_position" and "diverges_at", null when never) plus
// "self_test":{"planted","detected","false_alarms","faults":[...],"models":[...]} when given, and
// "consistency":[{"name","standard":{...},"invariant":{...}}] (each mode: "max_abs_delta",
// "threshold", "pass", "diverges_at" (null: never), "per_position") when `cmp` is given.
// A value that is not finite (a NaN, or a check that threw) is written as null.
nlohmann::json leakcheck_json(const LeakCheckReport& r, const SelfTestResult* st,
                              const NumericsComparison* cmp = nullptr);
std::string leakcheck_table(const LeakCheckReport& r);
std::string self_test_table(const SelfTestResult& st);
// The side-by-side table of a NumericsComparison.
std::string numerics_comparison_table(const NumericsComparison& cmp);
// |Δ| by position of one consistency check in both modes, on a log scale (zeros on the floor line).
Image render_gap_plot(const LeakCheck& standard, const LeakCheck& invariant);
// DIR/index.html (the tables) with DIR/attention_map.png and DIR/attention_grid.png of `model` on
// `probe_ids` (labels from `tok` when given), and with `cmp` a "Training vs inference
// consistency" section with DIR/consistency_<check>.png per check; every file written atomically.
void write_leakcheck_report(const std::string& dir, const LeakCheckReport& r, const SelfTestResult* st,
                            const nn::DecoderModel& model, const std::vector<int32_t>& probe_ids, const Tokenizer* tok,
                            const NumericsComparison* cmp = nullptr);

}  // namespace qkv::analysis
