// cuda_fp16.h in the QKV_CUDA=EMULATE build: __half and its conversions come from cuda_emulator.h.
#pragma once
#include "cuda_runtime.h"
