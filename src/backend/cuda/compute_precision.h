// What the CUDA backend computes in, worded once for `backprop info` (core's CudaStatus::compute,
// filled by cuda_status()) and the training start event (through ops/device_compute.h: train/
// reaches the backends only through ops/). It states what kernel_wrappers.h does,
// checked on the simulation by tests/cuda/linear_bf16_cuda_test.cpp (the GEMM descriptions'
// types). Why activations stay f32: docs/architecture.md, "CUDA numerics".
#pragma once

#include <string>

namespace bp::cuda_compute {

// GEMMs against frozen weights held narrower than f32 (every projection and the LM head in LoRA
// training): bf16 as stored, f16 and the block types dequantized to bf16 panels (dequant.cuh).
inline constexpr const char* kFrozenBf16Gemms =
    "GEMMs against frozen weights (bf16 as stored, f16 and quantized types dequantized to bf16): bf16 inputs, f32 "
    "accumulate";
// GEMMs against f32 weights: LoRA's A/B, full fine-tuning's trainable weights, a model held in f32.
inline constexpr const char* kF32Gemms = "GEMMs against f32 weights (LoRA A/B, full fine-tuning): f32, no TF32";
// What every other kernel reads and writes.
inline constexpr const char* kStorage = "activations, gradients and optimizer state stored f32";

// A run's own line (the training start event): the bf16 GEMMs only when some frozen weight is
// held narrower than f32.
inline std::string describe_run(bool frozen_bf16) {
  return (frozen_bf16 ? std::string(kFrozenBf16Gemms) + "; " : std::string()) + kF32Gemms + "; " + kStorage;
}

}  // namespace bp::cuda_compute
