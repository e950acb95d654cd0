// Front-end of the CPU kernel variants; see cpu_kernels.h.
#include "ops/cpu_kernels.h"

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

int64_t f32_to_f16_prefix(const float* src, uint16_t* dst, int64_t n) {
  return cpu::cpu_kernels().f32_to_f16_prefix(src, dst, n);
}

}  // namespace bp::ops
