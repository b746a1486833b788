#include "analysis/plot.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "data/input_file.h"
#include "tensor/error.h"
#include "train/atomic_file.h"

namespace qkv::analysis {
namespace {

struct Series {
  std::vector<double> x, y;
};

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// An axis over finite values, kept in half units (h = v / 2) so that its span h1 - h0 is finite
// even for values from -DBL_MAX to DBL_MAX.
struct Axis {
  double h0 = INFINITY, h1 = -INFINITY;
  void add(double v) {
    h0 = std::min(h0, v / 2);
    h1 = std::max(h1, v / 2);
  }
  void finish(double pad_fraction) {
    if (h1 <= h0) h1 = h0 + std::max(0.5, std::abs(h0) / 2);  // one value: a range around it
    const double pad = pad_fraction * (h1 - h0);
    h0 -= pad;
    h1 += pad;
  }
  double fraction(double v) const { return (v / 2 - h0) / (h1 - h0); }
  double at(double t) const { return std::clamp((h0 + (h1 - h0) * t) * 2, -DBL_MAX, DBL_MAX); }
};

}  // namespace

void plot_metrics(const std::string& metrics_path, const std::string& out_svg) {
  std::istringstream in(read_input_file(metrics_path, kMetricsLogCap, "a metrics log"));
  Series train, val;
  std::string line;
  int lineno = 0;
  // A number of the line, or NaN where it is missing or not a number; a step that is there must
  // be a number.
  auto number = [&](const nlohmann::json& j, const char* key) -> double {
    if (!j.contains(key) || !j[key].is_number()) return NAN;
    return j[key].get<double>();
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) { fail(metrics_path, ":", lineno, ": not a JSON line"); }
    if (!j.is_object()) fail(metrics_path, ":", lineno, ": not a JSON object");
    if (!j.contains("step")) continue;
    if (!j["step"].is_number()) fail(metrics_path, ":", lineno, ": \"step\" is not a number");
    const double step = j["step"].get<double>();
    for (auto [series, key] : {std::pair{&train, "loss"}, std::pair{&val, "val_loss"}}) {
      const double y = number(j, key);
      if (!std::isfinite(step) || !std::isfinite(y)) continue;
      series->x.push_back(step);
      series->y.push_back(y);
    }
  }
  QKV_CHECK(!train.x.empty() || !val.x.empty(), metrics_path, ": no finite loss values to plot");

  Axis ax, ay;
  for (const Series* s : {&train, &val})
    for (size_t i = 0; i < s->x.size(); ++i) {
      ax.add(s->x[i]);
      ay.add(s->y[i]);
    }
  ax.finish(0);
  ay.finish(0.05);

  const double W = 800, H = 480, L = 70, R = 20, T = 40, Bm = 50;
  auto px = [&](double x) { return L + ax.fraction(x) * (W - L - R); };
  auto py = [&](double y) { return H - Bm - ay.fraction(y) * (H - T - Bm); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << W / 2 << "' y='24' text-anchor='middle' font-size='16'>loss</text>\n";
  // Axes with 5 ticks each.
  svg << "<line x1='" << L << "' y1='" << H - Bm << "' x2='" << W - R << "' y2='" << H - Bm << "' stroke='black'/>\n";
  svg << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - Bm << "' stroke='black'/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = ax.at(i / 5.0), yv = ay.at(i / 5.0);
    svg << "<text x='" << px(xv) << "' y='" << H - Bm + 18 << "' text-anchor='middle'>" << fmt(xv) << "</text>\n";
    svg << "<text x='" << L - 6 << "' y='" << py(yv) + 4 << "' text-anchor='end'>" << fmt(yv) << "</text>\n";
    svg << "<line x1='" << L << "' y1='" << py(yv) << "' x2='" << W - R << "' y2='" << py(yv) << "' stroke='#ddd'/>\n";
  }
  svg << "<text x='" << W / 2 << "' y='" << H - 12 << "' text-anchor='middle'>step</text>\n";
  auto polyline = [&](const Series& s, const char* color) {
    if (s.x.empty()) return;
    svg << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
    for (size_t i = 0; i < s.x.size(); ++i) svg << px(s.x[i]) << "," << py(s.y[i]) << " ";
    svg << "'/>\n";
  };
  polyline(train, "#1f77b4");
  polyline(val, "#d62728");
  svg << "<text x='" << W - R - 150 << "' y='" << T + 10 << "' fill='#1f77b4'>train loss</text>\n";
  if (!val.x.empty()) svg << "<text x='" << W - R - 150 << "' y='" << T + 26 << "' fill='#d62728'>val loss</text>\n";
  svg << "</svg>\n";
  train::write_file_atomic(out_svg, svg.str());
}

}  // namespace qkv::analysis
