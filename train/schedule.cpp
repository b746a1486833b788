// LR schedule: nanoGPT's warmup + cosine (see schedule.h for the formula and why).
#include "train/schedule.h"

#include <cmath>
#include <numbers>

#include "train/config.h"

namespace qkv::train {

LrSchedule LrSchedule::from(const TrainSettings& t) {
  LrSchedule s;
  s.kind = t.lr_schedule;
  s.lr = t.lr;
  s.min_lr = t.min_lr;
  s.warmup_steps = t.warmup_steps;
  s.max_steps = t.max_steps;
  return s;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  if (kind == LrScheduleKind::constant) return lr;
  if (step > max_steps) return min_lr;
  // max_steps <= warmup_steps leaves no room to decay: the span is 0 and step == max_steps here.
  const int64_t span = max_steps - warmup_steps;
  if (span <= 0) return min_lr;
  const double r = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * r));
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace qkv::train
