// leakcheck's outputs: the `--json` object (leakcheck.h), the text tables, and the HTML report
// (tables plus attention heatmaps), every file written atomically (temporary file, fsync, rename).
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <tuple>
#include <algorithm>

#include "train/atomic_file.h"
#include "analysis/html.h"
#include "analysis/attention_map.h"
#include "analysis/leakcheck.h"
#include "analysis/png.h"

namespace qkv::analysis {

int LeakCheckReport::passed() const {
  int n = 0;
  for (const auto& c : checks) n += c.pass;
  return n;
}
int LeakCheckReport::failed() const { return static_cast<int>(checks.size()) - passed(); }

namespace {

// JSON has no infinity: a check that could not be measured (or blew up) reports null.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

std::string caught_list(const std::vector<CaughtBy>& v, size_t max_items) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + v[i].check + "@" + v[i].model;
  if (v.size() > max_items) s += ", +" + std::to_string(v.size() - max_items) + " more";
  return s.empty() ? "-" : s;
}

}  // namespace

nlohmann::json leakcheck_json(const LeakCheckReport& r, const SelfTestResult* st, const NumericsComparison* cmp) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : r.checks) {
    nlohmann::json j = {{"name", c.name},
                        {"value", number(c.value)},
                        {"threshold", c.threshold},
                        {"pass", c.pass},
                        {"detail", c.detail}};
    if (!c.per_position.empty()) {
      nlohmann::json per = nlohmann::json::array();
      for (double v : c.per_position) per.push_back(number(v));
      j["per_position"] = per;
      j["diverges_at"] = c.diverges_at >= 0 ? nlohmann::json(c.diverges_at) : nlohmann::json();
    }
    checks.push_back(j);
  }
  nlohmann::json out = {{"subject", r.subject}, {"checks", checks}, {"passed", r.passed()}, {"failed", r.failed()}};
  if (!r.skipped.empty()) {
    nlohmann::json sk = nlohmann::json::array();
    for (const auto& [name, why] : r.skipped) sk.push_back({{"name", name}, {"reason", why}});
    out["skipped"] = sk;
  }
  if (st) {
    auto caught = [](const std::vector<CaughtBy>& v) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& c : v)
        a.push_back({{"check", c.check}, {"model", c.model}, {"value", number(c.value)}, {"threshold", c.threshold}});
      return a;
    };
    nlohmann::json faults = nlohmann::json::array(), models = nlohmann::json::array();
    for (const auto& f : st->faults)
      faults.push_back({{"fault", fault_name(f.fault)},
                        {"detected", f.detected},
                        {"needs", f.exposed_by},
                        {"caught_by", caught(f.caught_by)}});
    for (const auto& [name, desc] : st->models) models.push_back({{"name", name}, {"description", desc}});
    out["self_test"] = {{"planted", st->planted()},
                        {"detected", st->detected()},
                        {"false_alarms", static_cast<int>(st->false_alarms.size())},
                        {"pass", st->pass()},
                        {"models", models},
                        {"faults", faults},
                        {"false_alarm_checks", caught(st->false_alarms)}};
  }
  if (cmp) {
    auto mode = [](const LeakCheck& c) {
      nlohmann::json per = nlohmann::json::array();
      for (double v : c.per_position) per.push_back(number(v));
      return nlohmann::json{{"max_abs_delta", number(c.value)},
                            {"threshold", c.threshold},
                            {"pass", c.pass},
                            {"diverges_at", c.diverges_at >= 0 ? nlohmann::json(c.diverges_at) : nlohmann::json()},
                            {"per_position", per},
                            {"detail", c.detail}};
    };
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < cmp->standard.size() && i < cmp->invariant.size(); ++i)
      rows.push_back({{"name", cmp->standard[i].name},
                      {"standard", mode(cmp->standard[i])},
                      {"invariant", mode(cmp->invariant[i])}});
    out["consistency"] = rows;
  }
  return out;
}

std::string leakcheck_table(const LeakCheckReport& r) {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %11s %11s  %-4s  %s\n", "check", "value", "threshold", "pass", "detail");
  s += line;
  for (const auto& c : r.checks) {
    std::snprintf(line, sizeof line, "%-28s %11s %11s  %-4s  ", c.name.c_str(), sci(c.value).c_str(),
                  sci(c.threshold).c_str(), c.pass ? "ok" : "FAIL");
    s += line + c.detail + "\n";
  }
  for (const auto& [name, why] : r.skipped) s += "skipped: " + name + " (" + why + ")\n";
  s += std::to_string(r.passed()) + " passed, " + std::to_string(r.failed()) + " failed\n";
  return s;
}

std::string self_test_table(const SelfTestResult& st) {
  std::string s = "self-test models:\n";
  for (const auto& [name, desc] : st.models) s += "  " + name + ": " + desc + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %-8s %s\n", "planted fault", "detected", "caught by (check@model)");
  s += line;
  for (const auto& f : st.faults) {
    std::snprintf(line, sizeof line, "%-22s %-8s ", fault_name(f.fault), f.detected ? "yes" : "NO");
    s += line + caught_list(f.caught_by, 5) + "   [needs " + f.exposed_by + "]\n";
  }
  s += "clean models: " + std::to_string(st.false_alarms.size()) + " false alarm(s)";
  if (!st.false_alarms.empty()) s += ": " + caught_list(st.false_alarms, 20);
  s += "\nself-test: " + std::to_string(st.detected()) + "/" + std::to_string(st.planted()) +
       " planted faults detected, " + (st.pass() ? "PASS" : "FAIL") + "\n";
  return s;
}

namespace {
std::string divergence(const LeakCheck& c) {
  return c.diverges_at >= 0 ? "position " + std::to_string(c.diverges_at) : "none";
}
}  // namespace

std::string numerics_comparison_table(const NumericsComparison& cmp) {
  std::string s =
      "training vs inference consistency, max |dlogit| (trainer_vs_sampler: |dlog-prob|) by numerics mode:\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %11s %-4s %-15s %11s %-4s %-15s\n", "check", "standard", "pass",
                "greedy differs", "invariant", "pass", "greedy differs");
  s += line;
  for (size_t i = 0; i < cmp.standard.size() && i < cmp.invariant.size(); ++i) {
    const LeakCheck &a = cmp.standard[i], &b = cmp.invariant[i];
    std::snprintf(line, sizeof line, "%-20s %11s %-4s %-15s %11s %-4s %-15s\n", a.name.c_str(), sci(a.value).c_str(),
                  a.pass ? "ok" : "FAIL", divergence(a).c_str(), sci(b.value).c_str(), b.pass ? "ok" : "FAIL",
                  divergence(b).c_str());
    s += line;
  }
  return s;
}

namespace {

// A straight line of 1-pixel dots between two points (Bresenham).
void draw_line(Image& img, int x0, int y0, int x1, int y1, Rgb c) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    img.set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

constexpr Rgb kStandardColour{31, 119, 180}, kInvariantColour{230, 110, 0}, kAxisColour{90, 90, 90},
    kGridColour{225, 225, 225};

}  // namespace

Image render_gap_plot(const LeakCheck& standard, const LeakCheck& invariant) {
  constexpr int W = 640, H = 300, left = 64, right = 16, top = 44, bottom = 36;
  Image img(W, H);
  const int pw = W - left - right, ph = H - top - bottom;
  // Decades from one below the smallest nonzero gap (the floor, where zeros sit) to the largest.
  double lo = INFINITY, hi = 0;
  int64_t T = 1;
  for (const LeakCheck* c : {&standard, &invariant}) {
    T = std::max<int64_t>(T, static_cast<int64_t>(c->per_position.size()));
    for (double v : c->per_position)
      if (v > 0 && std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  int lo_exp = -8, hi_exp = -6;
  if (hi > 0) {
    lo_exp = static_cast<int>(std::floor(std::log10(lo))) - 1;
    hi_exp = std::max(static_cast<int>(std::ceil(std::log10(hi))), lo_exp + 2);
  }
  const auto y_of = [&](double v) {
    if (!(v > 0)) return top + ph;  // zero: the floor line
    const double f = std::isfinite(v) ? (std::log10(v) - lo_exp) / (hi_exp - lo_exp) : 1.0;
    return top + ph - static_cast<int>(std::lround(std::clamp(f, 0.0, 1.0) * ph));
  };
  const auto x_of = [&](int64_t t) { return left + (T > 1 ? static_cast<int>(t * (pw - 1) / (T - 1)) : pw / 2); };
  for (int e = lo_exp; e <= hi_exp; ++e) {
    const int y = y_of(std::pow(10.0, e));
    img.fill_rect(left, y, pw, 1, kGridColour);
    const std::string label = e == lo_exp ? "0" : "1e" + std::to_string(e);
    img.draw_text(left - 6 - Image::text_width(label), y - 3, label, kAxisColour);
  }
  img.fill_rect(left, top, 1, ph + 1, kAxisColour);
  img.fill_rect(left, top + ph, pw, 1, kAxisColour);
  for (int64_t t : {int64_t{0}, (T - 1) / 2, T - 1}) {
    const std::string label = std::to_string(t);
    img.fill_rect(x_of(t), top + ph, 1, 4, kAxisColour);
    img.draw_text(x_of(t) - Image::text_width(label) / 2, top + ph + 7, label, kAxisColour);
  }
  img.draw_text(left + pw / 2 - Image::text_width("position") / 2, top + ph + 20, "position", kAxisColour);
  const std::string measure = standard.name == "trainer_vs_sampler" ? "|dlog-prob|" : "|dlogit|";
  img.draw_text(4, 4, standard.name + ": " + measure + " by position (log scale; 0 on the floor line)", {0, 0, 0});
  int lx = left;
  for (const auto& [c, colour, mode] :
       {std::tuple{&standard, kStandardColour, "standard"}, std::tuple{&invariant, kInvariantColour, "invariant"}}) {
    img.fill_rect(lx, 22, 10, 8, colour);
    const std::string label = std::string(mode) + " (max " + sci(c->value) + ")";
    lx += 14 + img.draw_text(lx + 14, 22, label, {0, 0, 0}) + 16;
    const auto& v = c->per_position;
    for (size_t t = 0; t < v.size(); ++t) {
      const int x = x_of(static_cast<int64_t>(t)), y = y_of(v[t]);
      if (t > 0) draw_line(img, x_of(static_cast<int64_t>(t) - 1), y_of(v[t - 1]), x, y, colour);
      img.fill_rect(x - 1, y - 1, 3, 3, colour);
    }
  }
  return img;
}

void write_leakcheck_report(const std::string& dir, const LeakCheckReport& r, const SelfTestResult* st,
                            const nn::DecoderModel& model, const std::vector<int32_t>& probe_ids, const Tokenizer* tok,
                            const NumericsComparison* cmp) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  QKV_CHECK(!ec, "[leakcheck] cannot create report directory ", dir, ": ", ec.message());
  const AttentionMaps maps = compute_attention_maps(model, probe_ids, tok);
  const int64_t layer = maps.n_layer - 1;
  write_png(dir + "/attention_map.png", render_attention_map(maps, layer, 0));
  write_png(dir + "/attention_grid.png", render_attention_grid(maps));

  std::string h;
  h += "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>qkv leakcheck</title>\n<style>\n"
       "body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}"
       "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
       "td.num{text-align:right;font-family:monospace}.ok{color:#17702a;font-weight:bold}"
       ".fail{color:#b00020;font-weight:bold}.detail{color:#555;font-size:90%}img{border:1px solid #ddd}\n"
       "</style></head><body>\n";
  h += "<h1>qkv leakcheck</h1>\n<p>" + html_escape(r.subject) + "</p>\n";
  h += "<p><b>" + std::to_string(r.passed()) + " passed, " + std::to_string(r.failed()) + " failed</b></p>\n";
  h += "<table><tr><th>check</th><th>value</th><th>threshold</th><th>pass</th><th>how it was measured</th></tr>\n";
  for (const auto& c : r.checks)
    h += "<tr><td>" + html_escape(c.name) + "</td><td class=\"num\">" + sci(c.value) + "</td><td class=\"num\">" +
         sci(c.threshold) + "</td><td class=\"" + (c.pass ? "ok\">ok" : "fail\">FAIL") + "</td><td class=\"detail\">" +
         html_escape(c.detail) + "</td></tr>\n";
  h += "</table>\n";
  for (const auto& [name, why] : r.skipped)
    h += "<p>skipped: " + html_escape(name) + " (" + html_escape(why) + ")</p>\n";
  if (st) {
    h += "<h2>Self-test: planted faults</h2>\n<p><b>" + std::to_string(st->detected()) + "/" +
         std::to_string(st->planted()) + " detected, " + std::to_string(st->false_alarms.size()) +
         " false alarm(s) on the clean models: " + (st->pass() ? "PASS" : "FAIL") + "</b></p>\n<ul>\n";
    for (const auto& [name, desc] : st->models)
      h += "<li><b>" + html_escape(name) + "</b>: " + html_escape(desc) + "</li>\n";
    h += "</ul>\n<table><tr><th>planted fault</th><th>detected</th><th>caught by "
         "(check@model)</th><th>needs</th></tr>\n";
    for (const auto& f : st->faults)
      h += std::string("<tr><td>") + fault_name(f.fault) + "</td><td class=\"" +
           (f.detected ? "ok\">yes" : "fail\">NO") + "</td><td class=\"detail\">" +
           html_escape(caught_list(f.caught_by, 100)) + "</td><td class=\"detail\">" + html_escape(f.exposed_by) +
           "</td></tr>\n";
    h += "</table>\n";
    if (!st->false_alarms.empty())
      h += "<p class=\"fail\">false alarms: " + html_escape(caught_list(st->false_alarms, 100)) + "</p>\n";
  }
  if (cmp) {
    h += "<h2>Training vs inference consistency</h2>\n<p>Each check computes the same logits two ways (the "
         "table above says how), here under both numerics modes whatever mode the command ran in: "
         "<b>standard</b> (the fastest kernel for each op; the ways may round differently) and <b>invariant</b> "
         "(every op reduces in one fixed order, so a token's logits are bitwise a function of its prefix and "
         "the weights; the threshold is 0). max |Δ| is on the logits (trainer_vs_sampler: on the per-token "
         "log-probs); \"greedy differs\" is the first position where the two ways' argmax next token "
         "differs.</p>\n";
    h += "<table><tr><th>check</th><th>standard max |Δ|</th><th>threshold</th><th>pass</th><th>greedy "
         "differs</th><th>invariant max |Δ|</th><th>threshold</th><th>pass</th><th>greedy differs</th></tr>\n";
    auto cells = [](const LeakCheck& c) {
      return "<td class=\"num\">" + sci(c.value) + "</td><td class=\"num\">" + sci(c.threshold) + "</td><td class=\"" +
             (c.pass ? "ok\">ok" : "fail\">FAIL") + "</td><td>" + divergence(c) + "</td>";
    };
    const size_t n = std::min(cmp->standard.size(), cmp->invariant.size());
    for (size_t i = 0; i < n; ++i)
      h += "<tr><td>" + html_escape(cmp->standard[i].name) + "</td>" + cells(cmp->standard[i]) +
           cells(cmp->invariant[i]) + "</tr>\n";
    h += "</table>\n";
    for (size_t i = 0; i < n; ++i) {
      const std::string file = "consistency_" + cmp->standard[i].name + ".png";
      write_png(dir + "/" + file, render_gap_plot(cmp->standard[i], cmp->invariant[i]));
      h += "<p><img src=\"" + file + "\" alt=\"" + html_escape(cmp->standard[i].name) + " gap by position\"></p>\n";
    }
  }
  h += "<h2>Attention</h2>\n<p>Weights of the reference kernel on the probe text (" + std::to_string(maps.tokens) +
       " tokens); rows are queries, columns keys, grey cells masked.</p>\n";
  h += "<p>Layer " + std::to_string(layer) + ", head 0:<br><img src=\"attention_map.png\" alt=\"attention map\"></p>\n";
  h += "<p>Every layer and head:<br><img src=\"attention_grid.png\" alt=\"attention grid\"></p>\n";
  h += "</body></html>\n";
  train::write_file_atomic(dir + "/index.html", h);
}

}  // namespace qkv::analysis
