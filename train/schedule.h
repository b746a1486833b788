// Learning-rate schedule: linear warmup, then cosine decay to min_lr at max_steps (or constant).
//
// We follow nanoGPT's get_lr exactly, with `step` the 0-based index of the optimizer step about
// to be taken:
//   step <  warmup:           lr * (step + 1) / (warmup + 1)
//   warmup <= step <= max:    min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr),
//                             r = (step - warmup) / (max_steps - warmup)
//   step >  max_steps:        min_lr
// The "+1"s make the first step use a small but non-zero lr (a warmup starting at exactly 0 would
// waste the first step) and reach lr at step == warmup. "constant" keeps the same warmup and then
// stays at lr. The cosine ends at min_lr on step == max_steps, one past the last step of a run of
// max_steps steps, as nanoGPT's lr_decay_iters = max_iters does.
#pragma once
#include <cstdint>
#include <string>

namespace qkv {
struct TrainSettings;
}

namespace qkv::train {

enum class LrScheduleKind { cosine, constant };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::cosine;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t max_steps = 100;

  static LrSchedule from(const TrainSettings& t);  // train.lr, min_lr, warmup_steps, max_steps, lr_schedule
  double at(int64_t step) const;                   // the lr for 0-based optimizer step `step`
};

}  // namespace qkv::train
