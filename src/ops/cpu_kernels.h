// The CPU kernel variants (backend/cpu/kernel_variants.h) as the layers above ops see them: which
// instruction-set variant runs and why, choosing one (runtime.cpu_kernels), and the one
// hand-vectorised conversion io/ uses. Everything outside backend/ and ops/ goes through here
// (DESIGN.md "Layers"; tests/core/layer_order_test.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bp::ops {

struct CpuKernelInfo {
  std::string variant;                 // "generic", "avx2", "avx512"
  std::string reason;                  // "detected: ..." or "forced by runtime.cpu_kernels"
  std::vector<std::string> supported;  // the variants this CPU runs
};
CpuKernelInfo cpu_kernel_info();

// auto | generic | avx2 | avx512; a variant the CPU lacks throws DEP_CPU_KERNELS_UNSUPPORTED.
void select_cpu_kernels(std::string_view name);

// The CPU's GEMM engines (backend/cpu/gemm_engine.h): runtime.cpu_gemm as selected, the path of the
// GEMMs against weights held in bf16 ("bf16-onednn", "bf16-openblas", "f32-openblas") and why, whether
// the build has oneDNN (and its version), and what each GEMM kind computes in (frozen_bf16: name the
// GEMMs against bf16-held weights too).
struct CpuGemmInfo {
  std::string setting, held_bf16, reason;
  bool onednn = false;
  std::string onednn_version;
};
CpuGemmInfo cpu_gemm_info();
std::string cpu_gemm_description(bool frozen_bf16);
// auto | openblas | onednn (runtime.cpu_gemm); onednn without oneDNN throws DEP_CPU_GEMM_UNAVAILABLE.
void select_cpu_gemm(std::string_view name);

// f32 -> f16 (round to nearest even) of a prefix of [0, n) with the selected variant's conversion;
// returns how many it converted (0 where the ISA has none; the caller converts the rest).
int64_t f32_to_f16_prefix(const float* src, uint16_t* dst, int64_t n);

}  // namespace bp::ops
