// leakcheck's outputs: the `--json` object (leakcheck.h), the text tables, and the HTML report
// (tables plus attention heatmaps), every file written atomically (temporary file, fsync, rename).
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>

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

nlohmann::json leakcheck_json(const LeakCheckReport& r, const SelfTestResult* st) {
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

void write_leakcheck_report(const std::string& dir, const LeakCheckReport& r, const SelfTestResult* st,
                            const nn::DecoderModel& model, const std::vector<int32_t>& probe_ids,
                            const Tokenizer* tok) {
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
  h += "<h2>Attention</h2>\n<p>Weights of the reference kernel on the probe text (" + std::to_string(maps.tokens) +
       " tokens); rows are queries, columns keys, grey cells masked.</p>\n";
  h += "<p>Layer " + std::to_string(layer) + ", head 0:<br><img src=\"attention_map.png\" alt=\"attention map\"></p>\n";
  h += "<p>Every layer and head:<br><img src=\"attention_grid.png\" alt=\"attention grid\"></p>\n";
  h += "</body></html>\n";
  train::write_file_atomic(dir + "/index.html", h);
}

}  // namespace qkv::analysis
