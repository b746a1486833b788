// Development variants of the CUDA attention kernels, kept out of the production library (as
// llm.c keeps its kernel variants in dev/cuda/): compiled only into the test binary. The "simple"
// kernels are untiled, one warp per row with every operand read from global memory, and run the
// same per-row arithmetic (attention/cuda/fused_rows.cuh) in the same order as the tiled kernels
// of fused_attention.cu, so the two agree to the last bit where the compiler contracts alike; the
// tests compare them to tell a tiling bug from an arithmetic one. Same interface and results as
// cuda_fused::forward / backward.
#pragma once
#include "attention/cuda/fused_cuda.h"

namespace qkv::attn::cuda_simple {

FusedForward forward(const Tensor& q, const Tensor& k, const Tensor& v, const cuda_fused::Plan& plan);
FusedGrads backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const cuda_fused::Plan& plan);

}  // namespace qkv::attn::cuda_simple
