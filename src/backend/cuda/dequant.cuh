// CUDA dequantization of frozen weights held in their stored type (DESIGN.md "Frozen weights in
// any stored type"; CPU sibling: core/quant_blocks.cpp, whose single-block dequantizers are the
// reference). A held matrix [rows, cols] is row-major and every row is whole blocks of its type
// (the loader guarantees it), so block b of the matrix starts at byte b·block_bytes.
//   dequantize_rows<Out>:        rows [row0, row0 + n) into dst [n, cols]   (a GEMM's panel)
//   dequantize_gather_rows<Out>: rows ids[0..n) into dst [n, cols]          (an embedding lookup)
//   held_abs_max_bits:           max |v| over the whole matrix, as f32 bits   (f16 range check)
// Out is float, bf16 or f16 (the GEMM's panel type). Types: f32, bf16, f16 and ggml's q8_0, q4_0, q5_0,
// q5_1, q4_K, q5_K, q6_K (every type load_model can hold). One thread per output element in a
// grid-stride loop; each thread decodes its value from its block's bytes (scales included), so no
// thread depends on another and there is no shared memory.
// The arithmetic is the CPU reference's, operation for operation, with __fmul_rn/__fsub_rn/__fadd_rn
// so nvcc cannot contract it into an FMA: f32 output is bit-identical to the CPU's dequantized
// values, bf16 and f16 output is their round-to-nearest-even.
// Compiled by nvcc through dequant.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_compat.cuh"
#include "backend/cuda/dequant_types.h"
#include "core/dtype.h"

namespace bp::BP_CUDA_NS {

// IEEE half bits -> f32, exactly (every half is an f32).
__device__ __forceinline__ float dq_half(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 31u, mant = h & 1023u;
  float v;
  if (exp == 0) {
    v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant·2^-24: exact
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112u) << 23) | (mant << 13);
  memcpy(&v, &bits, 4);
  return v;
}

// ggml's 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block (12 bytes at s).
__device__ __forceinline__ void dq_scale_min_k4(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Element i of the block at `b` (byte layouts: io/quantize.h, decoded as core/quant_blocks.cpp does).
template <DType kType>
__device__ __forceinline__ float dq_element(const uint8_t* b, int i) {
  if constexpr (kType == DType::F32) {
    float v;
    memcpy(&v, b, 4);
    return v;
  } else if constexpr (kType == DType::BF16) {
    const uint32_t bits = (static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8)) << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
  } else if constexpr (kType == DType::F16) {
    return dq_half(b);
  } else if constexpr (kType == DType::Q8_0) {  // f16 d; i8 qs[32]
    return __fmul_rn(dq_half(b), static_cast<float>(static_cast<int8_t>(b[2 + i])));
  } else if constexpr (kType == DType::Q4_0) {  // f16 d; u8 qs[16]: low nibbles 0..15, high 16..31
    const int q = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
    return __fmul_rn(dq_half(b), static_cast<float>(q - 8));
  } else if constexpr (kType == DType::Q5_0 || kType == DType::Q5_1) {
    // q5_0: f16 d; u8 qh[4]; u8 qs[16]          y = d·(q − 16)
    // q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]   y = d·q + m
    constexpr int kQh = kType == DType::Q5_0 ? 2 : 4;
    const uint8_t* qs = b + kQh + 4;
    const int high = (b[kQh + i / 8] >> (i % 8)) & 1;  // bit i of the little-endian qh
    const int q = (i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4)) | (high << 4);
    if constexpr (kType == DType::Q5_0) return __fmul_rn(dq_half(b), static_cast<float>(q - 16));
    return __fadd_rn(__fmul_rn(dq_half(b), static_cast<float>(q)), dq_half(b + 2));
  } else if constexpr (kType == DType::Q4_K || kType == DType::Q5_K) {
    // f16 d; f16 dmin; u8 scales[12]; (q5_K: u8 qh[32];) u8 qs[128]. Chunk c of 64 values holds
    // sub-blocks 2c (low nibbles) and 2c+1 (high nibbles); y = d·sc·q − dmin·m.
    const int c = i / 64, l = i % 32, sub = i / 32;
    int sc, mn;
    dq_scale_min_k4(b + 4, sub, &sc, &mn);
    const uint8_t* qs = b + (kType == DType::Q4_K ? 16 : 48);
    int q = (sub & 1) ? (qs[c * 32 + l] >> 4) : (qs[c * 32 + l] & 15);
    if constexpr (kType == DType::Q5_K) q |= ((b[16 + l] >> sub) & 1) << 4;
    const float step = __fmul_rn(dq_half(b), static_cast<float>(sc));
    const float offset = __fmul_rn(dq_half(b + 2), static_cast<float>(mn));
    return __fsub_rn(__fmul_rn(step, static_cast<float>(q)), offset);
  } else {
    static_assert(kType == DType::Q6_K, "a held type without a device dequantizer");
    // u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Half h of 128 values, quarter k of 32 in it:
    // low bits from ql (nibble k/2 of byte 64h + 32(k%2) + l), high bits 2k..2k+1 of qh[32h + l].
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    const uint8_t lo = b[h * 64 + (k % 2) * 32 + l];
    const int q = (((k / 2) ? (lo >> 4) : (lo & 15)) | (((b[128 + h * 32 + l] >> (2 * k)) & 3) << 4)) - 32;
    const int is = h * 8 + l / 16 + 2 * k;
    const float scale = __fmul_rn(dq_half(b + 208), static_cast<float>(static_cast<int8_t>(b[192 + is])));
    return __fmul_rn(scale, static_cast<float>(q));
  }
}

// dst[r, c] = element c of row (ids ? ids[r] : row0 + r) of the held matrix at src.
template <class Out, DType kType>
__global__ void dequantize_rows_kernel(const uint8_t* src, const int32_t* ids, int64_t row0, int64_t n_rows,
                                       int64_t cols, int64_t block_size, int64_t block_bytes, Out* dst) {
  const int64_t n = n_rows * cols, row_bytes = cols / block_size * block_bytes;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const int64_t row = ids ? static_cast<int64_t>(ids[r]) : row0 + r;
    const uint8_t* block = src + row * row_bytes + c / block_size * block_bytes;
    dst[e] = store_from_f32<Out>(dq_element<kType>(block, static_cast<int>(c % block_size)));
  }
}

// *result = max over the dequantized elements of rows [0, n_rows) of the bits of |v| (non-negative
// f32 bit patterns order as the values do; Inf and NaN above every finite value); *result starts
// at 0. The values are dq_element's, so the maximum is the CPU's dequantized maximum, bit for bit.
template <DType kType>
__global__ void held_abs_max_bits_kernel(const uint8_t* src, int64_t n_rows, int64_t cols, int64_t block_size,
                                         int64_t block_bytes, int* result) {
  const int64_t n = n_rows * cols, row_bytes = cols / block_size * block_bytes;
  int m = 0;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const int a = abs_bits(
        dq_element<kType>(src + r * row_bytes + c / block_size * block_bytes, static_cast<int>(c % block_size)));
    m = a > m ? a : m;
  }
  warp_atomic_max(m, result);
}

// Whether dequantize_rows/dequantize_gather_rows read held type t (host; dequant_types.h).
using cuda_dequant::dequantize_supported;

template <DType kType>
void launch_held_abs_max(const void* src, int64_t n_rows, int64_t cols, int* result, cudaStream_t stream) {
  const auto bs = dtype_block_size(kType);
  const auto bb = static_cast<int64_t>(dtype_block_bytes(kType));
  BP_LAUNCH(elementwise_blocks(n_rows * cols), 256, 0, stream, held_abs_max_bits_kernel<kType>)
  (static_cast<const uint8_t*>(src), n_rows, cols, bs, bb, result);
}

// f(std::integral_constant<DType, type>{}) for a type dequantize_supported says (the caller checked).
template <class F>
void with_held_type(DType type, F&& f) {
  switch (type) {
    case DType::F32: return f(std::integral_constant<DType, DType::F32>{});
    case DType::BF16: return f(std::integral_constant<DType, DType::BF16>{});
    case DType::F16: return f(std::integral_constant<DType, DType::F16>{});
    case DType::Q8_0: return f(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_0: return f(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q5_0: return f(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1: return f(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K: return f(std::integral_constant<DType, DType::Q5_K>{});
    default: return f(std::integral_constant<DType, DType::Q6_K>{});
  }
}

template <class Out, DType kType>
void launch_dequantize(const void* src, const int32_t* ids, int64_t row0, int64_t n_rows, int64_t cols, Out* dst,
                       cudaStream_t stream) {
  const auto bs = dtype_block_size(kType);
  const auto bb = static_cast<int64_t>(dtype_block_bytes(kType));
  BP_LAUNCH(elementwise_blocks(n_rows * cols), 256, 0, stream, dequantize_rows_kernel<Out, kType>)
  (static_cast<const uint8_t*>(src), ids, row0, n_rows, cols, bs, bb, dst);
}

// Rows ids[r] (ids != nullptr, device memory) or row0 + r of `type` matrix src [*, cols] into dst
// [n_rows, cols]. Returns false, launching nothing, for a type it does not read (the caller refuses).
template <class Out>
bool dequantize_rows_any(DType type, const void* src, const int32_t* ids, int64_t row0, int64_t n_rows, int64_t cols,
                         Out* dst, cudaStream_t stream) {
  if (!dequantize_supported(type)) return false;
  if (n_rows <= 0 || cols <= 0) return true;
  with_held_type(
      type, [&](auto t) { launch_dequantize<Out, decltype(t)::value>(src, ids, row0, n_rows, cols, dst, stream); });
  return true;
}

// max |v| over the dequantized values of the held matrix src [n_rows, cols], as f32 bits, added by
// atomicMax into *result (device memory, which the caller zeroes first): whether a frozen weight
// fits f16's range (ops/held_range.h). Returns false, launching nothing, for a type it does not read.
// A template (Bits = int) only so that every .cu including this file may define it.
template <class Bits>
bool held_abs_max_bits(DType type, const void* src, int64_t n_rows, int64_t cols, Bits* result,
                       cudaStream_t stream = nullptr) {
  static_assert(std::is_same_v<Bits, int>, "f32 bits in an int: atomicMax");
  if (!dequantize_supported(type)) return false;
  if (n_rows <= 0 || cols <= 0) return true;
  with_held_type(type, [&](auto t) { launch_held_abs_max<decltype(t)::value>(src, n_rows, cols, result, stream); });
  return true;
}

// Rows [row0, row0 + n_rows) of the held matrix src [*, cols] into dst [n_rows, cols].
template <class Out>
bool dequantize_rows(DType type, const void* src, int64_t cols, int64_t row0, int64_t n_rows, Out* dst,
                     cudaStream_t stream = nullptr) {
  return dequantize_rows_any<Out>(type, src, nullptr, row0, n_rows, cols, dst, stream);
}
// Rows ids[0..n_rows) (device memory, already range-checked) into dst [n_rows, cols].
template <class Out>
bool dequantize_gather_rows(DType type, const void* src, int64_t cols, const int32_t* ids, int64_t n_rows, Out* dst,
                            cudaStream_t stream = nullptr) {
  return dequantize_rows_any<Out>(type, src, ids, 0, n_rows, cols, dst, stream);
}

}  // namespace bp::BP_CUDA_NS
