// Front-end of the CPU kernel variants; see cpu_kernels.h.
#include "ops/cpu_kernels.h"

#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/kernel_variants.h"

namespace bp::ops {

CpuKernelInfo cpu_kernel_info() {
  const cpu::KernelChoice kc = cpu::cpu_kernel_choice();
  CpuKernelInfo info{cpu::kernel_variant_name(kc.variant), kc.reason, {}};
  for (auto v : cpu::supported_kernel_variants()) info.supported.push_back(cpu::kernel_variant_name(v));
  return info;
}

void select_cpu_kernels(std::string_view name) {
  cpu::select_cpu_kernels(name);
}

CpuGemmInfo cpu_gemm_info() {
  const cpu::GemmEngineChoice c = cpu::cpu_gemm_choice();
  return {c.setting, cpu::held_bf16_path_name(c.held_bf16), c.reason, cpu::onednn_built(), cpu::onednn_version()};
}

std::string cpu_gemm_description(bool frozen_bf16) {
  return cpu::describe_cpu_gemms(frozen_bf16);
}

void select_cpu_gemm(std::string_view name) {
  cpu::select_cpu_gemm(name);
}

int64_t f32_to_f16_prefix(const float* src, uint16_t* dst, int64_t n) {
  return cpu::cpu_kernels().f32_to_f16_prefix(src, dst, n);
}

}  // namespace bp::ops
