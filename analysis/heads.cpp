#include "analysis/heads.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "analysis/html.h"
#include "analysis/png.h"
#include "tensor/error.h"
#include "train/atomic_file.h"

namespace qkv::analysis {

const std::string& default_separators() {
  static const std::string s = std::string("\n \t") + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  return s;
}

std::vector<bool> separator_ids(const Tokenizer& tok, const std::string& chars) {
  std::vector<bool> out(static_cast<size_t>(tok.vocab_size()), false);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    std::string text;
    tok.append_token(id, text);
    out[static_cast<size_t>(id)] = !text.empty() && std::all_of(text.begin(), text.end(), [&](char ch) {
      return chars.find(ch) != std::string::npos;
    });
  }
  return out;
}

std::vector<std::vector<int32_t>> sample_windows(const std::vector<int32_t>& ids, int64_t len, int64_t count) {
  QKV_CHECK(!ids.empty(), "[heads] the text encodes to no tokens");
  QKV_CHECK(len >= 1 && count >= 1, "[heads] need windows of >= 1 token, at least one (got ", count, " of ", len, ")");
  const int64_t n = static_cast<int64_t>(ids.size());
  len = std::min(len, n);
  const int64_t span = n - len;  // the last start
  std::vector<std::vector<int32_t>> out;
  for (int64_t w = 0; w < count; ++w) {
    const int64_t start = count == 1 ? 0 : span * w / (count - 1);
    out.emplace_back(ids.begin() + start, ids.begin() + start + len);
    if (span == 0) break;  // every window would be the same
  }
  return out;
}

void label_head(HeadScores& h, const HeadsOptions& o) {
  const std::pair<const char*, double> peaks[] = {{"diagonal", h.diagonal},
                                                  {"previous_token", h.previous_token},
                                                  {"first_token", h.first_token},
                                                  {"separator", h.separator}};
  const auto* best = std::max_element(std::begin(peaks), std::end(peaks),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  if (best->second >= o.peak_threshold) {
    h.label = best->first;
    h.label_score = best->second;
  } else if (h.local >= o.local_threshold) {
    h.label = "local";
    h.label_score = h.local;
  } else if (h.entropy_norm >= o.broad_threshold) {
    h.label = "broad";
    h.label_score = h.entropy_norm;
  } else {
    h.label = "mixed";
    h.label_score = best->second;
  }
}

HeadsReport analyze_heads(const nn::DecoderModel& model, const std::vector<std::vector<int32_t>>& windows,
                          const std::vector<bool>& is_separator, const HeadsOptions& o, const Tokenizer* tok) {
  const nn::ModelConfig& c = model.config();
  QKV_CHECK(!windows.empty(), "[heads] no text windows to run");
  QKV_CHECK(o.local_span >= 1, "[heads] the local span must be >= 1, got ", o.local_span);
  HeadsReport r;
  r.options = o;
  const int64_t H = c.n_head, L = c.n_layer;
  std::vector<HeadScores> acc(static_cast<size_t>(L * H));
  int64_t queries = 0;
  const int64_t T0 = static_cast<int64_t>(windows.front().size());
  int64_t same_len = 0;
  for (const auto& ids : windows) {
    const AttentionMaps maps = compute_attention_maps(model, ids, tok);
    const int64_t T = maps.tokens;
    if (r.mean_maps.weights.empty()) {
      r.mean_maps = maps;  // labels, shape; weights summed below
      for (auto& w : r.mean_maps.weights) w = w.clone();
      same_len = 1;
    } else if (T == T0) {
      for (int64_t l = 0; l < L; ++l) {
        float* dst = r.mean_maps.weights[static_cast<size_t>(l)].data<float>();
        const float* src = maps.weights[static_cast<size_t>(l)].data<float>();
        for (int64_t e = 0; e < H * T * T; ++e) dst[e] += src[e];
      }
      ++same_len;
    }
    auto sep = [&](int64_t j) {
      const int32_t id = ids[static_cast<size_t>(j)];
      return id >= 0 && static_cast<size_t>(id) < is_separator.size() && is_separator[static_cast<size_t>(id)];
    };
    for (int64_t l = 0; l < L; ++l) {
      const float* w = maps.weights[static_cast<size_t>(l)].data<float>();
      for (int64_t h = 0; h < H; ++h) {
        HeadScores& a = acc[static_cast<size_t>(l * H + h)];
        for (int64_t i = 1; i < T; ++i) {
          const float* row = w + (h * T + i) * T;
          double s = 0, local = 0, dist = 0, ent = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const double p = row[j];
            if (sep(j)) s += p;
            if (i - j < o.local_span) local += p;
            dist += p * static_cast<double>(i - j);
            if (p > 0) ent -= p * std::log(p);
          }
          a.diagonal += row[i];
          a.previous_token += row[i - 1];
          a.first_token += row[0];
          a.separator += s;
          a.local += local;
          a.mean_distance += dist;
          a.entropy += ent;
          a.entropy_norm += ent / std::log(static_cast<double>(i + 1));
        }
      }
    }
    queries += std::max<int64_t>(T - 1, 0);
    ++r.windows;
  }
  QKV_CHECK(queries > 0, "[heads] every window is one token long: no query has a key to choose");
  for (auto& w : r.mean_maps.weights) {
    float* d = w.data<float>();
    for (int64_t e = 0; e < w.numel(); ++e) d[e] /= static_cast<float>(same_len);
  }
  const double q = static_cast<double>(queries);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) {
      HeadScores s = acc[static_cast<size_t>(l * H + h)];
      s.layer = l;
      s.head = h;
      for (double* v : {&s.diagonal, &s.previous_token, &s.first_token, &s.separator, &s.local, &s.mean_distance,
                        &s.entropy, &s.entropy_norm})
        *v /= q;
      label_head(s, o);
      r.heads.push_back(s);
    }
  r.queries = queries;
  return r;
}

nlohmann::json heads_json(const HeadsReport& r) {
  nlohmann::json heads = nlohmann::json::array();
  std::map<std::string, int> counts;
  for (const auto& h : r.heads) {
    heads.push_back({{"layer", h.layer},
                     {"head", h.head},
                     {"label", h.label},
                     {"label_score", h.label_score},
                     {"scores",
                      {{"diagonal", h.diagonal},
                       {"previous_token", h.previous_token},
                       {"first_token", h.first_token},
                       {"separator", h.separator},
                       {"local", h.local},
                       {"mean_distance", h.mean_distance},
                       {"entropy", h.entropy},
                       {"entropy_norm", h.entropy_norm}}}});
    ++counts[h.label];
  }
  return {{"heads", heads},
          {"windows", r.windows},
          {"queries", r.queries},
          {"separators", r.separators},
          {"labels", counts},
          {"thresholds",
           {{"peak", r.options.peak_threshold},
            {"local", r.options.local_threshold},
            {"local_span", r.options.local_span},
            {"broad", r.options.broad_threshold}}}};
}

std::string heads_table(const HeadsReport& r) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-4s %-15s %6s %6s %6s %6s %6s %6s %8s %7s %7s\n", "layer", "head", "label",
                "score", "diag", "prev", "first", "sep", "local", "distance", "entropy", "ent/max");
  o << line;
  for (const auto& h : r.heads) {
    std::snprintf(line, sizeof line, "%5lld %4lld %-15s %6.3f %6.3f %6.3f %6.3f %6.3f %6.3f %8.2f %7.3f %7.3f\n",
                  static_cast<long long>(h.layer), static_cast<long long>(h.head), h.label.c_str(), h.label_score,
                  h.diagonal, h.previous_token, h.first_token, h.separator, h.local, h.mean_distance, h.entropy,
                  h.entropy_norm);
    o << line;
  }
  std::snprintf(line, sizeof line,
                "(%lld windows, %lld queries per head; labels: a score >= %.2f, else local >= %.2f (span %lld), else "
                "broad if entropy/max >= %.2f, else mixed)\n",
                static_cast<long long>(r.windows), static_cast<long long>(r.queries), r.options.peak_threshold,
                r.options.local_threshold, static_cast<long long>(r.options.local_span), r.options.broad_threshold);
  o << line;
  return o.str();
}

Image render_heads_grid(const HeadsReport& r) {
  const AttentionMaps& m = r.mean_maps;
  const int64_t T = m.tokens;
  const Rgb ink{30, 30, 30};
  const int cell = static_cast<int>(std::clamp<int64_t>(96 / std::max<int64_t>(T, 1), 1, 8));
  const int panel = static_cast<int>(T) * cell;
  const int caption = 2 * (Image::kGlyphH + 2), gap = 10, pad = 10, title_h = Image::kGlyphH + 8;
  const int col_w = std::max(panel, Image::text_width("previous_token")) + gap;
  const int w = pad * 2 + static_cast<int>(m.n_head) * col_w - gap;
  const int h = pad * 2 + title_h + static_cast<int>(m.n_layer) * (panel + caption + gap) - gap;
  Image img(std::max(w, 360), h);
  img.draw_text(pad, pad, "mean attention per layer (rows) and head (columns)", ink);
  for (int64_t l = 0; l < m.n_layer; ++l)
    for (int64_t hd = 0; hd < m.n_head; ++hd) {
      const int x = pad + static_cast<int>(hd) * col_w;
      const int y = pad + title_h + static_cast<int>(l) * (panel + caption + gap);
      const HeadScores& s = r.heads[static_cast<size_t>(l * m.n_head + hd)];
      char caption_line[64];
      std::snprintf(caption_line, sizeof caption_line, "L%lld H%lld %.2f", static_cast<long long>(l),
                    static_cast<long long>(hd), s.label_score);
      img.draw_text(x, y, caption_line, ink);
      img.draw_text(x, y + Image::kGlyphH + 2, s.label, {20, 60, 140});
      const float* wts = m.weights[static_cast<size_t>(l)].data<float>() + hd * T * T;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
          img.fill_rect(x + static_cast<int>(j) * cell, y + caption + static_cast<int>(i) * cell, cell, cell,
                        m.visible(i, j) ? weight_colour(wts[i * T + j]) : kMaskedColour);
    }
  return img;
}

void write_heads_report(const std::string& dir, const HeadsReport& r, const std::string& subject) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  QKV_CHECK(!ec, "[heads] cannot create the report directory ", dir, ": ", ec.message());
  write_png(dir + "/heads.png", render_heads_grid(r));
  std::ostringstream h;
  h << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>qkv heads: " << html_escape(subject)
    << "</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid "
       "#ccc;padding:2px 6px;text-align:right}td.l{text-align:left}</style></head><body>\n";
  h << "<h1>Attention heads of " << html_escape(subject) << "</h1>\n";
  h << "<p>" << r.windows << " windows of text, " << r.queries
    << " queries per head. Scores are mean attention weights over queries i &ge; 1: on the query itself (diagonal), "
       "the previous token, the first token, separator tokens, keys within "
    << r.options.local_span
    << " positions (local); mean attended distance; entropy (nats) and entropy / ln(i+1).</p>\n";
  h << "<p>Label: the largest of diagonal / previous_token / first_token / separator if &ge; "
    << r.options.peak_threshold << "; else <i>local</i> if local &ge; " << r.options.local_threshold
    << "; else <i>broad</i> if entropy/max &ge; " << r.options.broad_threshold << "; else <i>mixed</i>.</p>\n";
  h << "<p><img src=\"heads.png\" alt=\"mean attention of every head\"></p>\n<table>\n<tr><th>layer</th><th>head</th>"
       "<th>label</th><th>score</th><th>diagonal</th><th>previous</th><th>first</th><th>separator</th><th>local</th>"
       "<th>distance</th><th>entropy</th><th>entropy/max</th></tr>\n";
  char buf[512];
  for (const auto& s : r.heads) {
    std::snprintf(
        buf, sizeof buf,
        "<tr><td>%lld</td><td>%lld</td><td class=\"l\">%s</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
        "<td>%.3f</td><td>%.3f</td><td>%.2f</td><td>%.3f</td><td>%.3f</td></tr>\n",
        static_cast<long long>(s.layer), static_cast<long long>(s.head), s.label.c_str(), s.label_score, s.diagonal,
        s.previous_token, s.first_token, s.separator, s.local, s.mean_distance, s.entropy, s.entropy_norm);
    h << buf;
  }
  h << "</table>\n</body></html>\n";
  train::write_file_atomic(dir + "/index.html", h.str());
}

}  // namespace qkv::analysis
