// tensor/cpu/invariant_matmul.cpp built once more without FMA instructions (its target adds -mno-fma),
// so that its portable path, std::fma lane by lane, runs the same tests as the vector FMA path
// (tests/CMakeLists.txt: invariant_matmul_portable). The library's copy is not linked in: this
// one defines every symbol of it.
#if defined(__FMA__)
#error "invariant_matmul_portable must be compiled without FMA (-mno-fma)"
#endif
#include "tensor/cpu/invariant_matmul.cpp"
