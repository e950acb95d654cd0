// ZeRO stage 1 (--shard-optimizer, on by default over several ranks; train/optimizer.h): each rank
// keeps AdamW's m and v for 1/N of the trainable values and the parameters are all-gathered. The
// real backprop under real mpirun on the loopback, on the real stories260K model.
//
// Sharded and unsharded runs give the same bits, not merely close values: each value's update is
// the same elementwise kernel on the same inputs (the whole summed gradient every rank holds, its
// own m and v), whichever rank computes it, and the all-gather copies the owner's bits. So the
// comparisons below are exact; a difference would be a bug in the sharding, not rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed_test_util.h"
#include "support/test_util.h"

namespace bp {

using namespace dist_test;  // NOLINT: the shared helpers of these tests

namespace {

std::string full_args(const std::string& data, const std::string& root, const std::string& extra) {
  return train_args(data, root, "--mode full " + extra, "1e-3");
}

void expect_same_bits(const std::string& a, const std::string& b, const std::string& file) {
  const std::string x = slurp(a + "/" + file);
  ASSERT_FALSE(x.empty()) << a << "/" << file;
  EXPECT_TRUE(x == slurp(b + "/" + file)) << file << " differs between " << a << " and " << b;
}

}  // namespace

// Full fine-tuning at 2 ranks, sharded (the default) and not, the unsharded one reducing each layer's
// gradients under the backward (--overlap-communication true: the all-reduce by layers, then the
// embeddings and the final norm): the same losses, the same model and
// the same checkpoint files bit for bit (the sharded checkpoint's optimizer.safetensors is the
// whole state gathered to rank 0). The memory plan counts half the optimizer state per rank:
// 2 × trainable × 4 bytes / 2.
TEST(DistributedZero, ShardedOptimizerGivesTheUnshardedBits) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out_sharded, out_whole;
  ASSERT_EQ(test::run_command(mpirun_prefix(2) + test::backprop_exe() + full_args(data, tmp.path + "/z", "") + " 2>&1",
                              &out_sharded),
            0)
      << out_sharded;
  ASSERT_EQ(test::run_command(
                mpirun_prefix(2) + test::backprop_exe() +
                    full_args(data, tmp.path + "/w", "--shard-optimizer false --overlap-communication true") + " 2>&1",
                &out_whole),
            0)
      << out_whole;
  EXPECT_NE(out_sharded.find("ZeRO-1: AdamW's m and v are split over 2 ranks"), std::string::npos) << out_sharded;
  EXPECT_EQ(out_whole.find("ZeRO-1"), std::string::npos) << out_whole;
  const std::string z = only_run(tmp.path + "/z"), w = only_run(tmp.path + "/w");
  const auto lz = losses(z), lw = losses(w);
  ASSERT_EQ(lz.size(), 4u);
  for (size_t i = 0; i < lz.size(); ++i) EXPECT_EQ(lz[i], lw[i]) << "step " << i + 1;
  expect_same_bits(z, w, "model/model.safetensors");
  expect_same_bits(z, w, "checkpoints/checkpoint-4/trainable.safetensors");
  expect_same_bits(z, w, "checkpoints/checkpoint-4/optimizer.safetensors");
  // The plan: the same but for half the optimizer state, 2 × trainable × 4 bytes / 2 = the
  // trainable bytes (stories260K's count is even), which estimate-vram counts for the same model.
  const int64_t planned_z = summary(z)["planned_memory_bytes"], planned_w = summary(w)["planned_memory_bytes"];
  std::string est;
  ASSERT_EQ(
      test::run_command(
          test::backprop_exe() + " estimate-vram --json --mode full --model " + model_dir() + " 2>/dev/null", &est),
      0)
      << est;
  const int64_t trainable_bytes = nlohmann::json::parse(est.substr(est.find('{')))["plan"]["trainable"];
  EXPECT_EQ(planned_w - planned_z, trainable_bytes);
  // The traffic each step (rank 0's step records: the payload it sent, core/collective.h
  // CommTotals), for T trainable values (T even): unsharded, the all-reduce's all-to-all sends chunk
  // 1 (T/2 values) and its all-gather chunk 0 (T/2); sharded, the reduce-scatter sends chunk 1 and
  // the parameters' all-gather chunk 0. Either way 2·(N−1)/N of the gradient's bytes = T·4 at N = 2.
  const auto sz = records(z, "step"), sw = records(w, "step");
  ASSERT_EQ(sz.size(), 4u);
  ASSERT_EQ(sw.size(), 4u);
  for (size_t i = 0; i < sz.size(); ++i) {
    EXPECT_EQ(sz[i]["comm_gradient_bytes"].get<int64_t>(), trainable_bytes / 2) << "step " << i + 1;
    EXPECT_EQ(sz[i]["comm_parameter_bytes"].get<int64_t>(), trainable_bytes / 2) << "step " << i + 1;
    EXPECT_EQ(sw[i]["comm_gradient_bytes"].get<int64_t>(), trainable_bytes) << "step " << i + 1;
    EXPECT_EQ(sw[i]["comm_parameter_bytes"].get<int64_t>(), 0) << "step " << i + 1;
    EXPECT_EQ(sw[i]["comm_parameter_s"].get<double>(), 0.0) << "step " << i + 1;
    EXPECT_GT(sz[i]["comm_parameter_s"].get<double>(), 0.0) << "step " << i + 1;
    for (const auto* r : {&sz[i], &sw[i]}) {  // the small agreements (OOM, norms, stop) move a few bytes more
      const int64_t all = (*r)["comm_bytes"], grads = (*r)["comm_gradient_bytes"],
                    params = (*r)["comm_parameter_bytes"];
      EXPECT_GT(all, grads + params) << "step " << i + 1;
      EXPECT_LT(all, grads + params + 1024) << "step " << i + 1;
    }
  }
}

// A sharded run killed after step 2's checkpoint resumes at the same rank count to the same bits as
// the straight run, and at another rank count (3: other chunk borders, every rank re-slices the
// whole state it reads) within the f32 order of the gradient sums.
TEST(DistributedZero, ShardedRunResumesBitExactAtTheSameRankCountAndAtAnother) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(
                mpirun_prefix(2) + test::backprop_exe() + full_args(data, tmp.path + "/straight", "") + " 2>&1", &out),
            0)
      << out;
  const std::string straight = only_run(tmp.path + "/straight");
  for (const int then : {2, 3}) {
    SCOPED_TRACE("resumed at " + std::to_string(then) + " ranks");
    const std::string root = tmp.path + "/r" + std::to_string(then);
    EXPECT_NE(test::run_command(mpirun_prefix(2) + test::backprop_exe() +
                                    full_args(data, root, "--save-every 2 --fault-inject-crash-step 2") + " 2>&1",
                                &out),
              0)
        << out;
    const std::string run = only_run(root);
    ASSERT_TRUE(fs::exists(run + "/checkpoints/checkpoint-2")) << out;
    ASSERT_EQ(
        test::run_command(
            mpirun_prefix(then) + test::backprop_exe() + full_args(data, root, "--resume latest") + " 2>&1", &out),
        0)
        << out;
    EXPECT_NE(out.find("split over " + std::to_string(then) + " ranks"), std::string::npos) << out;
    const auto l = losses(run), ls = losses(straight);
    ASSERT_EQ(l.size(), 4u);
    if (then == 2) {
      for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(l[i], ls[i]) << "step " << i + 1;
      expect_same_bits(run, straight, "model/model.safetensors");
      expect_same_bits(run, straight, "checkpoints/checkpoint-4/optimizer.safetensors");
    } else {
      for (size_t i = 0; i < l.size(); ++i) EXPECT_LE(std::fabs(l[i] - ls[i]), 1e-5 * std::fabs(ls[i])) << i + 1;
    }
  }
}

// estimate-vram --nproc 2 plans one rank: half of AdamW's m and v (and the rank's share of the
// batch); --shard-optimizer false keeps the whole state on every rank.
TEST(DistributedZero, EstimateVramCountsOneRanksShare) {
  auto plan = [](const std::string& extra) {
    std::string out;
    EXPECT_EQ(test::run_command(test::backprop_exe() + " estimate-vram --json --model " + model_dir() +
                                    " --mode full --batch-size 4 --max-seq-length 64 " + extra + " 2>/dev/null",
                                &out),
              0)
        << out;
    return nlohmann::json::parse(out.substr(out.find('{')));
  };
  const auto one = plan(""), two = plan("--nproc 2"), unsharded = plan("--nproc 2 --shard-optimizer false");
  const size_t trainable = one["plan"]["trainable"];
  EXPECT_EQ(one["plan"]["optimizer_state"].get<size_t>(), 2 * trainable);
  EXPECT_EQ(two["plan"]["optimizer_state"].get<size_t>(), trainable);  // 2 × trainable / 2 ranks
  EXPECT_EQ(unsharded["plan"]["optimizer_state"].get<size_t>(), 2 * trainable);
  EXPECT_EQ(two["optimizer_shards"], 2);
  EXPECT_EQ(two["nproc"], 2);
  EXPECT_LT(two["plan"]["total"].get<size_t>(), one["plan"]["total"].get<size_t>());
}

}  // namespace bp
