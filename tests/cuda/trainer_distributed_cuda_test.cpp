// Data-parallel training on CUDA devices as far as a machine without a GPU can run it (issue 40):
// two ranks under real mpirun, each training on its own simulated card (sim_device.h), the MPI
// collective between them summing the cards' gradients (through host memory: the simulation has
// no NCCL, so training.nccl_library none), ZeRO-1 splitting AdamW's state that lives on the cards.
// Against one process on one simulated card with the same global batch: the same losses within f32
// summation order and the same adapter. The NCCL reduction itself runs on two real GPUs in
// scripts/gpu_check.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/collective.h"
#include "trainer_cuda_util.h"

namespace bp::test {
namespace {

using namespace cuda_trainer;

#ifndef BP_MPI_PLUGIN  // the plugin this build made (tests/CMakeLists.txt), when it made one
#define BP_MPI_PLUGIN ""
#endif

// The run both sides train: tiny-chat's LoRA on the simulated card, a global batch of 2 in
// micro-batches of 1 (one per rank at 2 ranks), dropout on (seeded by each micro-batch's first
// sample, so it is the same at either rank count).
TrainOptions run_options(const std::string& data_dir, const std::string& out) {
  TrainOptions o = tiny_chat_options(data_dir, "cuda");
  o.output_dir = out;
  o.holdout = 0;
  o.steps = 2;  // the simulation runs each kernel's threads one at a time: few, short steps
  o.batch_size = 2;
  o.micro_batch_size = 1;
  o.max_seq_length = 24;
  o.gradient_checkpointing = false;
  o.nccl_library = "none";
  return o;
}

std::vector<double> step_losses(const std::string& run) {
  std::vector<double> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "step") out.push_back(j["loss"].get<double>());
  }
  return out;
}

TEST(CudaDistributed, TwoRanksOnSimulatedCardsMatchOneCard) {
  if (const char* dir = std::getenv("BP_CUDA_DP_WORKER")) {  // a rank, under mpirun
    const std::string rank_dir = std::string(dir) + "/rank" + std::getenv("OMPI_COMM_WORLD_RANK");
    std::filesystem::create_directories(rank_dir);
    SimulatedCudaDevice card;
    TrainOptions o = run_options(rank_dir, std::string(dir) + "/two");
    o.distributed = "mpi";
    o.mpi_library = BP_MPI_PLUGIN;
    const TrainSummary s = Trainer(o).run();
    EXPECT_EQ(s.world_size, 2);
    finalize_process_collective();
    return;
  }
  if (find_mpirun().empty()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  ASSERT_FALSE(std::string(BP_MPI_PLUGIN).empty()) << "mpirun is installed but this build has no MPI plugin";
  TempDir tmp;
  {
    SimulatedCudaDevice card;
    Trainer(run_options(tmp.path, tmp.path + "/one")).run();
  }
  std::string out;
  const std::string cmd =
      "BP_CUDA_DP_WORKER=" + tmp.path + " LSAN_OPTIONS=suppressions=" + source_dir() +
      "/tests/support/lsan_openmpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 " + find_mpirun() +
      " --allow-run-as-root --oversubscribe --timeout 300 --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo"
      " -x BP_CUDA_DP_WORKER -x OMP_NUM_THREADS=1 -np 2 " +
      std::string(BP_BINARY_DIR) +
      "/tests/test_cuda --gtest_color=no --gtest_filter=CudaDistributed.TwoRanksOnSimulatedCardsMatchOneCard 2>&1";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("ZeRO-1: AdamW's m and v are split over 2 ranks"), std::string::npos) << out;
  const std::vector<double> one = step_losses(tmp.path + "/one"), two = step_losses(tmp.path + "/two");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u) << out;
  for (size_t i = 0; i < one.size(); ++i) EXPECT_LE(std::fabs(two[i] - one[i]), 1e-5 * std::fabs(one[i])) << i;
  EXPECT_GT(std::fabs(one.front() - one.back()), 1e-4);  // it trained
}

}  // namespace
}  // namespace bp::test
