#include "train/run_log.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tensor/error.h"

namespace qkv::train {
namespace {

std::string format_duration(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

}  // namespace

RunLog::RunLog(std::string metrics_path, bool writes, bool append, bool progress, bool tty, int64_t first_step,
               int64_t max_steps, Clock::time_point run_start)
    : path_(std::move(metrics_path)),
      writes_(writes),
      progress_(progress),
      tty_(tty),
      first_step_(first_step),
      max_steps_(max_steps),
      run_start_(run_start) {
  if (!writes_) return;
  metrics_.open(path_, append ? std::ios::app : std::ios::trunc);
  QKV_CHECK(metrics_.good(), path_, ": cannot write metrics");
}

void RunLog::count_step(double ms, int64_t tokens) {
  window_ms_ += ms;
  window_steps_++;
  window_tokens_ += tokens;
}

nlohmann::json RunLog::record(const LogRecord& r, bool end_line) {
  const double tokens_per_s = window_tokens_ / (window_ms_ / 1000.0);
  const double ms_per_step = window_ms_ / static_cast<double>(window_steps_);
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_s", tokens_per_s},
                      {"ms_per_step", ms_per_step},
                      {"fully_masked_rows", r.fully_masked_rows},
                      {"skipped_steps", r.skipped_steps}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  if (r.comm_seconds) j["comm_ms_per_step"] = 1000.0 * *r.comm_seconds / static_cast<double>(window_steps_);
  if (writes_) {
    errno = 0;
    metrics_ << j.dump() << "\n";
    metrics_.flush();
    // A full disk (or metrics.jsonl pointing at /dev/full) must stop the run, not lose the log.
    QKV_CHECK(metrics_.good(), path_, ": cannot write metrics (", errno ? std::strerror(errno) : "write failed", ")");
  }
  if (progress_) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start_).count();
    const double eta = elapsed / static_cast<double>(r.step - first_step_) * static_cast<double>(max_steps_ - r.step);
    char line[256];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f%s  lr %.2e  %.0f tok/s  %.1f ms/step  ETA %s",
                  static_cast<long long>(r.step), static_cast<long long>(max_steps_), r.loss,
                  r.val_loss ? (" val " + std::to_string(*r.val_loss).substr(0, 6)).c_str() : "", r.lr, tokens_per_s,
                  ms_per_step, format_duration(eta).c_str());
    std::fprintf(stderr, tty_ ? "\r%-110s%s" : "%s%s\n", line, tty_ && end_line ? "\n" : "");
  }
  window_ms_ = 0;
  window_steps_ = window_tokens_ = 0;
  return j;
}

}  // namespace qkv::train
