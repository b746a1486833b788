// Test-only fault injection: plants one known attention bug process-wide so tests and
// `qkv leakcheck --self-test` can prove their detectors fire. Set only from test code and the
// self-test (never from configs), always through ScopedFault so it cannot leak past a scope.
//
// The attention-level faults live in the mask predicate and head mapping shared by both kernels
// (attention/mask.h); softmax_over_queries and mask_after_softmax route the call to the reference
// kernel with the fault applied. The model-level ones are read by nn/ and train/.
#pragma once
#include <atomic>

namespace qkv::attn {

enum class Fault {
  none,
  causal_reversed,       // causal keeps j >= pos_i instead of j <= pos_i (reads the future)
  softmax_over_queries,  // softmax along the query axis instead of the key axis
  ignore_key_padding,    // key_padding / key_lengths ignored
  mask_after_softmax,    // weights multiplied by the mask after softmax instead of -inf before
  top_left_causal,       // causal without the Nk - Nq offset (query i at position i)
  window_off_by_one,     // window keeps pos_i - w <= j (one key too many)
  gqa_modulo,            // query head h reads kv head h % Hkv instead of h / (Hq / Hkv)
  // model level (used by nn/ and train/)
  scale_d_model,         // scale by 1/sqrt(d_model) instead of 1/sqrt(head dim)
  rope_cache_relative,   // RoPE applied by position within the cache chunk, not absolute position
  dropout_in_eval,       // attention / residual dropout left on in eval mode
};

inline std::atomic<Fault>& fault_slot() {
  static std::atomic<Fault> slot{Fault::none};
  return slot;
}
inline Fault active_fault() { return fault_slot().load(std::memory_order_relaxed); }
inline Fault fault() { return active_fault(); }
inline bool fault_active(Fault f) { return active_fault() == f; }

// Plants `f` for the lifetime of the guard, restoring the previous fault afterwards.
class ScopedFault {
 public:
  explicit ScopedFault(Fault f) : prev_(fault_slot().exchange(f)) {}
  ~ScopedFault() { fault_slot().store(prev_); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;

 private:
  Fault prev_;
};

inline const char* fault_name(Fault f) {
  switch (f) {
    case Fault::none: return "none";
    case Fault::causal_reversed: return "causal_reversed";
    case Fault::softmax_over_queries: return "softmax_over_queries";
    case Fault::ignore_key_padding: return "ignore_key_padding";
    case Fault::mask_after_softmax: return "mask_after_softmax";
    case Fault::top_left_causal: return "top_left_causal";
    case Fault::window_off_by_one: return "window_off_by_one";
    case Fault::gqa_modulo: return "gqa_modulo";
    case Fault::scale_d_model: return "scale_d_model";
    case Fault::rope_cache_relative: return "rope_cache_relative";
    case Fault::dropout_in_eval: return "dropout_in_eval";
  }
  return "?";
}

}  // namespace qkv::attn
