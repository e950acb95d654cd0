// ggml tensor types and their block layouts, with quantize / dequantize for the types GGUF export
// writes. The numeric ids and byte layouts are ggml's (GGUF v3 files store them verbatim):
//
//   type  id  block  bytes  layout (per block)                                  value
//   F32    0      1      4  float                                               x
//   F16    1      1      2  IEEE half                                           x
//   BF16  30      1      2  bfloat16                                            x
//   Q4_0   2     32     18  f16 d; u8 qs[16] (lo nibble = x[j], hi = x[j+16])   d·(q − 8)
//   Q5_0   6     32     22  f16 d; u8 qh[4] (bit j = 5th bit of x[j]); qs[16]   d·(q − 16)
//   Q5_1   7     32     24  f16 d; f16 m; u8 qh[4]; u8 qs[16]                   d·q + m
//   Q8_0   8     32     34  f16 d; i8 qs[32]                                    d·q
//   Q4_K  12    256    144  f16 d; f16 dmin; u8 scales[12]; u8 qs[128]          d·sc_j·q − dmin·m_j
//   Q5_K  13    256    176  f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; qs[128]  d·sc_j·q − dmin·m_j
//   Q6_K  14    256    210  u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d         d·sc_j·(q − 32)
//
// K-quants: Q4_K/Q5_K have 8 sub-blocks of 32 with 6-bit scale sc_j and 6-bit min m_j packed in
// 12 bytes (j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
// m = (s[j+4] >> 4) | (s[j] >> 6) << 4). Quants are stored per 64 elements: 32 bytes whose low
// nibbles are the first 32 and high nibbles the next 32 (Q5_K's 5th bit: qh[l] bit 2c for the first
// half of chunk c, bit 2c+1 for the second). Q6_K has 16 sub-blocks of 16 with int8 scales; per 128
// elements: 64 bytes of low nibbles (ql[l] lo = x[l], ql[l+32] lo = x[l+32], ql[l] hi = x[l+64],
// ql[l+32] hi = x[l+96]) and 32 bytes of 2-bit high parts (qh[l] bits 0-1, 2-3, 4-5, 6-7 for the
// same four elements).
//
// The quantizers here are our own (no search over scales as in llama.cpp's reference): each
// sub-block's scale is rounded so its grid covers the sub-block's range, which gives the error bounds
// stated per type in quantize_blocks.cpp (and checked by tests/io/quantize_test.cpp). Rows are quantized in parallel
// with OpenMP.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace bp {

enum class GGMLType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

struct GGMLTypeInfo {
  GGMLType type;
  const char* name;    // ggml's name: "f32", "q4_K", ...
  int64_t block_size;  // elements per block
  size_t block_bytes;  // bytes per block
};

// Every type this file implements.
const std::vector<GGMLTypeInfo>& ggml_types();
// Throws bp::Error(RUNTIME_GGUF_EXPORT_FAILED) for ids we do not implement.
const GGMLTypeInfo& ggml_type_info(GGMLType t);
bool ggml_type_known(uint32_t id);
const char* ggml_type_name(GGMLType t);
bool ggml_is_quantized(GGMLType t);  // block size > 1
// Bytes of one row of n elements; throws RUNTIME_GGUF_EXPORT_FAILED when n is not a multiple of the block.
size_t ggml_row_bytes(GGMLType t, int64_t n);

// Quantize / dequantize `nrows` rows of `n_per_row` floats (n_per_row must be a multiple of the
// block size). Parallel over rows (OpenMP); results do not depend on the thread count.
void quantize_rows(GGMLType t, const float* src, void* dst, int64_t nrows, int64_t n_per_row);
void dequantize_rows(GGMLType t, const void* src, float* dst, int64_t nrows, int64_t n_per_row);

// Single-block kernels (quantize_block_q8_0, dequantize_block_q4_k, ...): core/quant_blocks.h.

// The held-weight dtype (core/dtype.h) of a ggml type, and back; nullopt / throws for types that
// have no counterpart.
std::optional<DType> dtype_of_ggml(GGMLType t);
GGMLType ggml_of_dtype(DType t);

}  // namespace bp
