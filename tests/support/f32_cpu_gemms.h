// Pins the CPU's GEMMs against bf16 weights to f32 arithmetic (--cpu-gemm openblas: activations kept
// f32, the weight widened, backend/cpu/gemm_engine.h) while alive, for tests whose oracle multiplies
// in f32; `auto` again after. The bf16 numerics the other engines use are held to bf16's bounds in
// tests/ops/held_bf16_gemm_test.cpp and tests/model/held_bf16_step_test.cpp.
#pragma once

#include "backend/cpu/gemm_engine.h"

namespace bp::test {

struct F32CpuGemms {
  explicit F32CpuGemms(bool pin = true) : pinned(pin) {
    if (pinned) cpu::select_cpu_gemm("openblas");
  }
  ~F32CpuGemms() {
    if (pinned) cpu::select_cpu_gemm("auto");
  }
  F32CpuGemms(const F32CpuGemms&) = delete;
  F32CpuGemms& operator=(const F32CpuGemms&) = delete;
  bool pinned;
};

}  // namespace bp::test
