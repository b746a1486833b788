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
// The mode is process-wide, like OMP_NUM_THREADS: the config key train.numerics and the commands'
// --numerics set it (train/session.h, apply_process_settings); NumericsGuard scopes it.
#pragma once
#include <array>

#include "tensor/choice.h"

namespace qkv {

enum class Numerics { standard, invariant };
inline constexpr std::array kNumericsModes = {Choice<Numerics>{"standard", Numerics::standard},
                                              Choice<Numerics>{"invariant", Numerics::invariant}};

Numerics numerics();
void set_numerics(Numerics mode);

// Sets a mode for a scope and restores the one before.
class NumericsGuard {
 public:
  explicit NumericsGuard(Numerics mode) : previous_(numerics()) { set_numerics(mode); }
  ~NumericsGuard() { set_numerics(previous_); }
  NumericsGuard(const NumericsGuard&) = delete;
  NumericsGuard& operator=(const NumericsGuard&) = delete;

 private:
  Numerics previous_;
};

}  // namespace qkv
