// Attention maps (`qkv attention-map`, leakcheck's report): every layer's and head's attention
// weights on a text, taken from the reference kernel (attention_with_weights) on the q/k/v each
// layer really computed (captured from the model's forward, RoPE applied at the tokens'
// positions, the model's causal/window/ALiBi masks), and drawn as heatmaps: one head with token
// labels on both axes (rows = queries, columns = keys, masked cells grey, so the causal triangle
// shows), or a grid of all layers x heads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "nn/transformer.h"
#include "analysis/png.h"

namespace qkv::analysis {

struct AttentionMaps {
  std::vector<std::string> labels;  // one printable label per token
  int64_t n_layer = 0, n_head = 0, tokens = 0, window = 0;
  std::vector<Tensor> weights;  // per layer: float32 [n_head, tokens, tokens], row = query
  bool visible(int64_t i, int64_t j) const { return j <= i && (window <= 0 || i - j < window); }
};

// Runs `model` on `ids` (1 <= size <= block_size; token ids must be in the vocabulary) in eval
// mode. Labels come from `tok` when given (else the ids).
AttentionMaps compute_attention_maps(const nn::DecoderModel& model, const std::vector<int32_t>& ids,
                                     const Tokenizer* tok);

// A token as a short printable label: '\n' and ' ' get visible glyphs, other non-ASCII bytes '?',
// at most `max_chars` characters.
std::string token_label(const Tokenizer* tok, int32_t id, size_t max_chars = 6);

// Where the heatmap's cells lie: cell (query i, key j) covers [x0 + j·cell, +cell) x [y0 + i·cell, +cell).
struct HeatmapLayout {
  int x0 = 0, y0 = 0, cell = 0;
};
Image render_attention_map(const AttentionMaps& m, int64_t layer, int64_t head, HeatmapLayout* layout = nullptr);
Image render_attention_grid(const AttentionMaps& m);

// The heatmap colour of a weight in [0, 1] (pale yellow -> dark blue, on sqrt(w) so small weights
// stay visible), and of a masked cell.
Rgb weight_colour(double w);
constexpr Rgb kMaskedColour{200, 200, 200};

}  // namespace qkv::analysis
