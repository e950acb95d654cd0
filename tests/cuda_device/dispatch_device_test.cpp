// The CUDA dispatch table of this build (src/backend/cuda/cuda_kernel_wrappers.h over the real
// kernels and cuBLASLt) on a REAL device against the CPU backend: the same op-level checks the
// simulated device runs in tests/cuda (op_parity.h), with device tensors from the real caching
// allocator. CUDA builds only; without a usable device the tests skip, unless BP_REQUIRE_GPU=1
// (scripts/gpu_check.sh), where no device is a failure.
#include <gtest/gtest.h>

#ifdef BP_HAVE_CUDA
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_device.h"
#include "cuda/op_parity.h"
#include "support/lora_group_check.h"

namespace bp::test {
namespace {

// GEMMs on the GPU sum in another order than OpenBLAS: a little wider than the simulation's f32.
constexpr Tolerance kDeviceTol{1e-5, 1e-4};

#define BP_NEED_DEVICE_TABLE()                                                             \
  do {                                                                                     \
    if (cuda_status().devices.empty()) {                                                   \
      const char* require = std::getenv("BP_REQUIRE_GPU");                                 \
      if (require && std::string(require) == "1") FAIL() << "BP_REQUIRE_GPU=1: no device"; \
      GTEST_SKIP() << "no usable CUDA device";                                             \
    }                                                                                      \
  } while (0)

TEST(CudaDeviceDispatch, MixtureOfExpertsOpsMatchCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::moe(kDeviceTol);
}

TEST(CudaDeviceDispatch, ElementwiseMatchesCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::elementwise(kDeviceTol);
}

TEST(CudaDeviceDispatch, LinearWithLoraDropoutAndBiasMatchesCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::linear_with_lora_dropout_and_bias(kDeviceTol);
}

TEST(CudaDeviceDispatch, LinearWithDoraMatchesCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::linear_with_dora(kDeviceTol);
}

TEST(CudaDeviceDispatch, LoraGroupMatchesEachProjectionAloneOnTheCpu) {
  BP_NEED_DEVICE_TABLE();
  expect_lora_groups_match_projections_alone(parity::kGpu, kDeviceTol);
}

TEST(CudaDeviceDispatch, HeldWeightsOfEveryTypeMatchCpu) {
  BP_NEED_DEVICE_TABLE();
  for (DType type : parity::kHeldTypes) parity::held_weights(type, kDeviceTol);
}

TEST(CudaDeviceDispatch, NormRopeSwigluEmbeddingMatchCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::norm_rope_swiglu_embedding(kDeviceTol);
}

TEST(CudaDeviceDispatch, CrossEntropyAndOptimizerMatchCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::cross_entropy_and_optimizer(kDeviceTol);
}

TEST(CudaDeviceDispatch, AttentionMatchesCpu) {
  BP_NEED_DEVICE_TABLE();
  parity::attention(kDeviceTol);
}

}  // namespace
}  // namespace bp::test
#endif
