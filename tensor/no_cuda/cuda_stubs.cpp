// Linked when qkv is built without CUDA: every entry point but device_count() refuses clearly.
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/adamw.h"
#include "tensor/cuda/device_info.h"
#include "tensor/cuda/grad_norm.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/row_tree_sum.h"
#include "tensor/error.h"

namespace qkv::cuda {

[[noreturn]] static void no_cuda() {
  fail("[cuda] qkv was built without CUDA (configure with -DQKV_CUDA=ON on a machine with nvcc)");
}

int device_count() { return 0; }
void* device_alloc(size_t) { no_cuda(); }
void device_free(void*, size_t) { no_cuda(); }
AllocatorStats allocator_stats() { return {}; }
void reset_peak_bytes() {}
void release_cached_memory() {}
void memcpy(void*, const void*, size_t, int) { no_cuda(); }
void synchronize() {}
void row_tree_sum(float*, const float*, const float*, bool, const float* const*, int, int64_t) { no_cuda(); }
DeviceInfo device_info() { no_cuda(); }
void adamw_update_many(const std::vector<AdamWSlice>& slices, const AdamWScalars&, const AdamWScalars&) {
  if (!slices.empty()) no_cuda();
}
std::vector<double> sum_squares(const std::vector<Tensor>& xs) {
  if (!xs.empty()) no_cuda();
  return {};
}

void binary_forward(BinaryOp, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void unary_forward(UnaryOp, const Tensor&, const Tensor&, double) { no_cuda(); }
void unary_backward(UnaryGradOp, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void bias_unary_forward(UnaryOp, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void bias_unary_backward(UnaryGradOp, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void compare_forward(CompareOp, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void logical_and_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void logical_not_forward(const Tensor&, const Tensor&) { no_cuda(); }
void where_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void masked_fill_forward(const Tensor&, const Tensor&, double, const Tensor&) { no_cuda(); }
void add_inplace(const Tensor&, const Tensor&, double) { no_cuda(); }
void mul_inplace(const Tensor&, double) { no_cuda(); }
void fill(const Tensor&, double) { no_cuda(); }
void copy_cast(const Tensor&, const Tensor&) { no_cuda(); }
void matmul_forward(const Tensor&, const Tensor&, const Tensor&, double, double, bool) { no_cuda(); }
Tensor invariant_linear(const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void fill_rows(const Tensor&, const Tensor&) { no_cuda(); }
void sum_forward(const Tensor&, const std::vector<bool>&, const Tensor&, double) { no_cuda(); }
void max_forward(const Tensor&, int, const Tensor&, const Tensor&) { no_cuda(); }
void softmax_forward(const Tensor&, int, const Tensor&, bool) { no_cuda(); }
void softmax_backward(const Tensor&, const Tensor&, int, const Tensor&, bool) { no_cuda(); }
void rope(const Tensor&, const std::vector<int64_t>&, bool, const std::vector<double>&, double, const Tensor&) {
  no_cuda();
}
void embedding_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void embedding_backward(const Tensor&, const Tensor&, const Tensor&) { no_cuda(); }
void sum_rows(const Tensor&, const Tensor&) { no_cuda(); }
void layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&,
                        const Tensor&) {
  no_cuda();
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, bool) {
  no_cuda();
}
void rms_norm_forward(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) { no_cuda(); }
void rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda();
}
double cross_entropy_forward(const Tensor&, const Tensor&, int64_t, const Tensor&) { no_cuda(); }
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, double, int64_t, const Tensor&) { no_cuda(); }
void dropout_forward(const Tensor&, double, uint64_t, uint64_t, const Tensor&) { no_cuda(); }

}  // namespace qkv::cuda
