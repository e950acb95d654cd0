// Element types and conversions. bf16/f16 conversions round to nearest, ties to even.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace bp {

// F32..I32 are element types; Q4_0..Q6_K are ggml's block-quantized formats (core/quant_blocks.h),
// used only for frozen weights held quantized: a tensor of n elements of a block type takes
// n / block_size · block_bytes bytes, and its rows are whole blocks.
enum class DType : uint8_t { F32, BF16, F16, I32, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K };

size_t dtype_size(DType t);         // bytes per element; block types: throws RUNTIME_INTERNAL (use dtype_bytes)
const char* dtype_name(DType t);    // "f32", "bf16", "f16", "i32", "q8_0", "q4_K", ...
bool dtype_is_block(DType t);       // Q4_0 .. Q6_K
int64_t dtype_block_size(DType t);  // elements per block (1 for element types)
size_t dtype_block_bytes(DType t);  // bytes per block (dtype_size for element types)
size_t dtype_bytes(DType t, int64_t count);  // bytes of `count` elements (a multiple of the block)
// Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"fp16", "i32"/"int32" and the block
// types by ggml's names ("q8_0", "q4_k" or "q4_K", ...); throws bp::Error(INPUT_VALIDATION_FAILED)
// otherwise.
DType parse_dtype(std::string_view name);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16: the top 16 bits of an f32, rounded to nearest even. NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  return f32_from_bits(static_cast<uint32_t>(h) << 16);
}

// IEEE half precision, round to nearest even; overflow goes to inf, tiny values to subnormals/zero.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Bulk conversions between any two float types (f32, bf16, f16, and block types to or from f32
// through core/quant_blocks.h); i32 only to i32.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t count);

}  // namespace bp
