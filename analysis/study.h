// `qkv study`: train one base config once per attention variant, under the same data, seed, token
// budget and schedule, and measure what a researcher choosing an attention needs side by side:
// validation loss (and its gap to `full`), training tokens/s and wall time, peak RSS, inference
// latency (prefill of N tokens, then per decoded token) and memory at each length, validation loss
// at lengths beyond the training context where the positions allow, leakcheck's consistency checks
// (analysis::run_model_checks) and three edge inputs with documented results.
//
// Variants: "name[:param]", mapped to config overrides by one table (variant_rules()):
//   full            model.window = 0, model.attention_pattern = full
//   window:W        model.window = W, model.attention_pattern = full
//   strided[:S]     model.attention_pattern = strided, model.pattern_stride = S
//   global[:G]      model.attention_pattern = global, model.pattern_global = G (the first G positions)
//   bigbird[:B]     model.attention_pattern = bigbird, model.pattern_block_size = B
//   block_sparse[:B] model.attention_pattern = block_sparse, model.pattern_block_size = B
//   linear          model.attention_pattern = linear
//   (every pattern variant sets model.window = 0; a parameter left out keeps the key's default;
//   other model.pattern_* / model.linear_* keys come through --set)
//
// Work directory (the report directory): DIR/variants/<name>/run is the variant's train.out_dir;
// DIR/variants/<name>/result.json its finished result, keyed by the resolved config, the budget
// and the measurement settings. A second run skips every variant whose result.json has the same key
// (an interrupted study resumes from the finished variants; an unfinished one trains again from
// scratch). DIR/index.html is the report (tables and SVG plots).
//
// Edge inputs, each with its documented result (pass = that result, and no NaN anywhere):
//   empty_prompt        generate() with no prompt tokens: a qkv::Error naming the prompt
//   fully_masked_row    a batch row whose keys are all padding (key_padding false): finite logits,
//                       the masked row's attention output zero (attention/attention.h)
//   prompt_over_block   generate() from a prompt of block_size + 8 tokens: the model reads the last
//                       block_size tokens (train/sampler.h) and returns the tokens asked for
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace qkv::analysis {

struct VariantRule {
  std::string name;
  std::string param;  // what ":param" means ("" = takes none)
  bool param_required = false;
  std::string description;
  std::function<std::vector<std::string>(const std::string& param)> overrides;
};
const std::vector<VariantRule>& variant_rules();

struct VariantSpec {
  std::string name;  // as written ("window:64")
  std::vector<std::string> overrides;
};
// "full,window:64" -> specs. Throws naming the variant for an unknown name, a missing or stray
// parameter, or a repeated variant.
std::vector<VariantSpec> parse_variants(const std::string& list);

struct StudyOptions {
  std::string dir = "runs/study";
  std::vector<int64_t> lengths = {256, 1024, 4096};
  int64_t budget_tokens = 0;                         // training tokens per variant; 0 = the base config's max_steps
  int64_t decode_tokens = 16;                        // decoded tokens timed per length
  int64_t eval_tokens = 8192;                        // validation tokens scored per length (at least one window)
  bool run_checks = true;                            // leakcheck's model checks
  std::function<void(const std::string&)> progress;  // one line per stage (stderr in the CLI)
};

struct LengthResult {
  int64_t length = 0;
  bool measured = false;
  std::string skipped;  // why not, when not measured
  double prefill_ms = NAN, decode_ms_per_token = NAN;
  int64_t memory_bytes = 0;    // tensor bytes the inference added at its peak (cache + activations)
  int64_t kv_cache_bytes = 0;  // of which the KV cache
  double val_loss = NAN;       // mean next-token loss over windows of `length` tokens
  std::string val_skipped;
};

struct CheckRow {
  std::string name;
  double value = 0, threshold = 0;
  bool pass = false;
};

struct EdgeResult {
  std::string name, expected, got;
  bool pass = false;
};

struct CurvePoint {
  int64_t step = 0;
  double wall_s = 0, val_loss = NAN;
};

struct VariantResult {
  std::string name;
  std::vector<std::string> overrides;
  double val_loss = NAN, val_loss_gap = NAN;  // gap = val_loss - full's (NaN without a full variant)
  double tokens_per_s = 0, wall_s = 0;
  // The resident high-water mark over the variant (training, inference, checks). VmHWM is reset
  // before the variant, after freed memory went back to the OS, so it starts from what the
  // process still holds (a little more for later variants of one study than for the first).
  int64_t peak_rss_bytes = 0;
  bool peak_rss_per_variant = false;  // VmHWM could be reset; else the process's peak so far
  int64_t steps = 0, train_tokens = 0, params = 0, block_size = 0;
  std::vector<CurvePoint> curve;  // validation loss against training wall time (eval excluded)
  std::vector<LengthResult> lengths;
  std::vector<CheckRow> checks;
  std::vector<EdgeResult> edges;
  bool resumed = false;  // read from a finished result.json
};

struct StudyResult {
  std::string base;
  StudyOptions options;
  std::vector<VariantResult> variants;
};

// Runs (or resumes) the study. Every variant's config is built and validated before any training,
// so a bad variant fails the study at once with the config's message.
StudyResult run_study(const std::string& base_path, const std::vector<std::string>& sets,
                      const std::vector<VariantSpec>& variants, const StudyOptions& o);

nlohmann::json variant_json(const VariantResult& v);
VariantResult variant_from_json(const nlohmann::json& j);
// {variants: [{name, val_loss, val_loss_gap, tokens_per_s, wall_s, peak_rss_bytes, steps,
// train_tokens, params, overrides, curve, lengths, checks, edges, resumed}], base, budget_tokens,
// lengths, report}. Non-finite numbers are written as null.
nlohmann::json study_json(const StudyResult& r);
std::string study_table(const StudyResult& r);
// DIR/index.html with the tables and three SVG plots (val loss vs wall time, latency vs length,
// memory vs length), written atomically.
void write_study_report(const StudyResult& r);

}  // namespace qkv::analysis
