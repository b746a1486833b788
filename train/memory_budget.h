// What a model needs in memory, against what this process can have: checked before a model is
// built, so a size that cannot fit is refused with both figures instead of ending in
// std::bad_alloc (or in the kernel's OOM killer) part way through.
//
// The need is analysis::estimate_cost's (the cost model `qkv cost` prints, held within 15% of the
// allocator's peak by tests/analysis/test_cost.cpp):
//   inference: the parameters (float32) + the KV cache of one sequence of model.block_size tokens;
//   training:  the peak tensor bytes of one step of train.batch_size rows of train.seq_len tokens
//              (parameters, gradients, AdamW moments, activations, logits and backward's transients).
// The memory is the least of the physical memory (sysconf), the cgroup's limit (memory.max) and
// the address-space limit (RLIMIT_AS, `ulimit -v`). The check refuses only what cannot fit even on
// an idle machine, so it does not depend on what else is running.
#pragma once
#include <cstdint>
#include <string>

#include "train/config.h"

namespace qkv::train {

enum class ModelUse { inference, training };

struct MachineMemory {
  int64_t bytes = 0;
  std::string what;  // "this machine has", "this cgroup allows", "ulimit -v allows"
};
MachineMemory machine_memory();

// Throws qkv::Error "model needs ~X GiB (parameters ..., ...), this machine has Y GiB" when the
// estimate for `use` of cfg's model (resolved; vocab: the tokenizer's when model.vocab_size is 0)
// exceeds machine_memory(). Allocates nothing.
void check_memory_budget(const Config& cfg, int64_t vocab, ModelUse use);

// "1.5 GiB": bytes in GiB with 3 significant digits (TiB and PiB past 1024 GiB).
std::string gib_text(double bytes);

}  // namespace qkv::train
