// Head-pattern analysis (`qkv heads`): what each layer's heads attend to over a sample of real
// text, as scores and one label per head.
//
// The model runs on `windows` (token sequences of at most block_size tokens, e.g. evenly spaced
// slices of a corpus); each layer's and head's attention weights w[i][j] (query i, key j <= i) come
// from analysis::compute_attention_maps (the reference kernel on the q, k, v the layer computed).
// Every score is a mean over the queries i >= 1 of all windows (query 0 has one key and says
// nothing):
//   diagonal        w[i][i]                      (the query's own token)
//   previous_token  w[i][i-1]
//   first_token     w[i][0]                      (BOS / aggregation sink)
//   separator       Σ_j w[i][j] over separator keys j (newline, space, punctuation: a per-id table)
//   local           Σ_j w[i][j] over i - j < local_span (the query and its local_span - 1 predecessors)
//   mean_distance   Σ_j w[i][j]·(i - j)
//   entropy         -Σ_j w[i][j]·ln w[i][j] (nats); entropy_norm divides it by ln(i + 1), the
//                   entropy of uniform weights over the visible keys (0 for query 0, excluded)
// The scores may overlap (a previous token that is a space counts for both); the label is read in
// this order:
//   1. the largest of diagonal, previous_token, first_token, separator, if >= peak_threshold
//      (default 0.5: more than half of the attention on one kind of key);
//   2. `local` if local >= local_threshold (default 0.7) and no single kind passed 1;
//   3. `broad` if entropy_norm >= broad_threshold (default 0.8: close to uniform over the context);
//   4. `mixed` otherwise.
// label_score is the score behind the label (entropy_norm for broad, the largest score for mixed).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/attention_map.h"
#include "data/tokenizer.h"
#include "nn/transformer.h"

namespace qkv::analysis {

struct HeadsOptions {
  int64_t local_span = 4;
  double peak_threshold = 0.5, local_threshold = 0.7, broad_threshold = 0.8;
};

struct HeadScores {
  int64_t layer = 0, head = 0;
  double diagonal = 0, previous_token = 0, first_token = 0, separator = 0, local = 0;
  double mean_distance = 0, entropy = 0, entropy_norm = 0;
  std::string label;
  double label_score = 0;
};

struct HeadsReport {
  std::vector<HeadScores> heads;     // layer-major
  int64_t windows = 0, queries = 0;  // windows run, queries averaged per head
  HeadsOptions options;
  std::string separators;   // the separator characters, as given
  AttentionMaps mean_maps;  // per layer [n_head, T, T]: the weights averaged over windows of the first window's length
};

// The default separator characters: newline, space, tab and ASCII punctuation.
const std::string& default_separators();
// Per token id: whether the token's text is non-empty and made only of `chars`.
std::vector<bool> separator_ids(const Tokenizer& tok, const std::string& chars);
// `count` windows of `len` tokens (len = min(len, ids.size())), evenly spaced over `ids` (the first
// at 0, the last ending at the end). Throws when ids is empty.
std::vector<std::vector<int32_t>> sample_windows(const std::vector<int32_t>& ids, int64_t len, int64_t count);

// Applies the label rules above to `h` (sets label and label_score).
void label_head(HeadScores& h, const HeadsOptions& o);

// Scores and labels for every head. `is_separator` is indexed by token id (shorter = not a
// separator). Windows must be non-empty and at most block_size long.
HeadsReport analyze_heads(const nn::DecoderModel& model, const std::vector<std::vector<int32_t>>& windows,
                          const std::vector<bool>& is_separator, const HeadsOptions& o = {},
                          const Tokenizer* tok = nullptr);

// --json: {"heads": [{layer, head, label, label_score, scores: {diagonal, previous_token,
// first_token, separator, local, mean_distance, entropy, entropy_norm}}], windows, queries,
// thresholds: {...}, labels: {label: count}}.
nlohmann::json heads_json(const HeadsReport& r);
std::string heads_table(const HeadsReport& r);
// A grid of the mean attention of every layer (rows) and head (columns), each panel captioned with
// its label and score.
Image render_heads_grid(const HeadsReport& r);
// DIR/index.html (the thresholds and the table) and DIR/heads.png (the grid), written atomically.
void write_heads_report(const std::string& dir, const HeadsReport& r, const std::string& subject);

}  // namespace qkv::analysis
