// cuda_bf16.h in the QKV_CUDA=EMULATE build: __nv_bfloat16 and its conversions come from cuda_emulator.h.
#pragma once
#include "cuda_runtime.h"
