// Type table and row-level quantize / dequantize (block kernels in quantize_blocks.cpp).
// Rows are independent, so the row loop is an OpenMP parallel-for; each row is quantized by one
// thread in block order, which keeps the output independent of the thread count.
#include "io/quantize.h"

#include <omp.h>

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu_kernels.h"  // f32 -> f16 with F16C where the CPU has it

namespace bp {
namespace {

// Below this many elements a tensor is converted on one thread: waking a team costs more than it
// saves, and on a loaded machine a descheduled team member stalls the rest.
constexpr int64_t kParallelMinElements = int64_t{1} << 18;

using QuantFn = void (*)(const float*, uint8_t*);
using DequantFn = void (*)(const uint8_t*, float*);

struct Kernels {
  QuantFn quant;
  DequantFn dequant;
};

Kernels kernels_for(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return {quantize_block_q8_0, dequantize_block_q8_0};
    case GGMLType::Q4_0: return {quantize_block_q4_0, dequantize_block_q4_0};
    case GGMLType::Q5_0: return {quantize_block_q5_0, dequantize_block_q5_0};
    case GGMLType::Q5_1: return {quantize_block_q5_1, dequantize_block_q5_1};
    case GGMLType::Q4_K: return {quantize_block_q4_k, dequantize_block_q4_k};
    case GGMLType::Q5_K: return {quantize_block_q5_k, dequantize_block_q5_k};
    case GGMLType::Q6_K: return {quantize_block_q6_k, dequantize_block_q6_k};
    default: return {nullptr, nullptr};
  }
}

// f32 -> f16, round to nearest even. The CPU kernel variants with F16C (avx2, avx512) convert 8
// values per instruction; the tail and other CPUs use core/dtype's f32_to_f16, which rounds the
// same way (tested).
void f32_to_f16_span(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = ops::f32_to_f16_prefix(src, dst, n);
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void check_rows(GGMLType t, int64_t nrows, int64_t n_per_row) {
  const auto& info = ggml_type_info(t);
  if (nrows < 0 || n_per_row < 0 || n_per_row % info.block_size != 0)
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED,
                fmt::format("[quantize] rows of {} values cannot be stored as {} (blocks of {})", n_per_row, info.name,
                            info.block_size));
}

}  // namespace

std::optional<DType> dtype_of_ggml(GGMLType t) {
  switch (t) {
    case GGMLType::F32: return DType::F32;
    case GGMLType::F16: return DType::F16;
    case GGMLType::BF16: return DType::BF16;
    case GGMLType::Q4_0: return DType::Q4_0;
    case GGMLType::Q5_0: return DType::Q5_0;
    case GGMLType::Q5_1: return DType::Q5_1;
    case GGMLType::Q8_0: return DType::Q8_0;
    case GGMLType::Q4_K: return DType::Q4_K;
    case GGMLType::Q5_K: return DType::Q5_K;
    case GGMLType::Q6_K: return DType::Q6_K;
  }
  return std::nullopt;
}

GGMLType ggml_of_dtype(DType t) {
  for (const auto& info : ggml_types())
    if (dtype_of_ggml(info.type) == t) return info.type;
  throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[quantize] {} has no ggml type", dtype_name(t)));
}

const std::vector<GGMLTypeInfo>& ggml_types() {
  static const std::vector<GGMLTypeInfo> types = {
      {GGMLType::F32, "f32", 1, 4},       {GGMLType::F16, "f16", 1, 2},       {GGMLType::Q4_0, "q4_0", 32, 18},
      {GGMLType::Q5_0, "q5_0", 32, 22},   {GGMLType::Q5_1, "q5_1", 32, 24},   {GGMLType::Q8_0, "q8_0", 32, 34},
      {GGMLType::Q4_K, "q4_K", 256, 144}, {GGMLType::Q5_K, "q5_K", 256, 176}, {GGMLType::Q6_K, "q6_K", 256, 210},
      {GGMLType::BF16, "bf16", 1, 2},
  };
  return types;
}

bool ggml_type_known(uint32_t id) {
  for (const auto& t : ggml_types())
    if (static_cast<uint32_t>(t.type) == id) return true;
  return false;
}

const GGMLTypeInfo& ggml_type_info(GGMLType t) {
  for (const auto& info : ggml_types())
    if (info.type == t) return info;
  throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED,
              fmt::format("[quantize] ggml type id {} is not supported", static_cast<uint32_t>(t)));
}

const char* ggml_type_name(GGMLType t) {
  return ggml_type_info(t).name;
}
bool ggml_is_quantized(GGMLType t) {
  return ggml_type_info(t).block_size > 1;
}

size_t ggml_row_bytes(GGMLType t, int64_t n) {
  check_rows(t, 1, n);
  const auto& info = ggml_type_info(t);
  return static_cast<size_t>(n / info.block_size) * info.block_bytes;
}

void quantize_rows(GGMLType t, const float* src, void* dst, int64_t nrows, int64_t n_per_row) {
  check_rows(t, nrows, n_per_row);
  auto* out = static_cast<uint8_t*>(dst);
  const size_t total = static_cast<size_t>(nrows) * static_cast<size_t>(n_per_row);
  switch (t) {
    case GGMLType::F32: std::memcpy(dst, src, total * 4); return;
    case GGMLType::F16:
    case GGMLType::BF16: {
      // Element-wise; chunk it so the threads share the work even for one long row.
      const int64_t n = static_cast<int64_t>(total);
      const int64_t chunk = 1 << 16;
      const DType dt = t == GGMLType::F16 ? DType::F16 : DType::BF16;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
      for (int64_t c = 0; c < (n + chunk - 1) / chunk; ++c) {
        const int64_t b = c * chunk, e = std::min(n, b + chunk);
        if (dt == DType::F16)
          f32_to_f16_span(src + b, reinterpret_cast<uint16_t*>(out) + b, e - b);
        else
          convert(src + b, DType::F32, out + b * 2, dt, static_cast<size_t>(e - b));
      }
      return;
    }
    default: break;
  }
  const Kernels k = kernels_for(t);
  const auto& info = ggml_type_info(t);
  const int64_t blocks_per_row = n_per_row / info.block_size;
  const int64_t nblocks = nrows * blocks_per_row;
  // Parallel over blocks (a block never spans rows), so few long rows still use every thread.
#pragma omp parallel for schedule(static) if (nblocks * info.block_size >= kParallelMinElements)
  for (int64_t b = 0; b < nblocks; ++b)
    k.quant(src + b * info.block_size, out + b * static_cast<int64_t>(info.block_bytes));
}

void dequantize_rows(GGMLType t, const void* src, float* dst, int64_t nrows, int64_t n_per_row) {
  check_rows(t, nrows, n_per_row);
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t total = static_cast<size_t>(nrows) * static_cast<size_t>(n_per_row);
  switch (t) {
    case GGMLType::F32: std::memcpy(dst, src, total * 4); return;
    case GGMLType::F16: convert(src, DType::F16, dst, DType::F32, total); return;
    case GGMLType::BF16: convert(src, DType::BF16, dst, DType::F32, total); return;
    default: break;
  }
  const Kernels k = kernels_for(t);
  const auto& info = ggml_type_info(t);
  const int64_t nblocks = nrows * (n_per_row / info.block_size);
#pragma omp parallel for schedule(static) if (nblocks * info.block_size >= kParallelMinElements)
  for (int64_t b = 0; b < nblocks; ++b)
    k.dequant(in + b * static_cast<int64_t>(info.block_bytes), dst + b * info.block_size);
}

}  // namespace bp
