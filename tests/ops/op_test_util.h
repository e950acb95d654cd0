// Small helpers shared by the op tests in this folder (linear, embedding, rms_norm, rope, swiglu),
// and the per-kernel-variant fixture.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/kernel_variants.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "support/cpu_kernels_env.h"

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

// `copy` is `of` (an op's f32 output) rounded to nearest-even bf16, bit for bit: the bf16 outputs
// the bf16 GEMMs read (ops/linear.h x_bf16, dy_bf16).
inline void expect_bf16_copy_of(const Tensor& copy, const Tensor& of, const std::string& what) {
  ASSERT_EQ(copy.dtype(), DType::BF16) << what;
  ASSERT_EQ(copy.shape(), of.shape()) << what;
  const std::vector<float> v = of.to_vector();
  const uint16_t* bits = copy.data<uint16_t>();
  size_t bad = 0;
  for (size_t i = 0; i < v.size(); ++i) bad += bits[i] != f32_to_bf16(v[i]);
  EXPECT_EQ(bad, 0u) << what << ": values that are not the rounded output";
}

// A test fixture run once per CPU kernel variant this machine supports (generic, avx2, avx512:
// backend/cpu/kernel_variants.h); the variant is forced for the test and back to the binary's
// (test_cpu_kernels()) after it.
// Use: class MyVariants : public test::PerKernelVariant {}; TEST_P(MyVariants, ...) {...}
//      BP_PER_KERNEL_VARIANT(MyVariants);
class PerKernelVariant : public ::testing::TestWithParam<cpu::KernelVariant> {
 protected:
  void SetUp() override { cpu::select_cpu_kernels(cpu::kernel_variant_name(GetParam())); }
  void TearDown() override { cpu::select_cpu_kernels(test_cpu_kernels()); }
};

inline std::string kernel_variant_test_name(const ::testing::TestParamInfo<cpu::KernelVariant>& info) {
  return cpu::kernel_variant_name(info.param);
}

}  // namespace bp::test

#define BP_PER_KERNEL_VARIANT(Fixture)                                                                \
  INSTANTIATE_TEST_SUITE_P(Cpu, Fixture, ::testing::ValuesIn(::bp::cpu::supported_kernel_variants()), \
                           ::bp::test::kernel_variant_test_name)
