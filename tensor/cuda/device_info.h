// What the benchmarks report about the GPU they ran on: its name, compute capability, and the
// dense bf16 tensor-core peak that model-FLOPs utilisation (MFU) is measured against.
#pragma once
#include <string>

namespace qkv::cuda {

struct DeviceInfo {
  std::string name;             // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int major = 0, minor = 0;     // compute capability
  double peak_bf16_tflops = 0;  // dense (no sparsity) bf16 datasheet peak; 0 when the card is not in the table
};

// Device 0. Throws when no device is visible (or without CUDA).
DeviceInfo device_info();

// The datasheet table behind DeviceInfo::peak_bf16_tflops, by name and compute capability
// (host-only, so it is testable without a GPU). Unknown cards give 0.
double dense_bf16_peak_tflops(const std::string& name, int major, int minor);

}  // namespace qkv::cuda
