// The run's log: OUT_DIR/metrics.jsonl (one JSON object per logged step, written by rank 0 only)
// and the progress line on stderr. Timing is kept per window: the steps since the last logged
// line, so tokens_per_s and ms_per_step describe those steps, not the run so far.
//
// metrics.jsonl line: step, loss, lr, grad_norm, tokens_per_s, ms_per_step, fully_masked_rows,
// skipped_steps; val_loss on steps that evaluated; comm_ms_per_step with several ranks.
// Progress: "step S/N  loss L[ val V]  lr R  T tok/s  M ms/step  ETA m:ss", rewritten in place
// (\r) on a terminal, one line per record otherwise.
#pragma once
#include <chrono>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace qkv::train {

// One logged step: what the step did, plus the sums over ranks the caller gathered.
struct LogRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t fully_masked_rows = 0, skipped_steps = 0;
  std::optional<double> val_loss;      // this step evaluated
  std::optional<double> comm_seconds;  // several ranks: collective time over the window
};

class RunLog {
 public:
  using Clock = std::chrono::steady_clock;
  // writes: this rank writes metrics_path (truncated, or appended to when `append`: a resume).
  // progress: print the progress line (`tty`: in place). The ETA extrapolates from run_start
  // over the steps since first_step.
  RunLog(std::string metrics_path, bool writes, bool append, bool progress, bool tty, int64_t first_step,
         int64_t max_steps, Clock::time_point run_start);

  // Adds one step to the current window.
  void count_step(double ms, int64_t tokens);
  int64_t window_steps() const { return window_steps_; }
  // Writes the metrics line and the progress line for the window, then starts a new one, and
  // returns the metrics line's object. A failed write (full disk) throws naming metrics_path.
  nlohmann::json record(const LogRecord& r, bool end_line);
  const std::string& metrics_path() const { return path_; }

 private:
  std::string path_;
  std::ofstream metrics_;
  bool writes_, progress_, tty_;
  int64_t first_step_, max_steps_;
  Clock::time_point run_start_;
  double window_ms_ = 0;
  int64_t window_steps_ = 0, window_tokens_ = 0;
};

}  // namespace qkv::train
