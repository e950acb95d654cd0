#include "core/dtype.h"

#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/quant_blocks.h"

namespace bp {

namespace {

struct BlockInfo {
  DType type;
  const char* name;
  int64_t block_size;
  size_t block_bytes;
};
// ggml's block formats (io/quantize.h has the byte layouts).
constexpr BlockInfo kBlockTypes[] = {
    {DType::Q4_0, "q4_0", 32, 18},   {DType::Q5_0, "q5_0", 32, 22},   {DType::Q5_1, "q5_1", 32, 24},
    {DType::Q8_0, "q8_0", 32, 34},   {DType::Q4_K, "q4_K", 256, 144}, {DType::Q5_K, "q5_K", 256, 176},
    {DType::Q6_K, "q6_K", 256, 210},
};

const BlockInfo* block_info(DType t) {
  for (const auto& b : kBlockTypes)
    if (b.type == t) return &b;
  return nullptr;
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    default: break;
  }
  throw Error(ErrorCode::RUNTIME_INTERNAL,
              fmt::format("[dtype] {} is a block type: it has no per-element size", dtype_name(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    default: break;
  }
  const BlockInfo* b = block_info(t);
  return b ? b->name : "?";
}

bool dtype_is_block(DType t) {
  return block_info(t) != nullptr;
}
int64_t dtype_block_size(DType t) {
  const BlockInfo* b = block_info(t);
  return b ? b->block_size : 1;
}
size_t dtype_block_bytes(DType t) {
  const BlockInfo* b = block_info(t);
  return b ? b->block_bytes : dtype_size(t);
}
size_t dtype_bytes(DType t, int64_t count) {
  const BlockInfo* b = block_info(t);
  if (!b) return static_cast<size_t>(count) * dtype_size(t);
  if (count % b->block_size != 0)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[dtype] {} values are not whole {} blocks of {}", count, b->name, b->block_size));
  return static_cast<size_t>(count / b->block_size) * b->block_bytes;
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "fp32" || n == "F32") return DType::F32;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::BF16;
  if (n == "f16" || n == "float16" || n == "fp16" || n == "F16") return DType::F16;
  if (n == "i32" || n == "int32" || n == "I32") return DType::I32;
  for (const auto& b : kBlockTypes) {
    const std::string_view name = b.name;
    bool same = name.size() == n.size();
    for (size_t i = 0; same && i < n.size(); ++i) same = std::tolower(name[i]) == std::tolower(n[i]);
    if (same) return b.type;
  }
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[dtype] unknown dtype '{}'; allowed: f32, bf16, f16, i32, q4_0, q5_0, q5_1, q8_0, q4_k, "
                          "q5_k, q6_k",
                          n));
}

// f32 -> f16 with round-to-nearest-even, handling subnormals, overflow and NaN.
uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: value * 2^24 rounded to nearest even integer.
    float a = f32_from_bits(absx);
    float scaled = a * 16777216.0f;    // exact (power of two)
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

void convert(const void* src, DType st, void* dst, DType dt, size_t n) {
  if (st == dt) {
    std::memcpy(dst, src, dtype_bytes(st, static_cast<int64_t>(n)));
    return;
  }
  if (dtype_is_block(st) || dtype_is_block(dt)) {
    if (dt == DType::F32) return dequantize_span(st, src, static_cast<float*>(dst), static_cast<int64_t>(n));
    if (st == DType::F32) return quantize_span(dt, static_cast<const float*>(src), dst, static_cast<int64_t>(n));
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[dtype] cannot convert {} to {} (block types convert to and from f32 only)",
                            dtype_name(st), dtype_name(dt)));
  }
  if (st == DType::I32 || dt == DType::I32)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[dtype] cannot convert {} to {}", dtype_name(st), dtype_name(dt)));
  auto load = [&](size_t i) -> float {
    switch (st) {
      case DType::F32: return static_cast<const float*>(src)[i];
      case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      default: return 0.0f;
    }
  };
  switch (dt) {
    case DType::F32:
      for (size_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = load(i);
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_bf16(load(i));
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = f32_to_f16(load(i));
      break;
    default: break;
  }
}

}  // namespace bp
