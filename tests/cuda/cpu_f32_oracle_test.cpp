// The CPU is test_cuda's f32 oracle: every comparison in this binary ("the card's bf16 GEMM against
// the CPU's f32 product of the rounded operands", "a Turing card's f16 step against the CPU's")
// was derived for a CPU that multiplies a bf16-held weight with f32 activations. Since the CPU has
// bf16 numerics of its own for such weights (backend/cpu/gemm_engine.h, runtime.cpu_gemm auto:
// activations rounded to bf16), the oracle would round as the card does and these tests could no
// longer tell a bf16 GEMM from an f32 one. So the whole binary pins `--cpu-gemm openblas` (f32
// activations, the bits from before the engine existed), before any test runs. The CPU's own bf16
// numerics are tested against f32 in tests/ops/held_bf16_gemm_test.cpp and
// tests/model/held_bf16_step_test.cpp.
#include <gtest/gtest.h>

#include "backend/cpu/gemm_engine.h"

namespace bp::test {
namespace {

struct CpuGemmF32 : ::testing::Environment {
  void SetUp() override { cpu::select_cpu_gemm("openblas"); }
};

const ::testing::Environment* const kCpuGemmF32 = ::testing::AddGlobalTestEnvironment(new CpuGemmF32);

TEST(CudaTestsOracle, TheCpuMultipliesHeldBf16WeightsWithF32Activations) {
  EXPECT_EQ(cpu::cpu_gemm_choice().held_bf16, cpu::HeldBf16Path::F32) << cpu::cpu_gemm_choice().reason;
}

}  // namespace
}  // namespace bp::test
