// Internal to attention/: the CUDA linear-attention kernels (attention/linear/linear_attention.cu),
// built only with QKV_WITH_CUDA. The math and the chunked causal form of linear_attention.h, written
// for correctness, not speed: one block per (b, query head) in forward and per (b, kv head) in
// backward (the G query heads of a group in order, so dK and dV need no atomics), the block's
// threads splitting each chunk's c×c, c×Dv and m×Dv products; every sum runs in a fixed order
// (deterministic). Features φ(q~), φ(k~) are computed once into [rows, m] buffers.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace qkv::attn::cuda_linear {

struct Geometry {
  int64_t B = 0, Hq = 0, Hkv = 0, G = 1, Nq = 0, Nk = 0, D = 0, Dv = 0, m = 0, chunk = 1;
  double rs = 1, eps = 1e-6;  // √scale, ε
  int feature = 0;            // LinearFeature as int
  bool causal = false;
  int64_t chunk_key_hi = 1;  // in-chunk rule: key j visible to query i iff j - i < chunk_key_hi
  DType dtype = DType::f32;
};

// q, k, v on the GPU (any strides with rows contiguous; copied contiguous otherwise); W [m, D] in
// the compute dtype on the GPU (favor) or undefined; start [B, Nk] segment-run starts and valid
// [B, Nk] (empty: all valid) on the host. out [B, Hq, Nq, Dv], den [B, Hq, Nq].
struct Forward {
  Tensor out, den;
};
Forward forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const std::vector<int64_t>& start,
                const std::vector<uint8_t>& valid, const Geometry& g);
// {dq, dk, dv}, contiguous, shaped like q, k, v.
std::vector<Tensor> backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& den, const Tensor& W, const std::vector<int64_t>& start,
                             const std::vector<uint8_t>& valid, const Geometry& g);

}  // namespace qkv::attn::cuda_linear
