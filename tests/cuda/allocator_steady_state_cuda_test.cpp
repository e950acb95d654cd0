// Steady state of the card's caching allocator under training (caching_allocator.h): packed
// micro-batches of varying token counts make activations of varying sizes every step; best fit
// with splitting over cached segments (device_block_pool.h) serves them without cudaMalloc, counted
// by the simulated runtime (sim::cuda_malloc_calls). The allocator-level replay of many steps is in
// caching_allocator_cuda_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "trainer_cuda_util.h"

namespace bp::test {
namespace {

using namespace cuda_trainer;

// Samples of 3 to 32 words after two of 40 (in file order the first micro-batch is the longest).
std::string write_varying_dataset(const std::string& dir, int samples) {
  const std::string path = dir + "/varying.jsonl";
  std::ofstream f(path);
  const char* words[] = {"Lily", "had", "a", "red", "ball", "and", "Tom", "liked", "the", "big", "dog"};
  uint32_t x = 7;
  for (int i = 0; i < samples; ++i) {
    x = x * 1103515245u + 12345u;
    const int n = i < 2 ? 40 : 3 + static_cast<int>((x >> 16) % 30);
    f << "{\"text\": \"";
    for (int w = 0; w < n; ++w) f << (w ? " " : "") << words[(static_cast<uint32_t>(w) * 7u + x) % 11];
    f << ".\"}\n";
  }
  return path;
}

// tiny-chat trained with packing on samples of 3 to 40 words: every micro-batch has another token
// count, so every activation has another size from step to step. After the first step (the longest
// micro-batch: samples in file order) the cache holds what the steps need: no step after it calls
// cudaMalloc (before best fit and splitting,
// with reuse of blocks of the same rounded size only, each step made 27 to 71 cudaMallocs here and
// the card's reserved memory grew to 4.6x the peak in use).
TEST(CudaTrainer, StepsOnVaryingLengthsCallNoCudaMallocAfterTheFirst) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cuda");
  o.data_path = write_varying_dataset(dir.path, 24);
  o.steps = 5;
  o.batch_size = 2;
  o.micro_batch_size = 2;
  o.holdout = 0.0;
  o.max_seq_length = 48;
  o.gradient_checkpointing = false;
  o.shuffle = false;
  SimulatedCudaDevice card;
  std::vector<uint64_t> mallocs{sim::cuda_malloc_calls()}, queries{sim::gemm_heuristic_queries()};
  std::vector<int64_t> tokens;
  TrainCallbacks cb;
  cb.on_step = [&](const StepRecord& rec, const TrainSummary&, int64_t) {
    mallocs.push_back(sim::cuda_malloc_calls());
    queries.push_back(sim::gemm_heuristic_queries());
    tokens.push_back(rec.tokens);
  };
  Trainer(o, cb).run();
  ASSERT_EQ(mallocs.size(), 6u);
  EXPECT_GT(mallocs[1], mallocs[0]) << "the first step fills the cache";
  EXPECT_EQ(*std::max_element(tokens.begin(), tokens.end()), tokens[0]) << "the first step is the longest";
  std::set<int64_t> distinct(tokens.begin(), tokens.end());
  EXPECT_GE(distinct.size(), 4u) << "the steps' token counts differ";
  std::cout << "[steady state] tokens, cudaMallocs, cuBLASLt heuristic queries per step:";
  for (size_t step = 1; step < mallocs.size(); ++step)
    std::cout << " (" << tokens[step - 1] << ", " << mallocs[step] - mallocs[step - 1] << ", "
              << queries[step] - queries[step - 1] << ")";
  std::cout << "\n";
  for (size_t step = 2; step < mallocs.size(); ++step)
    EXPECT_EQ(mallocs[step] - mallocs[step - 1], 0u) << "step " << step << " (" << tokens[step - 1] << " tokens)";
  EXPECT_LT(card.allocator().reserved_bytes(), 4 * card.allocator().stats().bytes_peak) << "the cache stays bounded";
}

}  // namespace
}  // namespace bp::test
