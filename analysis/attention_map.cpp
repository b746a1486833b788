// Attention heatmaps. The weights are P = softmax(s·q·kᵀ + mask) from attention_with_weights on
// each layer's captured q/k/v, so what is drawn is exactly what the reference kernel computes for
// the model's real inputs; the grey "masked" cells come from the causal/window predicate, not from
// weights that merely happen to be 0.
#include "analysis/attention_map.h"

#include <algorithm>
#include <cmath>

#include "attention/alibi.h"
#include "attention/attention.h"
#include "attention/rope.h"
#include "autograd/grad_mode.h"
#include "tensor/ops.h"
#include "analysis/leakcheck.h"

namespace qkv::analysis {

std::string token_label(const Tokenizer* tok, int32_t id, size_t max_chars) {
  if (!tok) return std::to_string(id);
  std::string raw, out;
  tok->append_token(id, raw);
  for (unsigned char ch : raw) {
    if (out.size() >= max_chars) break;
    if (ch == ' ') out += '\x01';
    else if (ch == '\n') out += '\n';
    else if (ch >= 32 && ch < 127) out += static_cast<char>(ch);
    else if (ch < 0x80 || ch >= 0xC0) out += '?';  // one '?' per non-ASCII character, not per byte
  }
  return out.empty() ? std::string("?") : out;
}

AttentionMaps compute_attention_maps(const nn::DecoderModel& model, const std::vector<int32_t>& ids,
                                     const Tokenizer* tok) {
  const nn::ModelConfig& c = model.config();
  const int64_t T = static_cast<int64_t>(ids.size());
  QKV_CHECK(T >= 1 && T <= c.block_size, "[attention-map] the text is ", T,
            " tokens; need 1 to block_size = ", c.block_size);
  for (int32_t id : ids)
    QKV_CHECK(id >= 0 && id < c.vocab_size, "[attention-map] token ", id, " is outside the vocabulary of ",
              c.vocab_size);
  std::unique_ptr<nn::DecoderModel> copy;
  const nn::DecoderModel* m = &model;
  if (model.is_training()) {
    copy = copy_model(model, c);
    m = copy.get();
  }
  autograd::NoGradGuard no_grad;
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  std::vector<nn::AttentionCapture> caps;
  nn::ForwardArgs a;
  a.ids = from_vector_i64(ids64, {1, T});
  a.attention = &caps;
  m->forward(a);

  AttentionMaps out;
  out.n_layer = c.n_layer;
  out.n_head = c.n_head;
  out.tokens = T;
  out.window = c.window;
  for (int32_t id : ids) out.labels.push_back(token_label(tok, id));
  const Tensor positions = arange(0, T, DType::i64);
  attn::AttentionOptions o;
  o.causal = true;
  o.window = c.window;
  o.kernel = attn::Kernel::reference;
  if (c.position == nn::Position::alibi) o.alibi_slopes = attn::alibi_slopes(c.n_head);
  for (const auto& cap : caps) {
    // On the host whatever device the model ran on: the maps are small, and they are read on the host.
    Tensor q = cap.q.to(Device::cpu), k = cap.k.to(Device::cpu);
    const Tensor v = cap.v.to(Device::cpu);
    if (c.position == nn::Position::rope) {
      q = attn::apply_rope(q, positions, c.rope_theta);
      k = attn::apply_rope(k, positions, c.rope_theta);
    }
    out.weights.push_back(attn::attention_with_weights(q, k, v, o).weights.select(0, 0).contiguous());
  }
  return out;
}

Rgb weight_colour(double w) {
  static constexpr double stops[5][3] = {{255, 255, 217}, {199, 233, 180}, {65, 182, 196}, {34, 94, 168}, {8, 29, 88}};
  const double x = std::sqrt(std::clamp(std::isfinite(w) ? w : 1.0, 0.0, 1.0)) * 4.0;
  const int i = std::min(3, static_cast<int>(x));
  const double f = x - i;
  auto mix = [&](int ch) {
    return static_cast<uint8_t>(std::lround(stops[i][ch] + f * (stops[i + 1][ch] - stops[i][ch])));
  };
  return {mix(0), mix(1), mix(2)};
}

namespace {

constexpr Rgb kInk{30, 30, 30};

// Cells of `size` px for head `head` of layer `layer`, top-left at (x0, y0).
void draw_cells(Image& img, const AttentionMaps& m, int64_t layer, int64_t head, int x0, int y0, int size) {
  const int64_t T = m.tokens;
  const float* w = m.weights[static_cast<size_t>(layer)].data<float>() + head * T * T;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j)
      img.fill_rect(x0 + static_cast<int>(j) * size, y0 + static_cast<int>(i) * size, size, size,
                    m.visible(i, j) ? weight_colour(w[i * T + j]) : kMaskedColour);
}

}  // namespace

Image render_attention_map(const AttentionMaps& m, int64_t layer, int64_t head, HeatmapLayout* layout) {
  QKV_CHECK(layer >= 0 && layer < m.n_layer, "[attention-map] --layer ", layer, " is outside [0, ", m.n_layer, ")");
  QKV_CHECK(head >= 0 && head < m.n_head, "[attention-map] --head ", head, " is outside [0, ", m.n_head, ")");
  const int64_t T = m.tokens;
  const int cell = static_cast<int>(std::clamp<int64_t>(720 / T, Image::kGlyphH + 1, 24));
  size_t longest = 1;
  for (const auto& l : m.labels) longest = std::max(longest, l.size());
  const int pad = 10, title_h = 2 * Image::kGlyphH + 12;
  const int ls = cell >= 2 * Image::kGlyphH + 2 ? 2 : 1;                    // label scale: large cells get large labels
  const int label_w = static_cast<int>(longest) * Image::kGlyphW * ls + 6;  // row labels, left
  const int label_h = static_cast<int>(longest) * Image::kGlyphH * ls + 6;  // column labels, stacked
  const int grid = static_cast<int>(T) * cell, bar_w = 16;
  const int x0 = pad + label_w, y0 = pad + title_h + label_h;
  Image img(std::max(x0 + grid + pad + bar_w + 5 * Image::kGlyphW + pad, 2 * pad + 44 * Image::kGlyphW),
            y0 + grid + pad);
  img.draw_text(
      pad, pad,
      "layer " + std::to_string(layer) + " head " + std::to_string(head) + "  (" + std::to_string(T) + " tokens)",
      kInk);
  img.draw_text(pad, pad + Image::kGlyphH + 4, "rows: queries  columns: keys  grey: masked", {90, 90, 90});
  // Labels centred in their cells: queries to the left (right-aligned), keys above (bottom-aligned).
  for (int64_t t = 0; t < T; ++t) {
    const std::string& l = m.labels[static_cast<size_t>(t)];
    const int off = (cell - Image::kGlyphH * ls) / 2 + ls;
    img.draw_text(x0 - 4 - Image::text_width(l, ls), y0 + static_cast<int>(t) * cell + off, l, kInk, ls);
    const int coff = (cell - Image::kGlyphW * ls) / 2 + ls;
    img.draw_text_vertical(x0 + static_cast<int>(t) * cell + coff,
                           y0 - 4 - static_cast<int>(l.size()) * Image::kGlyphH * ls, l, kInk, ls);
  }
  draw_cells(img, m, layer, head, x0, y0, cell);
  if (layout) *layout = {x0, y0, cell};
  // Colour bar: 1 at the top, 0 at the bottom.
  const int bx = x0 + grid + pad;
  for (int y = 0; y < grid; ++y)
    img.fill_rect(bx, y0 + y, bar_w, 1, weight_colour(1.0 - static_cast<double>(y) / std::max(grid - 1, 1)));
  img.draw_text(bx + bar_w + 3, y0, "1", kInk);
  img.draw_text(bx + bar_w + 3, y0 + grid - Image::kGlyphH, "0", kInk);
  return img;
}

Image render_attention_grid(const AttentionMaps& m) {
  const int64_t T = m.tokens;
  const int cell = static_cast<int>(std::clamp<int64_t>(160 / T, 1, 8));
  const int panel = static_cast<int>(T) * cell, gap = 10, label_h = Image::kGlyphH + 4, pad = 10;
  const int title_h = Image::kGlyphH + 8;
  const int w = pad * 2 + static_cast<int>(m.n_head) * (panel + gap) - gap;
  const int h = pad * 2 + title_h + static_cast<int>(m.n_layer) * (panel + label_h + gap) - gap;
  Image img(std::max(w, 260), h);
  img.draw_text(pad, pad, "attention of every layer (rows) and head (columns)", kInk);
  for (int64_t l = 0; l < m.n_layer; ++l)
    for (int64_t hd = 0; hd < m.n_head; ++hd) {
      const int x = pad + static_cast<int>(hd) * (panel + gap);
      const int y = pad + title_h + static_cast<int>(l) * (panel + label_h + gap);
      img.draw_text(x, y, "L" + std::to_string(l) + " H" + std::to_string(hd), kInk);
      draw_cells(img, m, l, hd, x, y + label_h, cell);
    }
  return img;
}

}  // namespace qkv::analysis
