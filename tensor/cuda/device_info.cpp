// device_info() on the CUDA runtime (the peak table is tensor/device_peaks.cpp, built without CUDA too).
#include "tensor/cuda/device_info.h"

#include <cuda_runtime.h>

#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/cuda_check.h"

namespace qkv::cuda {

DeviceInfo device_info() {
  QKV_CHECK(device_count() > 0, "[cuda] device_info: no CUDA device is visible");
  cudaDeviceProp prop{};
  QKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  DeviceInfo d;
  d.name = prop.name;
  d.major = prop.major;
  d.minor = prop.minor;
  d.peak_bf16_tflops = dense_bf16_peak_tflops(d.name, d.major, d.minor);
  return d;
}

}  // namespace qkv::cuda
