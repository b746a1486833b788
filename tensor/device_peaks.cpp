// Dense bf16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s, without the 2:4 sparsity factor).
// Host-only and built with or without CUDA, so the table is tested everywhere.
#include <string>

#include "tensor/cuda/device_info.h"

namespace qkv::cuda {

double dense_bf16_peak_tflops(const std::string& name, int major, int minor) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (major == 9 && minor == 0) {
    if (has("H100") && has("PCIe")) return 756;
    if (has("H100") || has("H200") || has("GH200")) return 989;  // SXM parts
    return 0;
  }
  if (major == 8 && minor == 0 && has("A100")) return 312;
  return 0;
}

}  // namespace qkv::cuda
