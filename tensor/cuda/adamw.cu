// cuda::adamw_update_many (adamw.h). The host writes a table of the slices and the first
// block of each ([count + 1] prefix sums) to the device; block b finds its slice by binary search
// in the prefix sums and updates chunk b − first[slice] of it.
#include <cstring>
#include <vector>

#include "tensor/cuda/adamw.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/ops.h"

namespace qkv::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void adamw_many_kernel(const AdamWSlice* slices, const int64_t* first_block, int count,
                                  AdamWScalars with_decay, AdamWScalars without_decay) {
  const int64_t b = blockIdx.x;
  int lo = 0, hi = count - 1;  // the last slice whose first block is <= b
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  const AdamWSlice s = slices[lo];
  const AdamWScalars& k = s.decay ? with_decay : without_decay;
  const int64_t begin = (b - first_block[lo]) * kAdamWChunk;
  const int64_t end = begin + kAdamWChunk < s.n ? begin + kAdamWChunk : s.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) adamw_element(s.p[i], s.g[i], s.m[i], s.v[i], k);
}

}  // namespace

void adamw_update_many(const std::vector<AdamWSlice>& slices, const AdamWScalars& with_decay,
                       const AdamWScalars& without_decay) {
  std::vector<AdamWSlice> work;
  std::vector<int64_t> first_block;
  int64_t blocks = 0;
  for (const AdamWSlice& s : slices) {
    if (s.n == 0) continue;
    work.push_back(s);
    first_block.push_back(blocks);
    blocks += (s.n + kAdamWChunk - 1) / kAdamWChunk;
  }
  if (work.empty()) return;
  QKV_CHECK(blocks < (int64_t{1} << 31), "[adamw] ", blocks, " chunks exceed one launch's grid");
  // The table travels as int64 words (AdamWSlice is plain data), in one host-to-device copy each.
  static_assert(sizeof(AdamWSlice) % sizeof(int64_t) == 0, "AdamWSlice must pack into int64 words");
  const int64_t words = static_cast<int64_t>(work.size() * sizeof(AdamWSlice) / sizeof(int64_t));
  std::vector<int64_t> packed(static_cast<size_t>(words));
  std::memcpy(packed.data(), work.data(), work.size() * sizeof(AdamWSlice));
  const Tensor d_slices = from_vector_i64(packed, {words}).to(Device::cuda);
  const Tensor d_first = from_vector_i64(first_block, {static_cast<int64_t>(first_block.size())}).to(Device::cuda);
  adamw_many_kernel<<<static_cast<unsigned>(blocks), kThreads>>>(
      reinterpret_cast<const AdamWSlice*>(d_slices.data<int64_t>()), d_first.data<int64_t>(),
      static_cast<int>(work.size()), with_decay, without_decay);
  QKV_CUDA_LAUNCHED("adamw_many_kernel");
}

}  // namespace qkv::cuda
