// ggml's block-quantized formats as element types of a Tensor (DESIGN.md "Frozen weights in any
// stored type"): the single-block quantize / dequantize kernels (byte layouts: io/quantize.h) and
// span-level helpers over any held dtype (f32, bf16, f16 or a block type).
//
// A held span of n elements must start on a block boundary and n must be a multiple of the block
// size (rows of a held weight always are: the loader refuses rows that are not).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace bp {

// Single-block kernels (the reference, plain C++). `x` holds block_size floats.
void quantize_block_q8_0(const float* x, uint8_t* out);
void quantize_block_q4_0(const float* x, uint8_t* out);
void quantize_block_q5_0(const float* x, uint8_t* out);
void quantize_block_q5_1(const float* x, uint8_t* out);
void quantize_block_q4_k(const float* x, uint8_t* out);
void quantize_block_q5_k(const float* x, uint8_t* out);
void quantize_block_q6_k(const float* x, uint8_t* out);
void dequantize_block_q8_0(const uint8_t* in, float* y);
void dequantize_block_q4_0(const uint8_t* in, float* y);
void dequantize_block_q5_0(const uint8_t* in, float* y);
void dequantize_block_q5_1(const uint8_t* in, float* y);
void dequantize_block_q4_k(const uint8_t* in, float* y);
void dequantize_block_q5_k(const uint8_t* in, float* y);
void dequantize_block_q6_k(const uint8_t* in, float* y);

using QuantizeBlockFn = void (*)(const float*, uint8_t*);
using DequantizeBlockFn = void (*)(const uint8_t*, float*);
// The block kernels of a block dtype (nullptr for f32/bf16/f16/i32).
QuantizeBlockFn quantize_block_fn(DType t);
DequantizeBlockFn dequantize_block_fn(DType t);

// n elements of held dtype `t` at `src` (block-aligned, n a multiple of the block) into f32, on
// the calling thread. f32/bf16/f16 convert element-wise.
void dequantize_span(DType t, const void* src, float* dst, int64_t n);
// n f32 values into held dtype `t` (n a multiple of the block), on the calling thread.
void quantize_span(DType t, const float* src, void* dst, int64_t n);

}  // namespace bp
