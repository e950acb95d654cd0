// Data-parallel training as a user runs it (issue 40; train/trainer_distributed.cpp): the real
// backprop under real `mpirun --allow-run-as-root --oversubscribe -np 2` over the loopback, one
// thread per rank, on the real stories260K model. Against one process on the same global batch:
// the same losses and adapter; two 2-rank runs: the same bits; ranks that disagree: refused; an
// OOM or a NaN on one rank: decided for all. Only an absent mpirun skips them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/collective.h"
#include "distributed_test_util.h"
#include "io/safetensors.h"
#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

using namespace dist_test;  // NOLINT: the shared helpers of these tests

namespace {

// Per step, |a - b| <= 1e-5 |b| (the two sum the same terms in another f32 order).
void expect_losses_close(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::fabs(a[i] - b[i]), 1e-5 * std::fabs(b[i])) << "step " << i + 1;
}

// The adapters' tensors: ||a - b|| <= 2.5e-4 · steps · ||b|| per tensor (1e-3 for these 4 steps).
// The ranks' gradients differ from one process's only by the order of their f32 additions (about
// 2^-24 relative per addition). AdamW divides each step by the gradient's own running scale, so a
// coordinate whose gradient is near rounding level can move by a noticeable part of lr either way,
// and that grows with the steps (CONVENTIONS.md: trajectories). Measured here: a 2-rank run whose
// shares are the single process's micro-batches, 0 (the same bits); one process with micro-batches
// of 1 instead of 2, 7.5e-5; the OOM run below (micro-batches of 1 from step 2), 1.25e-4, in
// layer 1's q_proj lora_A. lora_B starts at zero, so its norm is what training moved.
void expect_adapters_close(const std::string& a_run, const std::string& b_run) {
  auto a = SafetensorsReader::open_file(a_run + "/adapter/adapter_model.safetensors");
  auto b = SafetensorsReader::open_file(b_run + "/adapter/adapter_model.safetensors");
  ASSERT_EQ(a.names(), b.names());
  ASSERT_FALSE(a.names().empty());
  for (const auto& name : a.names()) {
    const std::vector<float> x = a.read(name).to_vector(), y = b.read(name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      norm += double(y[i]) * y[i];
    }
    EXPECT_LE(std::sqrt(diff), 2.5e-4 * 4 * std::sqrt(norm)) << name;
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(norm, 0.0) << name << " never trained";
    }
  }
}

}  // namespace

// 2 ranks x 2 sequences = 1 process x 4 sequences: losses, gradient norms and the adapter agree;
// summary.json says world_size; rank 0 alone wrote (one run folder under --output).
TEST(Distributed, TwoRanksMatchOneProcessOnTheSameGlobalBatch) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/one") + " 2>&1", &out), 0) << out;
  ASSERT_EQ(
      test::run_command(mpirun_prefix(2) + test::backprop_exe() + train_args(data, tmp.path + "/two") + " 2>&1", &out),
      0)
      << out;
  const std::string one = only_run(tmp.path + "/one"), two = only_run(tmp.path + "/two");
  EXPECT_EQ(summary(one)["world_size"], 1);
  EXPECT_EQ(summary(two)["world_size"], 2);
  EXPECT_EQ(summary(two)["steps"], 4);
  EXPECT_EQ(summary(two)["tokens"], summary(one)["tokens"]);  // the same sequences, all of them
  const auto l1 = losses(one), l2 = losses(two);
  ASSERT_EQ(l1.size(), 4u);
  expect_losses_close(l2, l1);
  const auto s1 = records(one, "step"), s2 = records(two, "step");
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_EQ(s2[i]["samples"], s1[i]["samples"]);  // the same global batch each step
    EXPECT_LE(std::fabs(s2[i]["grad_norm"].get<double>() - s1[i]["grad_norm"].get<double>()),
              1e-5 * s1[i]["grad_norm"].get<double>());
  }
  EXPECT_GT(std::fabs(l1.front() - l1.back()), 1e-3);  // it trained: the comparison is not of constants
  expect_adapters_close(two, one);
  // The time in collectives per step (core/collective.h CommTotals): in every step record of the
  // ranks' run, positive and below the step's own time, the gradients' reduction and ZeRO-1's
  // parameter all-gather (on by default) parts of it; their sums in summary.json. One process has
  // no collectives: no such fields, and 0 in its summary.
  double comm_sum = 0;
  int64_t bytes_sum = 0;
  for (const auto& r : s2) {
    const double comm = r["comm_s"], grads = r["comm_gradient_s"], params = r["comm_parameter_s"];
    EXPECT_GT(grads, 0.0) << r.dump();
    EXPECT_GT(params, 0.0) << r.dump();
    EXPECT_LE(grads + params, comm) << r.dump();
    EXPECT_LT(comm, r["step_s"].get<double>()) << r.dump();
    EXPECT_GT(r["comm_bytes"].get<int64_t>(), 0) << r.dump();
    comm_sum += comm;
    bytes_sum += r["comm_bytes"].get<int64_t>();
  }
  EXPECT_NEAR(summary(two)["comm_seconds"].get<double>(), comm_sum, 1e-9 + 1e-9 * comm_sum);
  EXPECT_EQ(summary(two)["comm_bytes"].get<int64_t>(), bytes_sum);
  for (const auto& r : s1) EXPECT_FALSE(r.contains("comm_s")) << r.dump();
  EXPECT_EQ(summary(one)["comm_seconds"], 0.0);
  EXPECT_EQ(summary(one)["comm_bytes"], 0);
  EXPECT_NE(out.find("data-parallel over 2 ranks"), std::string::npos) << out;
  // show-run says how many processes trained (text and --json); a single process says nothing.
  std::string shown;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + two + " 2>&1", &shown), 0) << shown;
  EXPECT_NE(shown.find("processes  2 (data-parallel)"), std::string::npos) << shown;
  std::string single;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + one + " 2>&1", &single), 0) << single;
  EXPECT_EQ(single.find("processes"), std::string::npos) << single;
  std::string js;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + two + " --json 2>/dev/null", &js), 0) << js;
  EXPECT_EQ(nlohmann::json::parse(js.substr(js.find('{')))["world_size"], 2) << js;
}

// Full fine-tuning: every weight's gradient is summed over the ranks. The losses agree, and each
// weight ends as one process's within 2.5e-4 · steps of how far training moved it from the base
// (measured: 8.3e-6, in layer 0's input_layernorm).
TEST(Distributed, TwoRanksMatchOneProcessInFullFineTuning) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  const std::string full = "--mode full";
  ASSERT_EQ(test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/one", full, "1e-3") + " 2>&1", &out),
            0)
      << out;
  ASSERT_EQ(
      test::run_command(
          mpirun_prefix(2) + test::backprop_exe() + train_args(data, tmp.path + "/two", full, "1e-3") + " 2>&1", &out),
      0)
      << out;
  const std::string one = only_run(tmp.path + "/one"), two = only_run(tmp.path + "/two");
  EXPECT_EQ(summary(two)["world_size"], 2);
  expect_losses_close(losses(two), losses(one));
  auto base = SafetensorsReader::open_model(model_dir());
  auto a = SafetensorsReader::open_model(two + "/model"), b = SafetensorsReader::open_model(one + "/model");
  ASSERT_EQ(a.names(), b.names());
  for (const auto& name : b.names()) {
    const std::vector<float> x = a.read(name).to_vector(), y = b.read(name).to_vector(),
                             w0 = base.read(name).to_vector();
    ASSERT_EQ(x.size(), y.size()) << name;
    double diff = 0, moved = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      moved += (double(y[i]) - w0[i]) * (double(y[i]) - w0[i]);
    }
    EXPECT_GT(moved, 0.0) << name << " never trained";
    EXPECT_LE(std::sqrt(diff), 2.5e-4 * 4 * std::sqrt(moved)) << name;
  }
}

// Preference data for the methods' runs below: DPO pairs (prompt, chosen happy, rejected sad) or
// KTO rows (one completion, labelled).
std::string write_preference_data(const std::string& dir, bool kto) {
  const std::string p = dir + (kto ? "/kto.jsonl" : "/pairs.jsonl");
  std::ofstream f(p);
  const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
  for (int i = 0; i < 16; ++i) {
    const std::string prompt = std::string(who[i % 5]) + " saw a bird number " + std::to_string(i % 7) + ".";
    const std::string good = std::string(who[i % 5]) + " was happy.", bad = std::string(who[i % 5]) + " was sad.";
    if (kto)
      f << nlohmann::json{{"prompt", prompt}, {"completion", i % 2 ? bad : good}, {"label", i % 2 == 0}}.dump() << "\n";
    else
      f << nlohmann::json{{"prompt", prompt}, {"chosen", good}, {"rejected", bad}}.dump() << "\n";
  }
  return p;
}

// DPO (its reference precomputed before step 1: each rank computes half the table, the ranks
// all-gather it) and KTO (the reference with the adapter off, per micro-batch; its reference point
// z a mean over the whole step's KL sequences, each rank running its share's and the ranks
// all-gathering them) at 2 ranks x 2 examples = 1 process x 4: a pair's two sequences stay on one
// rank, and the losses, the step's TRL metrics and the adapter agree.
TEST(Distributed, PreferenceMethodsAtTwoRanksMatchOneProcess) {
  SKIP_WITHOUT_MPIRUN();
  for (const char* method : {"dpo", "kto"}) {
    SCOPED_TRACE(method);
    test::TempDir tmp;
    const bool kto = std::string(method) == "kto";
    const std::string data = write_preference_data(tmp.path, kto);
    const std::string extra =
        std::string("--method ") + method + (kto ? " --reference adapter-off" : " --reference precomputed");
    std::string out;
    ASSERT_EQ(
        test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/one", extra, "2e-2") + " 2>&1", &out), 0)
        << out;
    ASSERT_EQ(test::run_command(mpirun_prefix(2) + test::backprop_exe() +
                                    train_args(data, tmp.path + "/two", extra, "2e-2") + " 2>&1",
                                &out),
              0)
        << out;
    const std::string one = only_run(tmp.path + "/one"), two = only_run(tmp.path + "/two");
    EXPECT_EQ(summary(two)["world_size"], 2);
    EXPECT_EQ(summary(two)["method"], method);
    const auto l1 = losses(one), l2 = losses(two);
    ASSERT_EQ(l1.size(), 4u);
    expect_losses_close(l2, l1);
    EXPECT_GT(std::fabs(l1.front() - l1.back()), 1e-3);  // it trained
    const auto s1 = records(one, "step"), s2 = records(two, "step");
    for (size_t i = 0; i < s1.size(); ++i) {
      EXPECT_EQ(s2[i]["samples"], s1[i]["samples"]);
      // The metrics are the whole step's (merged over the ranks), not rank 0's half.
      ASSERT_TRUE(s2[i].contains("rewards/accuracies")) << s2[i].dump();
      for (const char* k : {"rewards/chosen", "rewards/accuracies", "logps/chosen"}) {
        ASSERT_EQ(s2[i].contains(k), s1[i].contains(k)) << k << " " << s2[i].dump();
        if (!s1[i].contains(k)) continue;  // KTO: a step without a desirable example has no chosen reward
        EXPECT_NEAR(s2[i][k].get<double>(), s1[i][k].get<double>(), 1e-5 * (1 + std::fabs(s1[i][k].get<double>())))
            << k << " step " << i + 1;
      }
    }
    expect_adapters_close(two, one);
    if (!kto) {  // the table rank 0 checkpointed is the single process's (both halves)
      auto a = SafetensorsReader::open_file(two + "/checkpoints/checkpoint-4/reference_logps.safetensors");
      auto b = SafetensorsReader::open_file(one + "/checkpoints/checkpoint-4/reference_logps.safetensors");
      const std::vector<float> x = a.read("train.chosen").to_vector(), y = b.read("train.chosen").to_vector();
      ASSERT_EQ(x.size(), 16u);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-5 * std::fabs(y[i])) << i;
    }
  }
}

// Two 2-rank runs, one under mpirun and one through `train --nproc 2`, give the same bits; the second
// reduces each layer's gradients under the backward (--overlap-communication true, ZeRO-1's
// reduce-scatter in the layout of the whole one: train/grad_overlap.h), so overlap on and off give
// the same bits too. Its step records' profile shows the reductions running while layers below
// still compute (each layer's backward made 20 ms longer, so a busy 2-core machine still runs the
// communication thread during it).
TEST(Distributed, TwoRunsAtTwoRanksAreBitIdentical) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(
      test::run_command(mpirun_prefix(2) + test::backprop_exe() + train_args(data, tmp.path + "/a") + " 2>&1", &out), 0)
      << out;
  ASSERT_EQ(
      test::run_command(rank_env() + test::backprop_exe() +
                            train_args(data, tmp.path + "/b",
                                       "--nproc 2 --overlap-communication true --fault-inject-layer-delay-ms 20") +
                            " 2>&1",
                        &out),
      0)
      << out;
  EXPECT_NE(out.find("overlap: each layer's gradients are reduced"), std::string::npos) << out;
  const std::string a = only_run(tmp.path + "/a"), b = only_run(tmp.path + "/b");
  EXPECT_EQ(summary(b)["world_size"], 2);
  const auto la = losses(a), lb = losses(b);
  ASSERT_EQ(la.size(), 4u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;  // bit for bit
  const std::string wa = slurp(a + "/adapter/adapter_model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == slurp(b + "/adapter/adapter_model.safetensors"));
  const std::string ca = slurp(a + "/checkpoints/checkpoint-4/trainable.safetensors");
  ASSERT_FALSE(ca.empty());
  EXPECT_TRUE(ca == slurp(b + "/checkpoints/checkpoint-4/trainable.safetensors"));
  for (const auto& r : records(b, "step")) {
    const auto& bw = r["overlap_profile"]["backward"];
    const auto& red = r["overlap_profile"]["reductions"];
    ASSERT_EQ(bw.size(), 5u) << r.dump();  // stories260K's 5 layers, top first
    EXPECT_EQ(bw[0][0], 4);
    EXPECT_EQ(bw[4][0], 0);
    ASSERT_EQ(red.size(), 5u) << r.dump();  // a layer's LoRA tensors each (nothing outside the layers)
    EXPECT_EQ(red[0][0], 4);                // the top layer's gradients first
    // Layer 4's reduction began before layer 0's backward ended, and they overlapped.
    EXPECT_LT(red[0][1].get<double>(), bw[4][2].get<double>()) << r.dump();
    EXPECT_GT(r["comm_overlap_s"].get<double>(), 0.0) << r.dump();
    EXPECT_GE(r["comm_wait_s"].get<double>(), 0.0) << r.dump();
  }
  for (const auto& r : records(a, "step")) EXPECT_FALSE(r.contains("overlap_profile")) << r.dump();
}

// A run saved at one rank count continues at another: 1 -> 2 and 2 -> 1 ranks, each killed after
// step 2's checkpoint and resumed, end as the straight single-process run (the checkpoint holds no
// per-rank state: the data cursor and the optimizer are global).
TEST(Distributed, ResumeAtAnotherRankCount) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/straight") + " 2>&1", &out), 0)
      << out;
  const std::string straight = only_run(tmp.path + "/straight");
  const std::string crash = "--save-every 2 --fault-inject-crash-step 2";
  for (const auto& [first, then] : {std::pair<int, int>{1, 2}, std::pair<int, int>{2, 1}}) {
    const std::string root = tmp.path + "/r" + std::to_string(first) + std::to_string(then);
    auto launch = [&](int np) { return np == 1 ? test::backprop_exe() : mpirun_prefix(np) + test::backprop_exe(); };
    EXPECT_NE(test::run_command(launch(first) + train_args(data, root, crash) + " 2>&1", &out), 0) << out;
    const std::string run = only_run(root);
    ASSERT_TRUE(fs::exists(run + "/checkpoints/checkpoint-2")) << out;
    ASSERT_EQ(test::run_command(launch(then) + train_args(data, root, "--resume latest") + " 2>&1", &out), 0) << out;
    EXPECT_EQ(summary(run)["world_size"], then);
    EXPECT_EQ(summary(run)["steps"], 4);
    expect_losses_close(losses(run), losses(straight));
    expect_adapters_close(run, straight);
  }
}

// Ranks started with different settings, or reading different data, are refused before training.
TEST(Distributed, RanksThatDisagreeAreRefused) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path), other = write_data(tmp.path, "other.jsonl", 5);
  std::string out;
  // MPMD: rank 0 and rank 1 run different command lines.
  int rc = test::run_command(mpirun_prefix(1) + test::backprop_exe() + train_args(data, tmp.path + "/s") + " : -np 1 " +
                                 test::backprop_exe() + train_args(data, tmp.path + "/s", "", "4e-3") + " 2>&1",
                             &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("CONFIG_DISTRIBUTED_MISMATCH"), std::string::npos) << out;
  EXPECT_NE(out.find("settings (rank 1 differs from rank 0)"), std::string::npos) << out;
  EXPECT_EQ(out.find("training data ("), std::string::npos) << out;
  rc = test::run_command(mpirun_prefix(1) + test::backprop_exe() + train_args(data, tmp.path + "/d") + " : -np 1 " +
                             test::backprop_exe() + train_args(other, tmp.path + "/d") + " 2>&1",
                         &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("CONFIG_DISTRIBUTED_MISMATCH"), std::string::npos) << out;
  EXPECT_NE(out.find("training data (rank 1 differs from rank 0)"), std::string::npos) << out;
  EXPECT_EQ(out.find("settings ("), std::string::npos) << out;  // the data path differs, its content is what counts
}

// Two OOMs in a row on rank 1 alone (the first turns gradient checkpointing on, the second halves its
// micro-batch): every rank redoes the step that way (the same samples), and the run ends as the one
// without the OOM (within the f32 order of the sums). The run overlaps the reduction with the
// backward, and the OOM strikes inside that round (train/grad_overlap.h abandon).
TEST(Distributed, OutOfMemoryOnOneRankIsRedoneByEveryRank) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/one") + " 2>&1", &out), 0) << out;
  ASSERT_EQ(
      test::run_command(mpirun_prefix(2) + test::backprop_exe() +
                            train_args(data, tmp.path + "/oom",
                                       "--fault-inject-oom-step 2 --fault-inject-oom-count 2 --fault-inject-rank 1 "
                                       "--overlap-communication true") +
                            " 2>&1",
                        &out),
      0)
      << out;
  const std::string one = only_run(tmp.path + "/one"), oom = only_run(tmp.path + "/oom");
  const auto agreed = records(oom, "oom_recovery_agreed");
  ASSERT_EQ(agreed.size(), 1u) << out;
  EXPECT_EQ(agreed[0]["step"], 2);
  EXPECT_EQ(agreed[0]["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(agreed[0]["micro_batch_after"], 1);
  EXPECT_EQ(agreed[0]["gradient_checkpointing"], true);
  EXPECT_TRUE(records(oom, "oom_recovery").empty());  // rank 0 did not run out itself
  EXPECT_EQ(summary(oom)["oom_recoveries"], 1);
  EXPECT_EQ(summary(oom)["micro_batch_size"], 1);  // kept for the rest of the run, on every rank
  EXPECT_EQ(summary(oom)["gradient_checkpointing"], true);
  // With the overlap on, rank 1's OOM came in its last (only) micro-batch, inside the round: it
  // still ran the round's reductions (layer by layer, as rank 0 did) before both redid the step.
  for (const auto& r : records(oom, "step")) EXPECT_TRUE(r.contains("overlap_profile")) << r.dump();
  expect_losses_close(losses(oom), losses(one));
  expect_adapters_close(oom, one);
}

// A NaN gradient on rank 1 alone skips the step on every rank (rank 0 records it though its own
// gradients were finite); the run goes on together.
TEST(Distributed, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(
                mpirun_prefix(2) + test::backprop_exe() +
                    train_args(data, tmp.path + "/nan", "--fault-inject-nan-step 2 --fault-inject-rank 1") + " 2>&1",
                &out),
            0)
      << out;
  const std::string run = only_run(tmp.path + "/nan");
  const auto nonfinite = records(run, "nonfinite");
  ASSERT_EQ(nonfinite.size(), 1u) << out;
  EXPECT_EQ(nonfinite[0]["step"], 2);
  const auto l = losses(run);
  ASSERT_EQ(l.size(), 4u);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(summary(run)["skipped_steps"], 1);
}

// The plugin named by training.mpi_library is missing: every rank stops with the catalog code.
TEST(Distributed, MissingPluginUnderMpirunIsACatalogError) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  const int rc = test::run_command(
      mpirun_prefix(2, "-x BACKPROPAGATE_TRAINING__MPI_LIBRARY=/nonexistent/libbp_collective_mpi.so") +
          test::backprop_exe() + train_args(data, tmp.path + "/x") + " 2>&1",
      &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("DEP_DISTRIBUTED_UNAVAILABLE"), std::string::npos) << out;
  EXPECT_NE(out.find("/nonexistent/libbp_collective_mpi.so"), std::string::npos) << out;
}

TEST(Distributed, NprocZeroIsRefused) {
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  const int rc =
      test::run_command(test::backprop_exe() + train_args(data, tmp.path + "/z", "--nproc 0") + " 2>&1", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_NE(out.find("nproc"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(tmp.path + "/z"));
}

// A global batch smaller than the rank count leaves a rank without work: refused, naming both.
TEST(Distributed, BatchSmallerThanTheRanksIsRefused) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  std::string out;
  const int rc = test::run_command(
      mpirun_prefix(2) + test::backprop_exe() + train_args(data, tmp.path + "/b", "", "5e-3", "1") + " 2>&1", &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("CONFIG_DISTRIBUTED_MISMATCH"), std::string::npos) << out;
  EXPECT_NE(out.find("--batch-size 1 is smaller than the 2 ranks"), std::string::npos) << out;
}

// Rank 0 alone shows the run's info on the console; with --log-file every rank keeps its whole log
// (rank 1's in FILE.rank1), under the run id rank 0 made.
TEST(Distributed, EveryRankWritesItsOwnLogFile) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path), log = tmp.path + "/log.jsonl";
  std::string out;
  ASSERT_EQ(test::run_command(mpirun_prefix(2) + test::backprop_exe() +
                                  train_args(data, tmp.path + "/run", "--log-file " + log) + " 2>&1",
                              &out),
            0)
      << out;
  size_t shown = 0;
  for (size_t at = out.find("data-parallel over 2 ranks"); at != std::string::npos;
       at = out.find("data-parallel over 2 ranks", at + 1))
    ++shown;
  EXPECT_EQ(shown, 1u) << out;
  const std::string run_id = fs::path(only_run(tmp.path + "/run")).filename().string();
  for (const std::string& file : {log, log + ".rank1"}) {
    std::ifstream in(file);
    ASSERT_TRUE(in.good()) << file;
    bool said = false;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("msg", "").find("data-parallel over 2 ranks") != std::string::npos) {
        said = true;
        EXPECT_EQ(j.value("run_id", ""), run_id) << file;
      }
    }
    EXPECT_TRUE(said) << file;
  }
  EXPECT_FALSE(fs::exists(log + ".rank0"));
}

// `backprop info` says whether MPI and NCCL are there.
TEST(Distributed, InfoSaysWhetherMpiIsAvailable) {
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " info --json 2>/dev/null", &out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  bool found = false;
  for (const auto& f : j["features"])
    if (f["name"] == "mpi") {
      found = true;
      if (!find_mpirun().empty()) {  // CI installs Open MPI: then the plugin is built and loads
        EXPECT_TRUE(f["available"].get<bool>()) << f.dump();
        EXPECT_NE(f["detail"].get<std::string>().find("libbp_collective_mpi.so"), std::string::npos) << f.dump();
      }
    }
  EXPECT_TRUE(found) << out;
  // And whether NCCL loads (core/nccl.h: at run time, never linked): its version, or why not.
  bool nccl = false;
  for (const auto& f : j["features"])
    if (f["name"] == "nccl") {
      nccl = true;
      const std::string detail = f["detail"].get<std::string>();
      EXPECT_NE(detail.find(f["available"].get<bool>() ? "NCCL 2." : "cannot be loaded"), std::string::npos) << detail;
    }
  EXPECT_TRUE(nccl) << out;
}

}  // namespace bp
