#include "train/memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "analysis/cost.h"
#include "tensor/error.h"

namespace qkv::train {

namespace {

// The cgroup v2 memory.max (or v1 memory.limit_in_bytes) of this process; 0 when none is set.
int64_t cgroup_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    long long v = 0;
    if (in >> v && v > 0) return v;  // "max" reads as no number: no limit
  }
  return 0;
}

}  // namespace

MachineMemory machine_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  MachineMemory m{pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : std::numeric_limits<int64_t>::max(),
                  "this machine has"};
  if (const int64_t cg = cgroup_limit(); cg > 0 && cg < m.bytes) m = {cg, "this cgroup allows"};
  // An address-space limit counts what the process has mapped already (code, libraries, stacks).
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    std::ifstream statm("/proc/self/statm");
    long long mapped_pages = 0;
    statm >> mapped_pages;
    const int64_t left = static_cast<int64_t>(lim.rlim_cur) - static_cast<int64_t>(mapped_pages) * page;
    if (left < m.bytes) m = {std::max<int64_t>(left, 0), "ulimit -v leaves"};
  }
  return m;
}

std::string gib_text(double bytes) {
  const char* units[] = {"GiB", "TiB", "PiB", "EiB"};
  double v = bytes / (1024.0 * 1024 * 1024);
  int i = 0;
  while (v >= 1024 && i < 3) {
    v /= 1024;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g %s", v, units[i]);
  return buf;
}

void check_memory_budget(const Config& cfg, int64_t vocab, ModelUse use) {
  analysis::CostOptions o;
  o.vocab = vocab;
  const analysis::CostReport r = analysis::estimate_cost(cfg, o);
  const double params = 4.0 * static_cast<double>(r.params);
  std::string parts;
  double need = 0;
  // train.device = "cuda": the model is built and initialised here, then moved; the step's
  // tensors live on the device, whose memory this check does not read.
  if (use == ModelUse::training && cfg.train.device == Device::cuda) use = ModelUse::inference;
  if (use == ModelUse::training) {
    need = static_cast<double>(r.peak_step_bytes) + static_cast<double>(r.row_tree_bytes);
    const double act = static_cast<double>(r.recompute ? r.activation_bytes_recompute : r.activation_bytes);
    parts =
        "parameters " + gib_text(params) + ", gradients " + gib_text(params) + ", AdamW moments " +
        gib_text(2 * params) + ", activations " +
        (r.row_tree ? gib_text(act / static_cast<double>(r.batch)) + " for one row of train.seq_len " +
                          std::to_string(r.train_tokens) + " tokens (invariant numerics runs rows alone), row tree " +
                          gib_text(static_cast<double>(r.row_tree_bytes))
                    : gib_text(act) + " for train.batch_size " + std::to_string(r.batch) + " x train.seq_len " +
                          std::to_string(r.train_tokens) + " tokens");
  } else {
    const double kv = static_cast<double>(r.kv_cache_bytes_per_sequence_f32);
    need = params + kv;
    parts = "parameters " + gib_text(params) + ", KV cache of " + std::to_string(r.context) + " tokens " + gib_text(kv);
  }
  const MachineMemory mem = machine_memory();
  QKV_CHECK(need <= static_cast<double>(mem.bytes), "model needs ~", gib_text(need),
            use == ModelUse::training ? " for a training step (" : " (", parts, "), ", mem.what, " ",
            gib_text(static_cast<double>(mem.bytes)), ": make model.n_layer, model.n_embd",
            use == ModelUse::training ? ", train.batch_size or train.seq_len" : " or model.vocab_size", " smaller",
            use == ModelUse::training && !r.recompute ? " (or set train.recompute = true)" : "");
}

}  // namespace qkv::train
