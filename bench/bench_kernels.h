// The CPU kernel variant and GEMM engine for a benchmark, taken as `backprop` takes them:
// runtime.cpu_kernels from BACKPROPAGATE_RUNTIME__CPU_KERNELS (auto, generic, avx2, avx512) and
// runtime.cpu_gemm from BACKPROPAGATE_RUNTIME__CPU_GEMM (auto, openblas, onednn). Printed on stderr
// so JSON output on stdout stays clean.
#pragma once

#include <cstdio>

#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/kernel_variants.h"
#include "core/settings.h"

namespace bp::bench {

inline void select_kernels_from_environment() {
  const Settings settings = Settings::load("", current_environment(), {});
  cpu::select_cpu_kernels(settings.get_string("runtime.cpu_kernels"));
  const cpu::KernelChoice k = cpu::cpu_kernel_choice();
  std::fprintf(stderr, "cpu kernels: %s (%s)\n", cpu::kernel_variant_name(k.variant), k.reason.c_str());
  cpu::select_cpu_gemm(settings.get_string("runtime.cpu_gemm"));
  const cpu::GemmEngineChoice g = cpu::cpu_gemm_choice();
  std::fprintf(stderr, "cpu gemm: %s; against bf16-held weights %s (%s)\n", g.setting.c_str(),
               cpu::held_bf16_path_name(g.held_bf16), g.reason.c_str());
}

}  // namespace bp::bench
