// The numerics mode: which kernels the forward ops take where more than one is correct.
//
//   standard:  the fastest kernel for each op (OpenBLAS / cuBLAS GEMMs). A value may depend on
//              the batch it was computed in: the BLAS picks blockings and kernels by the matrix
//              shape, so a token's logits from one parallel forward differ in the last bits from
//              the same token decoded alone.
//   invariant: every op reduces each output element in one fixed order that depends on nothing
//              but the element's own inputs (tensor/cpu/invariant_matmul.h for the Linear GEMMs;
//              docs/consistency.md lists every op of the model's forward and why it holds). A
//              token's hidden states and logits are then bitwise a function of its prefix and the
//              weights: the same in the training step, in prefill chunks of any size, one token at
//              a time through the KV cache, in any batch, on any thread count and any BLAS build.
//
// Backward passes are the same in both modes (a gradient is not compared across batch shapes).
//
// The mode is per thread, with a process default. numerics() is the calling thread's mode: that of
// the innermost NumericsGuard alive on this thread, else the process default. set_numerics sets
// the process default outside any guard (the commands do, once, from --numerics or the config's
// train.numerics: load_for_inference, train/inference.h); inside a guard it changes that guard's
// mode instead, so code run in a scope (a command called in-process, a load) leaves other threads'
// modes alone, and on one thread the modes seen are those one process-wide mode would give. The
// trainer runs under a guard of train.numerics, and each call on a Python model under one of the
// model's mode (python/src/model.h), so models in different modes run at once on different
// threads. Threads a computation starts (OpenMP workers, the run_split helpers of
// tensor/cpu/parallel.h) do not see the caller's guard: each choice by mode is made on the calling
// thread and passed to the work they run.
#pragma once
#include <array>
#include <optional>

#include "tensor/choice.h"

namespace qkv {

enum class Numerics { standard, invariant };
inline constexpr std::array kNumericsModes = {Choice<Numerics>{"standard", Numerics::standard},
                                              Choice<Numerics>{"invariant", Numerics::invariant}};

// The calling thread's mode (above).
Numerics numerics();
// Outside a NumericsGuard: the process default. Inside one: that guard's mode, until it ends.
void set_numerics(Numerics mode);

// Sets the calling thread's mode for a scope and restores the one before at its end; other
// threads keep theirs.
class NumericsGuard {
 public:
  explicit NumericsGuard(Numerics mode);
  ~NumericsGuard();
  NumericsGuard(const NumericsGuard&) = delete;
  NumericsGuard& operator=(const NumericsGuard&) = delete;

 private:
  std::optional<Numerics> previous_;  // the enclosing guard's mode on this thread; none outside any
};

}  // namespace qkv
