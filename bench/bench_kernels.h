// The CPU kernel variant for a benchmark, taken as `backprop` takes it: runtime.cpu_kernels from
// BACKPROPAGATE_RUNTIME__CPU_KERNELS (auto, generic, avx2, avx512). Printed on stderr so JSON
// output on stdout stays clean.
#pragma once

#include <cstdio>

#include "backend/cpu/kernel_variants.h"
#include "core/settings.h"

namespace bp::bench {

inline void select_kernels_from_environment() {
  const Settings settings = Settings::load("", current_environment(), {});
  cpu::select_cpu_kernels(settings.get_string("runtime.cpu_kernels"));
  const cpu::KernelChoice k = cpu::cpu_kernel_choice();
  std::fprintf(stderr, "cpu kernels: %s (%s)\n", cpu::kernel_variant_name(k.variant), k.reason.c_str());
}

}  // namespace bp::bench
