// The CUDA dispatch table (src/backend/cuda/kernel_wrappers.h, ops/dispatch.h) on the simulated
// device (sim_device.h): device tensors get their memory from the CUDA caching allocator, host
// code cannot read it except through explicit copies (the guard that makes a stray host read
// fail in the simulation as it would crash on a GPU), and every op front-end run on CUDA tensors
// gives the CPU backend's result on random inputs at odd sizes.
#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "backend/cuda/attention_limits.h"
#include "op_parity.h"
#include "ops/attention.h"
#include "ops/op_table.h"
#include "sim_device.h"
#include "support/lora_group_check.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using parity::code_of;
using parity::gpu;
using parity::kGpu;

TEST(CudaDispatch, HostAccessToDeviceMemoryThrows) {
  SimulatedCudaDevice card;
  Tensor t = Tensor::zeros({3, 5}, DType::F32, kGpu);
  const Tensor& ct = t;
  EXPECT_EQ(code_of([&] { (void)t.data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)ct.data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)t.raw(); }), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(code_of([&] { (void)t.rows(1, 2).reshape({5}).data<float>(); }), ErrorCode::RUNTIME_INTERNAL);
  try {
    (void)t.data<float>();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[3, 5] on CUDA device 0"), std::string::npos) << e.what();
  }
  // The same tensor copied to the host reads normally.
  EXPECT_EQ(t.to(Device{}).data<float>()[7], 0.0f);
}

TEST(CudaDispatch, DeviceTensorsUseTheCachingAllocatorAndExplicitCopies) {
  SimulatedCudaDevice card;
  const size_t before = card.allocator().stats().bytes_in_use;
  {
    Tensor host = random_tensor({7, 33}, 1);
    Tensor d = gpu(host);
    EXPECT_EQ(card.allocator().stats().bytes_in_use, before + 7 * 33 * 4);
    EXPECT_EQ(d.to_vector(), host.to_vector());
    Tensor c = d.clone();
    EXPECT_EQ(c.to(Device{}).to_vector(), host.to_vector());
    Tensor h = d.to(DType::BF16);  // converted on the host, back on the device
    EXPECT_EQ(h.device(), kGpu);
    EXPECT_EQ(h.to_vector(), host.to(DType::BF16).to_vector());
    Tensor f = Tensor::empty({7, 33}, DType::F32, kGpu);
    f.fill(2.5f);
    EXPECT_EQ(f.to_vector(), std::vector<float>(7 * 33, 2.5f));
    f.copy_from(h);  // bf16 device -> f32 device
    EXPECT_EQ(f.to_vector(), host.to(DType::BF16).to_vector());
    Tensor back = Tensor::zeros({7, 33});
    back.copy_from(d);  // device -> host
    EXPECT_EQ(back.to_vector(), host.to_vector());
    d.rows(2, 3).zero();  // a view zeroes only its rows
    auto v = d.to_vector();
    EXPECT_EQ(v[2 * 33 + 5], 0.0f);
    EXPECT_EQ(v[3 * 33 + 5], host.to_vector()[3 * 33 + 5]);
  }
  EXPECT_EQ(card.allocator().stats().bytes_in_use, before);  // everything returned
  EXPECT_GT(card.allocator().stats().bytes_cached, 0u);      // and kept in the cache
}

TEST(CudaDispatch, EveryKernelIsInTheTable) {
  SimulatedCudaDevice card;
  const ops::Kernels& k = ops::kernels(DeviceType::CUDA);
  int total = 0;
#define BP_KERNEL(op, name) ++total;
#include "ops/kernels.inc"
#undef BP_KERNEL
  EXPECT_EQ(k.count, total);  // kernel_gaps.h is empty: the Mixture-of-Experts kernels are in moe.cuh
  EXPECT_NE(k.moe_route_forward.fn, nullptr);
  EXPECT_NE(k.moe_aux_accumulate.fn, nullptr);
  EXPECT_NE(k.attention_forward.fn, nullptr);
  EXPECT_NE(k.attention_backward.fn, nullptr);
  EXPECT_NE(k.rms_norm_forward.fn, nullptr);
  // The docs' CUDA column (kernel_gaps.h) says exactly which entries the table holds.
  int i = 0;
  const auto rows = ops::kernel_support_table();
#define BP_KERNEL(op, name) EXPECT_EQ(rows[static_cast<size_t>(i++)].cuda, k.name.fn != nullptr) << #name;
#include "ops/kernels.inc"
#undef BP_KERNEL
  // The table a CUDA build installs (the same wrappers over bp::cuda) holds the same entries.
  const ops::Kernels real = ops::builtin_cuda_kernels();
#ifdef BP_HAVE_CUDA
#define BP_KERNEL(op, name) EXPECT_EQ(real.name.fn != nullptr, k.name.fn != nullptr) << #name;
#include "ops/kernels.inc"
#undef BP_KERNEL
#else
  EXPECT_EQ(real.count, 0);
#endif
}

TEST(CudaDispatch, AttentionMatchesCpu) {
  SimulatedCudaDevice card;
  const uint64_t launches_before = sim::launch_count();
  parity::attention(kTolF32);
  EXPECT_GT(sim::launch_count(), launches_before);  // the simulated kernels ran, not the CPU's
}

TEST(CudaDispatch, MixtureOfExpertsOpsMatchCpu) {
  SimulatedCudaDevice card;
  const uint64_t launches_before = sim::launch_count();
  parity::moe(kTolF32);
  EXPECT_GT(sim::launch_count(), launches_before);
}

TEST(CudaDispatch, AttentionRefusesHeadsWiderThanTheKernelsTiles) {
  SimulatedCudaDevice card;
  const int d = kCudaAttentionMaxHeadDim + 2;
  Tensor q = Tensor::zeros({3, d}, DType::F32, kGpu), kv = Tensor::zeros({3, d}, DType::F32, kGpu);
  Tensor cu = gpu(Tensor::from_vector(std::vector<int32_t>{0, 3}, {2}));
  try {
    attention_forward(q, kv, kv, cu, AttentionShape{1, 1, d}, nullptr);
    ADD_FAILURE() << "head_dim " << d << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA);
    EXPECT_NE(std::string(e.what()).find("head_dim " + std::to_string(d)), std::string::npos) << e.what();
  }
  // The largest supported head still runs: the scalar f32 kernels on a Turing card, the tensor-core
  // ones (bf16 inputs) from compute capability 8.0 on.
  const int dmax = kCudaAttentionMaxHeadDim;
  Tensor q2 = gpu(random_tensor({3, dmax}, 5)), kv2 = gpu(random_tensor({3, dmax}, 6));
  const Tensor ref = attention_forward(q2.to(Device{}), kv2.to(Device{}), kv2.to(Device{}), cu.to(Device{}),
                                       AttentionShape{1, 1, dmax}, nullptr);
  for (const bool turing : {true, false}) {
    SimulatedComputeCapability cc(turing ? 7 : 8, turing ? 5 : 0);
    const Tensor o = attention_forward(q2, kv2, kv2, cu, AttentionShape{1, 1, dmax}, nullptr);
    parity::expect_same(o, ref, "attention at the widest head", turing ? kTolF32 : kTolBF16);
  }
}

TEST(CudaDispatch, MixedDevicesAreRefused) {
  SimulatedCudaDevice card;
  Tensor y = gpu(random_tensor({5, 3}, 2));
  Tensor x = random_tensor({5, 3}, 3);
  EXPECT_EQ(code_of([&] { add_inplace(y, x); }), ErrorCode::RUNTIME_INTERNAL);
}

TEST(CudaDispatch, ElementwiseMatchesCpu) {
  SimulatedCudaDevice card;
  parity::elementwise(kTolF32);
}

TEST(CudaDispatch, LinearWithLoraDropoutAndBiasMatchesCpu) {
  SimulatedCudaDevice card;
  parity::linear_with_lora_dropout_and_bias(kTolF32);
}

// A LoRA input group on the card (q/k/v, gate/up: one GEMM of x per product, ops/linear.h) against
// its members alone on the CPU.
TEST(CudaDispatch, LinearWithDoraMatchesCpu) {
  SimulatedCudaDevice card;
  parity::linear_with_dora(kTolF32);
}

TEST(CudaDispatch, LoraGroupMatchesEachProjectionAloneOnTheCpu) {
  SimulatedCudaDevice card;
  expect_lora_groups_match_projections_alone(kGpu);
}

TEST(CudaDispatch, HeldWeightsOfEveryTypeMatchCpu) {
  SimulatedCudaDevice card;
  for (DType type : parity::kHeldTypes) parity::held_weights(type, kTolF32);
}

TEST(CudaDispatch, NormRopeSwigluEmbeddingMatchCpu) {
  SimulatedCudaDevice card;
  parity::norm_rope_swiglu_embedding(kTolF32);
}

TEST(CudaDispatch, CrossEntropyAndOptimizerMatchCpu) {
  SimulatedCudaDevice card;
  parity::cross_entropy_and_optimizer(kTolF32);
}

}  // namespace
}  // namespace bp::test
