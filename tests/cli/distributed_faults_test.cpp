// Data-parallel runs that lose a rank or are stopped (issue 40): the real backprop under real
// mpirun (plain, and through `train --nproc 2`) on the loopback. A rank killed with SIGKILL ends
// the others within 30 s with RUNTIME_DISTRIBUTED_RANK_LOST naming it, its host and the last
// checkpoint, which resumes; Ctrl-C on the launcher saves one checkpoint and every rank stops with
// exit code 130, and the run resumes from it.
//
// Where the run is when the signal comes is fixed, not timed: --fault-inject-hang-step N holds the
// rank(s) after step N and its checkpoint until a signal (an interrupt lets them go on; a kill ends
// them), so the test acts once checkpoint-N is on disk.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "distributed_test_util.h"
#include "support/fake_system_root.h"
#include "support/test_util.h"

namespace bp {

using namespace dist_test;  // NOLINT: the shared helpers of these tests

namespace {

// A shell command started in the background (its own process group), its output in a file.
struct Background {
  pid_t pid = -1;
  std::string log;
  Background(const std::string& cmd, const std::string& log_path) : log(log_path) {
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::execl("/bin/sh", "sh", "-c", (cmd + " > " + log_path + " 2>&1").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  // The exit code once it ends within `limit_s` (-1: still running, then it is killed).
  int wait(double limit_s, double* took_s = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        if (took_s) *took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~Background() {
    if (pid > 0) wait(0);
  }
  std::string output() const { return slurp(log); }
};

// The pid of rank `rank` of the run whose environment holds BP_TEST_MARKER=marker (mpirun passes its
// environment to the ranks it starts on this machine); -1 when there is none (yet).
pid_t rank_pid(const std::string& marker, int rank) {
  const std::string want_marker = "BP_TEST_MARKER=" + marker,
                    want_rank = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = slurp(e.path().string() + "/environ");
    bool has_marker = false, has_rank = false;
    for (size_t b = 0; b < env.size();) {
      size_t z = env.find('\0', b);
      if (z == std::string::npos) z = env.size();
      const std::string var = env.substr(b, z - b);
      has_marker = has_marker || var == want_marker;
      has_rank = has_rank || var == want_rank;
      b = z + 1;
    }
    if (has_marker && has_rank) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// rank_pid, waiting up to 10 s for the rank to exist.
pid_t wait_for_rank_pid(const std::string& marker, int rank) {
  pid_t pid = -1;
  for (int i = 0; i < 500 && pid < 0; ++i) {
    pid = rank_pid(marker, rank);
    if (pid < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pid;
}

// The run folder rank 0 makes under `root`, once its checkpoint-`step` is on disk; "" when the job
// ended before that or 120 s passed.
std::string run_with_checkpoint(const std::string& root, Background& job, int step) {
  for (int i = 0; i < 6000; ++i) {
    std::error_code ec;
    if (fs::is_directory(root, ec))
      for (const auto& e : fs::directory_iterator(root, ec))
        if (fs::exists(e.path() / "checkpoints" / ("checkpoint-" + std::to_string(step)), ec)) return e.path().string();
    int status = 0;
    if (::waitpid(job.pid, &status, WNOHANG) == job.pid) {
      job.pid = -1;
      return "";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The run with the given extra flags, --steps 4, a checkpoint every 2 steps.
std::string run_args(const std::string& data, const std::string& root, const std::string& extra) {
  return train_args(data, root, "--save-every 2 " + extra);
}

}  // namespace

// Rank 1 is held after step 3 (checkpoint-2 is on disk, step 4 needs it) and killed with SIGKILL.
// Rank 0, waiting for it in step 4's all-reduce, stops within 30 s with RUNTIME_DISTRIBUTED_RANK_LOST
// naming rank 1, its host and checkpoint-2; the launcher (train --nproc, or plain mpirun) ends
// too. Then the run resumes from checkpoint-2 at 2 ranks and finishes.
TEST(DistributedFaults, KilledRankStopsTheOthersWithTheCodeAndTheRunResumes) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  for (const bool nproc : {true, false}) {
    SCOPED_TRACE(nproc ? "the --nproc 2 launcher" : "mpirun -np 2");
    const std::string root = tmp.path + (nproc ? "/nproc" : "/mpirun");
    const std::string marker = root;
    const std::string hang = "--fault-inject-hang-step 3 --fault-inject-rank 1";
    const std::string cmd = "BP_TEST_MARKER=" + marker + " " + rank_env() +
                            (nproc ? test::backprop_exe() + run_args(data, root, hang + " --nproc 2")
                                   : mpirun_prefix(2) + test::backprop_exe() + run_args(data, root, hang));
    Background job(cmd, root + ".log");
    const std::string run = run_with_checkpoint(root, job, 2);
    ASSERT_FALSE(run.empty()) << job.output();
    const pid_t victim = wait_for_rank_pid(marker, 1);
    ASSERT_GT(victim, 0) << job.output();
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
    double took = 0;
    const int rc = job.wait(60, &took);
    const std::string out = job.output();
    ASSERT_NE(rc, -1) << "still running 60 s after rank 1 was killed\n" << out;
    EXPECT_LE(took, 30.0) << out;
    EXPECT_NE(rc, 0) << out;
    if (nproc) {
      EXPECT_EQ(rc, 2) << out;  // the code's exit status (runtime), from the launcher
    }
    EXPECT_NE(out.find("[RUNTIME_DISTRIBUTED_RANK_LOST]"), std::string::npos) << out;
    EXPECT_NE(out.find("rank 1 of 2"), std::string::npos) << out;
    EXPECT_NE(out.find("on host " + host_name()), std::string::npos) << out;
    EXPECT_NE(out.find("checkpoint-2 (step 2): continue from it with --resume latest"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(run + "/checkpoints/checkpoint-4")) << out;
    // The checkpoint on disk is whole: the run resumes from it (at 2 ranks) and finishes.
    std::string resumed;
    ASSERT_EQ(
        test::run_command(
            rank_env() + test::backprop_exe() + run_args(data, root, "--nproc 2 --resume latest") + " 2>&1", &resumed),
        0)
        << resumed;
    EXPECT_NE(resumed.find("checkpoint-2 at step 2 of 4"), std::string::npos) << resumed;
    EXPECT_EQ(summary(run)["steps"], 4);
    EXPECT_EQ(summary(run)["world_size"], 2);
  }
}

// Rank 0 itself killed (held after step 2's checkpoint): rank 1, waiting for it at step 3, stops
// with RUNTIME_DISTRIBUTED_RANK_LOST naming rank 0, and marks the run's status.json failed with the
// code, which rank 0 keeps but can no longer end (it said "running" before).
TEST(DistributedFaults, KilledRankZeroLeavesTheRunMarkedFailed) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  const std::string root = tmp.path + "/zero", marker = root;
  const std::string cmd = "BP_TEST_MARKER=" + marker + " " + mpirun_prefix(2) + test::backprop_exe() +
                          run_args(data, root, "--fault-inject-hang-step 2 --fault-inject-rank 0");
  Background job(cmd, root + ".log");
  const std::string run = run_with_checkpoint(root, job, 2);
  ASSERT_FALSE(run.empty()) << job.output();
  const pid_t victim = wait_for_rank_pid(marker, 0);
  ASSERT_GT(victim, 0) << job.output();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const int rc = job.wait(60);
  const std::string out = job.output();
  ASSERT_NE(rc, -1) << "still running 60 s after rank 0 was killed\n" << out;
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("rank 0 of 2"), std::string::npos) << out;
  std::ifstream st(run + "/status.json");
  const auto status = nlohmann::json::parse(st);
  EXPECT_EQ(status.value("status", ""), "failed") << status.dump();
  EXPECT_EQ(status.value("code", ""), "RUNTIME_DISTRIBUTED_RANK_LOST") << status.dump();
  EXPECT_NE(status.value("message", "").find("checkpoint-2"), std::string::npos) << status.dump();
}

// Ctrl-C on `train --nproc 2` (SIGINT to the launcher; a terminal sends it to the launcher's process
// group, mpirun has its own): both ranks, held after step 2, go on, agree to stop after step 3,
// rank 0 saves checkpoint-3 alone, and the launcher exits 130 as one process does. SIGUSR1 to a
// plain mpirun (which forwards it to the ranks) does the same. Both runs resume from checkpoint-3.
TEST(DistributedFaults, InterruptSavesOneCheckpointAndEveryRankStops) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  for (const bool nproc : {true, false}) {
    SCOPED_TRACE(nproc ? "Ctrl-C on the --nproc 2 launcher" : "SIGUSR1 on mpirun");
    const std::string root = tmp.path + (nproc ? "/nproc" : "/mpirun");
    const std::string hang = "--fault-inject-hang-step 2";
    // `exec env`: the background job's pid is the launcher's (backprop, or mpirun) itself.
    const std::string cmd =
        "exec env " + (nproc ? rank_env() + test::backprop_exe() + run_args(data, root, hang + " --nproc 2")
                             : mpirun_prefix(2) + test::backprop_exe() + run_args(data, root, hang));
    Background job(cmd, root + ".log");
    const std::string run = run_with_checkpoint(root, job, 2);
    ASSERT_FALSE(run.empty()) << job.output();
    ASSERT_EQ(::kill(job.pid, nproc ? SIGINT : SIGUSR1), 0);
    const int rc = job.wait(120);
    const std::string out = job.output();
    EXPECT_EQ(rc, 130) << out;
    EXPECT_NE(out.find("[RUNTIME_TRAINING_ABORTED]"), std::string::npos) << out;
    EXPECT_TRUE(fs::exists(run + "/checkpoints/checkpoint-3")) << out;  // saved once, by rank 0
    EXPECT_FALSE(fs::exists(run + "/checkpoints/checkpoint-4")) << out;
    const auto saved = records(run, "checkpoint");
    ASSERT_FALSE(saved.empty());
    EXPECT_EQ(saved.back()["step"], 3);
    std::ifstream st(run + "/status.json");
    EXPECT_EQ(nlohmann::json::parse(st).value("status", ""), "interrupted");
    std::string resumed;
    ASSERT_EQ(
        test::run_command(
            rank_env() + test::backprop_exe() + run_args(data, root, "--nproc 2 --resume latest") + " 2>&1", &resumed),
        0)
        << resumed;
    EXPECT_EQ(summary(run)["steps"], 4);
  }
}

// The safety monitor's pause or stop on one rank is every rank's: each rank reads its own GPU (the
// fake NVML, scripted per rank through BP_FAKE_NVML_SCRIPT: rank 0 always 50 C), and the worst
// level is agreed at each step boundary. Rank 1 at 92 C before step 3 pauses both ranks until it
// reads 70 C, and the run ends with the bits of one never paused; rank 1 at 97 C stops both, rank 0
// saving step 2's checkpoint, with the code.
TEST(DistributedFaults, SafetyMonitorOnOneRankPausesOrStopsEveryRank) {
  SKIP_WITHOUT_MPIRUN();
  test::TempDir tmp;
  const std::string data = write_data(tmp.path);
  fs::create_directories(tmp.path + "/root");  // no CPU sensors: the scripted GPU is all there is
  auto script = [&](const std::string& name, const std::string& text) {
    test::write_text_file(tmp.path + "/" + name, text);
    return tmp.path + "/" + name;
  };
  const std::string cool = script("cool", "temps 50");
  // Readings on rank 1: 1 at the start, then one per step boundary and one per micro-batch (its
  // share is one micro-batch): the 6th is step 3's boundary.
  const std::string hot = script("hot", "temps 50 50 50 50 50 92 92 85 70");
  const std::string burning = script("burning", "temps 50 50 50 50 50 97");
  const std::string monitor = "BACKPROPAGATE_MONITOR__NVML_LIBRARY=" + std::string(BP_FAKE_NVML) +
                              " BACKPROPAGATE_MONITOR__POLL_PERIOD_S=0 BACKPROPAGATE_MONITOR__COOLDOWN_S=0"
                              " BACKPROPAGATE_MONITOR__SYSTEM_ROOT=" +
                              tmp.path + "/root ";
  // MPMD: each rank its own script (an environment variable, not a setting the ranks compare).
  auto launch = [&](const std::string& root, const std::string& rank1_script, std::string* out) {
    return test::run_command(monitor + mpirun_prefix(1, "-x BP_FAKE_NVML_SCRIPT=" + cool) + test::backprop_exe() +
                                 train_args(data, root) + " : -np 1 -x BP_FAKE_NVML_SCRIPT=" + rank1_script + " " +
                                 test::backprop_exe() + train_args(data, root) + " 2>&1",
                             out);
  };
  std::string out;
  ASSERT_EQ(launch(tmp.path + "/plain", cool, &out), 0) << out;
  ASSERT_EQ(launch(tmp.path + "/paused", hot, &out), 0) << out;
  const std::string plain = only_run(tmp.path + "/plain"), paused = only_run(tmp.path + "/paused");
  const auto mon = records(paused, "monitor");  // rank 0's records: it was never hot itself
  const nlohmann::json *pause = nullptr, *resume = nullptr;
  for (const auto& r : mon) {
    if (r["event"] == "pause") pause = &r;
    if (r["event"] == "resume") resume = &r;
  }
  ASSERT_TRUE(pause && resume) << out;
  EXPECT_EQ((*pause)["step"], 3);
  EXPECT_EQ((*pause)["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ((*pause)["code"], "RUNTIME_GPU_TEMPERATURE_CRITICAL");
  EXPECT_EQ((*resume)["rounds"], 3);  // rank 1 read 92, 85, 70
  EXPECT_TRUE(records(plain, "monitor").empty() ||
              std::none_of(records(plain, "monitor").begin(), records(plain, "monitor").end(),
                           [](const nlohmann::json& r) { return r["event"] == "pause"; }));
  const auto lp = losses(plain), lq = losses(paused);
  ASSERT_EQ(lp.size(), 4u);
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_EQ(lq[i], lp[i]) << "step " << i + 1;
  EXPECT_TRUE(slurp(paused + "/adapter/adapter_model.safetensors") ==
              slurp(plain + "/adapter/adapter_model.safetensors"));

  EXPECT_NE(launch(tmp.path + "/stopped", burning, &out), 0) << out;
  const std::string stopped = only_run(tmp.path + "/stopped");
  EXPECT_NE(out.find("RUNTIME_TEMPERATURE_EMERGENCY"), std::string::npos) << out;
  EXPECT_NE(out.find("emergency temperature on rank 1 before step 3"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(stopped + "/checkpoints/checkpoint-2")) << out;
  EXPECT_FALSE(fs::exists(stopped + "/checkpoints/checkpoint-3")) << out;
  std::ifstream st(stopped + "/status.json");
  EXPECT_EQ(nlohmann::json::parse(st).value("status", ""), "failed");
}

}  // namespace bp
