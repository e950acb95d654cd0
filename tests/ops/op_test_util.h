// Small helpers shared by the op tests in this folder (linear, embedding, rms_norm, rope, swiglu),
// and the per-kernel-variant fixture.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/kernel_variants.h"
#include "core/error.h"

namespace bp::test {

// Runs f, expects a bp::Error with `code` whose message contains every string in `parts`.
template <class F>
void expect_op_error(F&& f, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// A test fixture run once per CPU kernel variant this machine supports (generic, avx2, avx512:
// backend/cpu/kernel_variants.h); the variant is forced for the test and back to auto after it.
// Use: class MyVariants : public test::PerKernelVariant {}; TEST_P(MyVariants, ...) {...}
//      BP_PER_KERNEL_VARIANT(MyVariants);
class PerKernelVariant : public ::testing::TestWithParam<cpu::KernelVariant> {
 protected:
  void SetUp() override { cpu::select_cpu_kernels(cpu::kernel_variant_name(GetParam())); }
  void TearDown() override { cpu::select_cpu_kernels("auto"); }
};

inline std::string kernel_variant_test_name(const ::testing::TestParamInfo<cpu::KernelVariant>& info) {
  return cpu::kernel_variant_name(info.param);
}

}  // namespace bp::test

#define BP_PER_KERNEL_VARIANT(Fixture)                                                                \
  INSTANTIATE_TEST_SUITE_P(Cpu, Fixture, ::testing::ValuesIn(::bp::cpu::supported_kernel_variants()), \
                           ::bp::test::kernel_variant_test_name)
