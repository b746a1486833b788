#include "analysis/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

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

}  // namespace

void plot_metrics(const std::string& metrics_path, const std::string& out_svg) {
  std::ifstream in(metrics_path);
  QKV_CHECK(in.good(), metrics_path, ": cannot open metrics file");
  Series train, val;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) { fail(metrics_path, ":", lineno, ": not a JSON line"); }
    if (!j.contains("step")) continue;
    const double step = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number()) {
      train.x.push_back(step);
      train.y.push_back(j["loss"].get<double>());
    }
    if (j.contains("val_loss") && j["val_loss"].is_number()) {
      val.x.push_back(step);
      val.y.push_back(j["val_loss"].get<double>());
    }
  }
  QKV_CHECK(!train.x.empty() || !val.x.empty(), metrics_path, ": no loss values to plot");

  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series* s : {&train, &val})
    for (size_t i = 0; i < s->x.size(); ++i) {
      if (!std::isfinite(s->y[i])) continue;
      x0 = std::min(x0, s->x[i]);
      x1 = std::max(x1, s->x[i]);
      y0 = std::min(y0, s->y[i]);
      y1 = std::max(y1, s->y[i]);
    }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;

  const double W = 800, H = 480, L = 70, R = 20, T = 40, Bm = 50;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - Bm - (y - y0) / (y1 - y0) * (H - T - Bm); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  svg << "<text x='" << W / 2 << "' y='24' text-anchor='middle' font-size='16'>loss</text>\n";
  // Axes with 5 ticks each.
  svg << "<line x1='" << L << "' y1='" << H - Bm << "' x2='" << W - R << "' y2='" << H - Bm << "' stroke='black'/>\n";
  svg << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - Bm << "' stroke='black'/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double xv = x0 + (x1 - x0) * i / 5, yv = y0 + (y1 - y0) * i / 5;
    svg << "<text x='" << px(xv) << "' y='" << H - Bm + 18 << "' text-anchor='middle'>" << fmt(xv) << "</text>\n";
    svg << "<text x='" << L - 6 << "' y='" << py(yv) + 4 << "' text-anchor='end'>" << fmt(yv) << "</text>\n";
    svg << "<line x1='" << L << "' y1='" << py(yv) << "' x2='" << W - R << "' y2='" << py(yv) << "' stroke='#ddd'/>\n";
  }
  svg << "<text x='" << W / 2 << "' y='" << H - 12 << "' text-anchor='middle'>step</text>\n";
  auto polyline = [&](const Series& s, const char* color) {
    if (s.x.empty()) return;
    svg << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) svg << px(s.x[i]) << "," << py(s.y[i]) << " ";
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
