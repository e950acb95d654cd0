// GGUF v3 common definitions (ggml's docs/gguf.md), shared by gguf_writer and gguf_reader.
//
// File layout (all little-endian):
//   u32 magic "GGUF" (bytes 47 47 55 46) | u32 version = 3 | u64 tensor_count | u64 kv_count
//   kv_count × { string key | u32 value_type | value }         string = u64 length + UTF-8 bytes
//                                                               array  = u32 elem_type + u64 n + values
//   tensor_count × { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   zero padding to `general.alignment` (default 32)
//   tensor data; each tensor starts at data_start + offset, offsets are multiples of the alignment.
// ne[0] is the innermost (contiguous) dimension: a row-major [rows, cols] matrix has ne = {cols, rows}.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bp {

inline constexpr uint32_t kGGUFMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGGUFVersion = 3;
inline constexpr uint32_t kGGUFDefaultAlignment = 32;

enum class GGUFValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

const char* gguf_value_type_name(GGUFValueType t);

// One metadata value: its GGUF type (and element type for arrays) and the value as JSON
// (number, bool, string, or an array of those). Floats read back as the double of the stored float.
struct GGUFValue {
  GGUFValueType type = GGUFValueType::UINT32;
  GGUFValueType elem_type = GGUFValueType::UINT8;  // arrays only
  nlohmann::json value;

  static GGUFValue u8(uint8_t v) { return {GGUFValueType::UINT8, GGUFValueType::UINT8, v}; }
  static GGUFValue u32(uint32_t v) { return {GGUFValueType::UINT32, GGUFValueType::UINT8, v}; }
  static GGUFValue i32(int32_t v) { return {GGUFValueType::INT32, GGUFValueType::UINT8, v}; }
  static GGUFValue u64(uint64_t v) { return {GGUFValueType::UINT64, GGUFValueType::UINT8, v}; }
  static GGUFValue f32(float v) { return {GGUFValueType::FLOAT32, GGUFValueType::UINT8, static_cast<double>(v)}; }
  static GGUFValue f64(double v) { return {GGUFValueType::FLOAT64, GGUFValueType::UINT8, v}; }
  static GGUFValue boolean(bool v) { return {GGUFValueType::BOOL, GGUFValueType::UINT8, v}; }
  static GGUFValue str(std::string v) { return {GGUFValueType::STRING, GGUFValueType::UINT8, std::move(v)}; }
  static GGUFValue array(GGUFValueType elem, nlohmann::json values) {
    return {GGUFValueType::ARRAY, elem, std::move(values)};
  }
  static GGUFValue strings(const std::vector<std::string>& v) { return array(GGUFValueType::STRING, v); }
  static GGUFValue f32s(const std::vector<float>& v);
  static GGUFValue i32s(const std::vector<int32_t>& v) { return array(GGUFValueType::INT32, v); }

  bool operator==(const GGUFValue& o) const {
    return type == o.type && (type != GGUFValueType::ARRAY || elem_type == o.elem_type) && value == o.value;
  }
};

using GGUFMetadata = std::vector<std::pair<std::string, GGUFValue>>;

}  // namespace bp
