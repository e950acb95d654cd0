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
// The same on a compute capability 7.5 card (Turing: no bf16 tensor cores): f16 panels, the
// activation operand scaled by a power of two into f16's range; a held LM head takes f32 panels.
inline constexpr const char* kFrozenF16Gemms =
    "GEMMs against frozen weights (every stored type dequantized to f16; compute capability 7.5): f16 inputs with the "
    "activation scaled per tensor by a power of two, f32 accumulate; LM head in f32";
// Full fine-tuning's trained matrices and LM head with training.matmul_dtype bf16 (auto on a bf16
// card): bf16 GEMM copies of their f32 masters (model/transformer.h), dW accumulated in f32.
inline constexpr const char* kTrainedBf16Gemms =
    "GEMMs of full fine-tuning's trained matrices and head (bf16 copies of f32 masters, --matmul-dtype): bf16 "
    "inputs, f32 accumulate";
// GEMMs against f32 weights: LoRA's A/B, full fine-tuning with f32 GEMMs, a model held in f32.
inline constexpr const char* kF32Gemms =
    "GEMMs against f32 weights (LoRA A/B, full fine-tuning with --matmul-dtype f32): f32, no TF32";
// Attention (attention.cuh / attention_tc.cuh): on cards of compute capability 8.0 and later its
// tile products run on tensor cores when the head dim is a multiple of 16; on Turing it is f32.
inline constexpr const char* kTensorCoreAttention =
    "attention products on tensor cores where the head dim is a multiple of 16 (Q, K, V, dO, P, dS rounded to bf16; "
    "f32 accumulate and softmax)";
inline constexpr const char* kF32Attention = "attention f32";
// What every other kernel reads and writes.
inline constexpr const char* kStorage = "activations, gradients and optimizer state stored f32";

// A run's own line (the training start event): the 16-bit GEMMs only when some frozen weight is
// held narrower than f32; f16 ones on a card whose GEMMs take f16 (Turing, whose attention is f32);
// the trained matrices' bf16 copies when the run makes them (never on an f16 card).
inline std::string describe_run(bool frozen_narrow, bool f16_card = false, bool trained_bf16 = false) {
  const char* narrow = f16_card ? kFrozenF16Gemms : kFrozenBf16Gemms;
  const char* attention = f16_card ? kF32Attention : kTensorCoreAttention;
  std::string gemms = frozen_narrow ? std::string(narrow) + "; " : std::string();
  if (trained_bf16 && !f16_card) gemms += std::string(kTrainedBf16Gemms) + "; ";
  return gemms + kF32Gemms + "; " + attention + "; " + kStorage;
}

}  // namespace bp::cuda_compute
