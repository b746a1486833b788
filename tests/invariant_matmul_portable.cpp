// tensor/cpu/invariant_matmul.cpp built once more without AVX or FMA instructions (its target adds
// -mno-avx), so that its portable paths, std::fma lane by lane and scalar packing, run the same
// tests as the AVX2/FMA build (tests/CMakeLists.txt: invariant_matmul_portable). The library's copy
// is not linked in: this one defines every symbol of it.
#if defined(__FMA__) || defined(__AVX__)
#error "invariant_matmul_portable must be compiled without AVX and FMA (-mno-avx)"
#endif
#include "tensor/cpu/invariant_matmul.cpp"
