// cuBLASLt's workspace on the simulated card (backend/cuda/kernel_wrappers.h gemm_workspace,
// caching_allocator.h CachingDeviceAllocator::gemm_workspace): every GEMM the wrappers make, the
// fused loss's included, gets the size NVIDIA recommends for the card's compute capability
// (device_workspace.h: 4 MiB, 32 MiB from CC 9 on), from our allocator (counted in use), allocated
// at the first GEMM and held, never twice; the simulated cuBLASLt refuses a workspace that is not
// live device memory of that size as the illegal access it would be on a card; when the workspace
// cannot be had, the GEMMs run without one instead of failing (and the results are the same).
#include <gtest/gtest.h>

#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "op_parity.h"
#include "ops/device_compute.h"
#include "sim_device.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using parity::gpu;
using parity::kGpu;

constexpr size_t kMiB = size_t{1} << 20;
constexpr int64_t kT = 37, kIn = 71, kOut = 45, kV = 101;

// The GEMMs of a LoRA layer over `base` (forward, dx, dA, dB) and of the fused LM head + loss over
// a head held as `base`, on the card; returns the layer's y.
Tensor run_layer_and_loss(DType base) {
  const Tensor x = gpu(random_tensor({kT, kIn}, 1)), W = gpu(random_tensor({kOut, kIn}, 2).to(base));
  const Tensor A = gpu(random_tensor({3, kIn}, 3)), B = gpu(random_tensor({kOut, 3}, 4));
  const Tensor head = gpu(random_tensor({kV, kIn}, 5).to(base));
  std::vector<int32_t> lab(static_cast<size_t>(kT));
  for (int64_t t = 0; t < kT; ++t) lab[static_cast<size_t>(t)] = static_cast<int32_t>(t * 7 % kV);
  const Tensor labels = gpu(Tensor::from_vector(lab, {kT}));
  LoraWeights lora{&A, &B, 0.5f, 0.0f, 0, true};
  LinearSaved saved;
  Tensor y = linear_forward(x, W, nullptr, &lora, &saved);
  Tensor dx = Tensor::empty({kT, kIn}, DType::F32, kGpu), dA = gpu(Tensor::zeros({3, kIn}));
  Tensor dB = gpu(Tensor::zeros({kOut, 3}));
  linear_backward(y, x, W, &lora, &saved, LinearGrads{&dx, nullptr, nullptr, &dA, &dB});
  linear_cross_entropy_forward_backward(x, head, labels, 0.5f, dx, nullptr, 16);
  return y;
}

TEST(CudaGemmWorkspace, RecommendedSizeFollowsTheComputeCapability) {
  EXPECT_EQ(cuda_workspace::gemm_workspace_bytes(7), 4 * kMiB);
  EXPECT_EQ(cuda_workspace::gemm_workspace_bytes(8), 4 * kMiB);
  EXPECT_EQ(cuda_workspace::gemm_workspace_bytes(9), 32 * kMiB);
  EXPECT_EQ(cuda_workspace::gemm_workspace_bytes(10), 32 * kMiB);
  SimulatedCudaDevice card;
  for (auto [major, minor, bytes] : {std::tuple{8, 0, 4 * kMiB}, {8, 6, 4 * kMiB}, {9, 0, 32 * kMiB}}) {
    sim::set_compute_capability(major, minor);
    EXPECT_EQ(SimulatedCudaDevice::kernels().gemm_workspace_bytes(), bytes) << major << "." << minor;
    // What the trainer's memory plan counts is what the installed kernels hold.
    EXPECT_EQ(ops::device_gemm_workspace_bytes(DeviceType::CUDA), bytes) << major << "." << minor;
  }
  EXPECT_EQ(ops::device_gemm_workspace_bytes(DeviceType::CPU), 0u);
}

// Every GEMM (LoRA layer forward and backward over a bf16, an f32 and an f16 base, the fused loss
// over a head held likewise) gets the workspace the allocator holds: one block of the recommended size,
// in use from the first GEMM on and not allocated again by the next ones.
TEST(CudaGemmWorkspace, EveryGemmGetsTheHeldWorkspaceOfTheRecommendedSize) {
  for (auto [major, bytes] : {std::pair{8, 4 * kMiB}, {9, 32 * kMiB}}) {
    SimulatedCudaDevice card;
    sim::set_compute_capability(major, 0);
    EXPECT_EQ(card.allocator().gemm_workspace_bytes(), 0u) << "nothing is held before the first GEMM";
    sim::GemmRecorder rec;
    const size_t in_use_before = card.allocator().stats().bytes_in_use;
    const uint64_t allocs_before = card.allocator().stats().num_allocs;
    Tensor y = run_layer_and_loss(DType::BF16);
    EXPECT_EQ(card.allocator().gemm_workspace_bytes(), bytes);
    EXPECT_EQ(card.allocator().stats().bytes_in_use - in_use_before, bytes + y.nbytes())
        << "the workspace is in use (counted) after the calls; everything else went back";
    const uint64_t allocs_first = card.allocator().stats().num_allocs - allocs_before;
    const sim::GemmWorkspaceSeen held = sim::last_gemm_workspace();
    EXPECT_EQ(held.bytes, bytes);
    EXPECT_TRUE(sim::memory_range_live(held.ptr, held.bytes));
    for (DType base : {DType::F32, DType::F16}) {
      Tensor y2 = run_layer_and_loss(base);
      EXPECT_EQ(sim::last_gemm_workspace().ptr, held.ptr) << dtype_name(base) << ": the same block";
      EXPECT_EQ(card.allocator().stats().bytes_in_use - in_use_before, bytes + y.nbytes() + y2.nbytes())
          << dtype_name(base) << ": the workspace is counted once";
    }
    ASSERT_GT(rec.descs().size(), 10u);
    for (size_t i = 0; i < rec.workspace_bytes().size(); ++i)
      EXPECT_EQ(rec.workspace_bytes()[i], bytes) << "GEMM " << i << " (m=" << rec.descs()[i].m << ")";
    // Only the first pass allocated the workspace: a pass over the bf16 base again allocates one block less.
    const uint64_t allocs_third = card.allocator().stats().num_allocs;
    Tensor y3 = run_layer_and_loss(DType::BF16);
    EXPECT_EQ(card.allocator().stats().num_allocs - allocs_third, allocs_first - 1);
  }
}

// Another compute capability on the same card (only the simulation can do that) replaces the held
// block: the old one is given back, so in use counts the new size alone. The card's end frees it.
TEST(CudaGemmWorkspace, AnotherSizeReplacesTheHeldBlockAndTheCardsEndFreesIt) {
  const size_t on_card_before = sim::memory_in_use();
  {
    SimulatedCudaDevice card;
    run_layer_and_loss(DType::F32);
    EXPECT_EQ(card.allocator().stats().bytes_in_use, 4 * kMiB);
    sim::set_compute_capability(9, 0);
    run_layer_and_loss(DType::F32);
    EXPECT_EQ(card.allocator().stats().bytes_in_use, 32 * kMiB);
    EXPECT_EQ(sim::last_gemm_workspace().bytes, 32 * kMiB);
    card.allocator().release_gemm_workspace();
    EXPECT_EQ(card.allocator().stats().bytes_in_use, 0u);
    run_layer_and_loss(DType::F32);
    EXPECT_EQ(card.allocator().stats().bytes_in_use, 32 * kMiB);
  }
  EXPECT_EQ(sim::memory_in_use(), on_card_before) << "the allocator's end gave the held workspace back to the card";
}

// cuBLASLt's contract, as the simulation holds it: `workspace_bytes` of live device memory at
// `workspace`. Host memory, a block shorter than claimed, a range running past the block's end and
// a freed block are refused as the illegal access they would be on a card; none (0 bytes) is fine.
TEST(CudaGemmWorkspace, SimulatedCublasLtRefusesAWorkspaceThatIsNotLiveDeviceMemory) {
  const gemm::GemmDesc d = gemm::linear_forward_gemm(3, 5, 4, gemm::DType::F32, gemm::DType::F32);
  std::vector<float> x(15, 1.0f), w(20, 0.5f), y(12, 0.0f);
  auto run = [&](void* ws, size_t bytes) {
    return parity::code_of([&] { sim::gemm(d, w.data(), x.data(), y.data(), ws, bytes, nullptr); });
  };
  void* block = nullptr;
  ASSERT_EQ(sim::cudaMalloc(&block, 4096), sim::cudaSuccess);
  EXPECT_EQ(run(nullptr, 0), std::nullopt);
  EXPECT_EQ(run(block, 4096), std::nullopt);
  EXPECT_EQ(run(static_cast<char*>(block) + 1024, 3072), std::nullopt);
  EXPECT_EQ(y[0], 2.5f) << "the GEMM ran";
  std::vector<unsigned char> host(8192);
  EXPECT_EQ(run(host.data(), host.size()), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << "host memory";
  EXPECT_EQ(run(block, 8192), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << "shorter than claimed";
  EXPECT_EQ(run(static_cast<char*>(block) + 1024, 4096), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << "past the end";
  EXPECT_EQ(run(nullptr, 4096), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << "a size without memory";
  try {
    sim::gemm(d, w.data(), x.data(), y.data(), host.data(), 64, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorIllegalAddress"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("workspace of 64 bytes"), std::string::npos) << e.what();
  }
  sim::cudaFree(block);
  EXPECT_EQ(run(block, 4096), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << "freed";
}

// Past our own limit (--max-memory): the GEMMs run without a workspace, with the same results, no
// OutOfMemoryError counted and nothing held; the first GEMM after the limit allows it holds one.
TEST(CudaGemmWorkspace, NoRoomUnderTheLimitRunsTheGemmsWithoutAWorkspace) {
  SimulatedCudaDevice card;
  const Tensor x = random_tensor({kT, kIn}, 31), W = random_tensor({kOut, kIn}, 32);
  const Tensor xg = gpu(x), Wg = gpu(W);
  card.allocator().set_limit(card.allocator().stats().bytes_in_use + 2 * kMiB);  // room for y, not 4 MiB more
  sim::GemmRecorder rec;
  const Tensor y = linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  parity::expect_same(y, linear_forward(x, W, nullptr, nullptr, nullptr), "y", kTolF32);
  ASSERT_EQ(rec.workspace_bytes().size(), 1u);
  EXPECT_EQ(rec.workspace_bytes()[0], 0u);
  EXPECT_EQ(card.allocator().gemm_workspace_bytes(), 0u);
  EXPECT_EQ(card.allocator().stats().num_ooms, 0u) << "our limit was checked, not hit";
  card.allocator().set_limit(kNoLimit);
  linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  EXPECT_EQ(rec.workspace_bytes().back(), 4 * kMiB);
  EXPECT_EQ(card.allocator().gemm_workspace_bytes(), 4 * kMiB);
}

// The card refuses (another process holds its memory): the refusal is counted once, the GEMMs run
// without a workspace until the cache is next emptied (as the OOM recovery does), then hold one.
TEST(CudaGemmWorkspace, CardRefusingTheWorkspaceRunsTheGemmsWithoutOneUntilTheCacheIsEmptied) {
  SimulatedCudaDevice card(16 * kMiB);
  const Tensor x = random_tensor({kT, kIn}, 41), W = random_tensor({kOut, kIn}, 42);
  const Tensor xg = gpu(x), Wg = gpu(W);
  void* other = nullptr;
  ASSERT_EQ(sim::cudaMalloc(&other, 14 * kMiB), sim::cudaSuccess);
  sim::GemmRecorder rec;
  const Tensor y = linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  parity::expect_same(y, linear_forward(x, W, nullptr, nullptr, nullptr), "y", kTolF32);
  linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  EXPECT_EQ(rec.workspace_bytes(), (std::vector<size_t>{0, 0}));
  EXPECT_EQ(card.allocator().stats().num_ooms, 1u) << "the card's refusal, once: the second GEMM did not ask";
  sim::cudaFree(other);
  linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  EXPECT_EQ(rec.workspace_bytes().back(), 0u) << "not asked again before the cache is emptied";
  card.allocator().empty_cache();
  linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  EXPECT_EQ(rec.workspace_bytes().back(), 4 * kMiB);
  EXPECT_EQ(card.allocator().stats().num_ooms, 1u);
}

}  // namespace
}  // namespace bp::test
