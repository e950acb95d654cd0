// Element types and conversions. bf16/f16 conversions round to nearest, ties to even.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace bp {

enum class DType : uint8_t { F32, BF16, F16, I32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "f16", "i32"
// Parses "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16"/"fp16", "i32"/"int32";
// throws bp::Error(INPUT_VALIDATION_FAILED) otherwise.
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

// Bulk conversions between any two float types (f32, bf16, f16); i32 only to i32.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t count);

}  // namespace bp
