// The safety monitor in real training runs of models/tiny-chat (issue 20). Readings are scripted:
// GPU temperatures by the fake NVML (tests/train/fake_nvml.c, one reading per micro-batch boundary
// with monitor.poll_period_s = 0), memory by a fake sysfs/procfs root that the test rewrites
// between steps. Nothing depends on timing.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/allocator.h"
#include "core/settings.h"
#include "io/atomic_file.h"
#include "support/fake_system_root.h"
#include "support/test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

TrainOptions tiny_chat_options(const std::string& dir) {
  TrainOptions o;
  o.model_dir = test::source_dir() + "/models/tiny-chat";
  o.device = "cpu";  // compared with CPU/torch references: on a machine with a GPU too (tests/cuda train there)
  o.data_path = test::source_dir() + "/examples/quickstart_sharegpt.jsonl";
  o.output_dir = dir + "/run";
  o.steps = 6;
  o.batch_size = 4;
  o.micro_batch_size = 2;
  o.lr = 1e-3;
  o.warmup_steps = 0;
  o.lr_scheduler = LrScheduler::Constant;
  o.max_seq_length = 64;
  o.holdout = 0;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.dropout = 0.05f;  // seeded per step and sample: a pause must not change it
  o.lora.target_modules = {"all-linear"};
  o.threads = 1;
  o.quiet = true;
  return o;
}

// Monitor on, synchronous readings, GPU from the fake NVML with `script`, an empty fake root (no
// CPU sensors, no memory readings) unless the test fills it.
TrainOptions monitored(TrainOptions o, const std::string& dir, const std::string& script) {
  test::write_text_file(dir + "/nvml_script", script);
  setenv("BP_FAKE_NVML_SCRIPT", (dir + "/nvml_script").c_str(), 1);
  setenv("BP_FAKE_NVML_READS", (dir + "/nvml_reads").c_str(), 1);
  fs::create_directories(dir + "/root");
  o.monitor.enabled = true;
  o.monitor.poll_period_s = 0;
  o.monitor.cooldown_s = 0;
  o.monitor.system_root = dir + "/root";
  o.monitor.nvml_library = BP_FAKE_NVML;
  return o;
}

std::vector<nlohmann::json> monitor_records(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "monitor") out.push_back(j);
  }
  return out;
}

const nlohmann::json* find_event(const std::vector<nlohmann::json>& records, const std::string& event) {
  for (const auto& r : records)
    if (r.at("event") == event) return &r;
  return nullptr;
}

std::string adapter_bytes(const std::string& run_dir) {
  return read_file(run_dir + "/adapter/adapter_model.safetensors");
}

}  // namespace

// A rising temperature pauses the run between two micro-batches of step 3; falling lets it go on.
// The final adapter is byte-identical to an unmonitored run's.
TEST(MonitorRun, PauseAndResumeLeaveTheAdapterByteIdentical) {
  test::TempDir a_dir, b_dir;
  Trainer(tiny_chat_options(a_dir.path)).run();

  // Readings: 1 at the start, then one per micro-batch (2 per step): the 6th is step 3's second
  // micro-batch. 92 C pauses; while paused 92, 85 (warm), 70 (cool: resume).
  TrainOptions b = monitored(tiny_chat_options(b_dir.path), b_dir.path, "temps 50 50 50 50 50 92 92 85 70");
  TrainSummary sb = Trainer(b).run();
  EXPECT_EQ(sb.steps_done, 6);

  auto records = monitor_records(b.output_dir);
  const nlohmann::json* pause = find_event(records, "pause");
  const nlohmann::json* resume = find_event(records, "resume");
  ASSERT_TRUE(pause && resume);
  EXPECT_EQ(pause->at("step"), 3) << "paused mid-epoch, between two micro-batches of step 3";
  EXPECT_EQ(pause->at("code"), "RUNTIME_GPU_TEMPERATURE_CRITICAL");
  EXPECT_EQ(pause->at("run_id"), sb.run_id);
  EXPECT_EQ(resume->at("readings"), 3);
  EXPECT_EQ(read_file(b_dir.path + "/nvml_reads"), "16\n") << "1 + 12 micro-batch boundaries + 3 while paused";
  EXPECT_EQ(adapter_bytes(b.output_dir), adapter_bytes(tiny_chat_options(a_dir.path).output_dir));
}

// Emergency in the middle of step 4: the last finished step (3) is saved, the run stops with the
// code, and resuming from that checkpoint ends byte-identical to an uninterrupted run.
TEST(MonitorRun, EmergencySavesALoadableCheckpointAndStops) {
  test::TempDir a_dir, b_dir;
  Trainer(tiny_chat_options(a_dir.path)).run();

  TrainOptions b = monitored(tiny_chat_options(b_dir.path), b_dir.path, "temps 50 50 50 50 50 50 50 50 97");
  try {
    Trainer(b).run();
    FAIL() << "the emergency must stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY) << e.what();
  }
  const std::string ckpt = b.output_dir + "/checkpoints/checkpoint-3";
  ASSERT_TRUE(fs::exists(ckpt));
  EXPECT_EQ(CheckpointStore::verify(ckpt).at("step"), 3);
  auto records = monitor_records(b.output_dir);
  const nlohmann::json* stop = find_event(records, "stop");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->at("code"), "RUNTIME_TEMPERATURE_EMERGENCY");
  EXPECT_EQ(stop->at("step"), 4);

  TrainOptions c = tiny_chat_options(b_dir.path);
  c.resume = ckpt;
  TrainSummary sc = Trainer(c).run();
  EXPECT_EQ(sc.steps_done, 6);
  EXPECT_EQ(adapter_bytes(c.output_dir), adapter_bytes(tiny_chat_options(a_dir.path).output_dir));
}

// NVML present but broken (nvmlInit fails), set up through the settings: one warning with
// RUNTIME_GPU_MONITORING_FAILED, and training finishes.
TEST(MonitorRun, BrokenNvmlWarnsAndTrainingGoesOn) {
  test::TempDir tmp;
  test::write_text_file(tmp.path + "/nvml_script", "init_fail");
  setenv("BP_FAKE_NVML_SCRIPT", (tmp.path + "/nvml_script").c_str(), 1);
  fs::create_directories(tmp.path + "/root");
  Settings s;
  s.set("model.path", test::source_dir() + "/models/tiny-chat");
  s.set("model.device", "cpu");
  s.set("data.path", test::source_dir() + "/examples/quickstart_sharegpt.jsonl");
  s.set("data.holdout", "0");
  s.set("training.steps", "2");
  s.set("training.batch_size", "2");
  s.set("training.max_seq_length", "64");
  s.set("lora.r", "4");
  s.set("training.threads", "1");
  s.set("monitor.poll_period_s", "0");
  s.set("monitor.system_root", tmp.path + "/root");
  s.set("monitor.nvml_library", BP_FAKE_NVML);
  TrainOptions o = TrainOptions::from_settings(s);
  o.output_dir = tmp.path + "/run";
  o.quiet = true;
  TrainSummary sum = Trainer(o).run();
  EXPECT_EQ(sum.steps_done, 2);
  auto records = monitor_records(o.output_dir);
  const nlohmann::json* failed = find_event(records, "gpu_monitoring_failed");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->at("code"), "RUNTIME_GPU_MONITORING_FAILED");
  EXPECT_EQ(failed->at("run_id"), sum.run_id);
}

// A tiny run with --max-memory auto and 30 MiB of headroom on a fake tree that `make_tree` finishes
// (MemAvailable is 32000 MiB, so only a cgroup can leave the 300 MiB of room it must see): the
// memory_budget event's budget, after checking that room; `output_dir` gets the run folder.
namespace {
uint64_t cgroup_budget(const std::string& dir, const std::function<void(const test::FakeSystemRoot&)>& make_tree,
                       std::string* output_dir) {
  TrainOptions o = monitored(tiny_chat_options(dir), dir, "temps 40");
  test::FakeSystemRoot fake{dir + "/root"};
  fake.meminfo(64000 * kMiB, 32000 * kMiB);
  make_tree(fake);
  o.max_memory_auto = true;
  o.monitor.memory_headroom_bytes = 30 * kMiB;
  Trainer(o).run();
  *output_dir = o.output_dir;
  auto records = monitor_records(o.output_dir);
  const nlohmann::json* budget = find_event(records, "memory_budget");
  if (!budget) {
    ADD_FAILURE() << "no memory_budget event";
    return 0;
  }
  EXPECT_EQ(budget->at("bytes_available"), 300 * kMiB) << "the cgroup's room, not MemAvailable";
  const uint64_t bytes = budget->at("bytes_budget");
  EXPECT_GE(bytes, 270 * kMiB);
  EXPECT_LT(bytes, 300 * kMiB) << "the run held less than the 30 MiB headroom when it planned";
  return bytes;
}
}  // namespace

// --max-memory auto with a cgroup limit: the plan's budget is the cgroup's room minus the
// headroom; when that room cannot hold one sequence, the run refuses to start instead of being
// killed by the kernel.
TEST(MonitorRun, PlanUsesTheCgroupLimit) {
  test::TempDir tmp;
  std::string run_dir;
  const uint64_t bytes = cgroup_budget(
      tmp.path,
      [](const test::FakeSystemRoot& fake) {
        fake.own_cgroup("/train");
        fake.cgroup_memory("/train", std::to_string(400 * kMiB), 100 * kMiB);
      },
      &run_dir);
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string metrics((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(metrics.find("limit " + format_bytes(bytes) + ";"), std::string::npos) << "the plan's enforced limit";

  test::TempDir small;
  TrainOptions t = monitored(tiny_chat_options(small.path), small.path, "temps 40");
  test::FakeSystemRoot tight{small.path + "/root"};
  tight.meminfo(64000 * kMiB, 32000 * kMiB);
  tight.own_cgroup("/train");
  tight.cgroup_memory("/train", std::to_string(101 * kMiB), 100 * kMiB);  // 1 MiB of room
  t.max_memory_auto = true;
  t.monitor.memory_headroom_bytes = 0;
  try {
    Trainer(t).run();
    FAIL() << "one sequence cannot fit in 1 MiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_CPU_OOM);
    EXPECT_NE(std::string(e.what()).find("cannot fit before the first step"), std::string::npos) << e.what();
  }
}

// The same on a cgroup v1 host (older Docker and Kubernetes nodes): the memory controller's
// memory.limit_in_bytes of the tightest level above the process bounds the plan, not the host's RAM.
TEST(MonitorRun, PlanUsesTheCgroupV1Limit) {
  test::TempDir tmp;
  std::string run_dir;
  cgroup_budget(
      tmp.path,
      [](const test::FakeSystemRoot& fake) {
        fake.own_cgroup_v1("/docker/job");
        fake.cgroup_v1_memory("", 9223372036854771712ull, 5000 * kMiB);  // v1's "no limit"
        fake.cgroup_v1_memory("/docker", 500 * kMiB, 200 * kMiB);        // 300 MiB of room: the tightest
        fake.cgroup_v1_memory("/docker/job", 800 * kMiB, 100 * kMiB);
      },
      &run_dir);
}

// Another program takes memory during training: after step 2 MemAvailable falls under
// monitor.memory_low, so step 3 turns gradient checkpointing on; after step 4 it falls further, so
// step 5 halves the micro-batch. No allocation ever failed; same samples, same losses.
TEST(MonitorRun, FallingAvailableMemoryShrinksTheMicroBatchBeforeAnyAllocationFails) {
  test::TempDir a_dir, b_dir;
  // Dropout off: its masks are seeded by each micro-batch's first sample, so a smaller micro-batch
  // draws other masks (as after any OOM recovery); without it the losses must match.
  TrainOptions a = tiny_chat_options(a_dir.path);
  a.micro_batch_size = 4;
  a.lora.dropout = 0;
  TrainSummary sa = Trainer(a).run();

  TrainOptions b = monitored(tiny_chat_options(b_dir.path), b_dir.path, "temps 40");
  b.micro_batch_size = 4;
  b.lora.dropout = 0;
  b.monitor.memory_low_bytes = 100 * kMiB;
  test::FakeSystemRoot fake{b_dir.path + "/root"};
  fake.meminfo(16000 * kMiB, 8000 * kMiB);
  TrainCallbacks cb;
  cb.on_step = [&](const StepRecord& r, const TrainSummary&, int64_t) {
    if (r.step == 2) fake.meminfo(16000 * kMiB, 60 * kMiB);
    if (r.step == 4) fake.meminfo(16000 * kMiB, 40 * kMiB);
  };
  const uint64_t ooms_before = cpu_allocator().stats().num_ooms;
  TrainSummary sb = Trainer(b, cb).run();
  EXPECT_EQ(cpu_allocator().stats().num_ooms, ooms_before) << "no allocation failed";
  EXPECT_FALSE(sa.gradient_checkpointing);
  EXPECT_TRUE(sb.gradient_checkpointing) << "the first low turns checkpointing on";
  EXPECT_EQ(sb.oom_recoveries, 2);
  EXPECT_EQ(sb.micro_batch_size, 2);
  EXPECT_EQ(sb.grad_accum, 2);
  int pressure = 0;
  for (const auto& r : monitor_records(b.output_dir))
    if (r.at("event") == "memory_pressure") {
      ++pressure;
      EXPECT_EQ(r.at("code"), "RUNTIME_MEMORY_PRESSURE");
      EXPECT_EQ(r.at("step"), pressure == 1 ? 3 : 5);
    }
  EXPECT_EQ(pressure, 2);
  ASSERT_EQ(sa.history.size(), sb.history.size());
  for (size_t i = 0; i < sa.history.size(); ++i) {
    EXPECT_EQ(sa.history[i].sample_ids, sb.history[i].sample_ids) << "step " << i + 1;
    EXPECT_NEAR(sa.history[i].loss, sb.history[i].loss, 1e-5 * std::max(1.0, std::fabs(sa.history[i].loss)))
        << "step " << i + 1;
  }
}

// Before each checkpoint the output folder's free space is checked against the checkpoint's size:
// a warning while fewer than monitor.disk_warn_checkpoints fit, then STATE_DISK_FULL before writing,
// with the earlier checkpoint intact and resumable.
TEST(MonitorRun, DiskFillingUpWarnsThenStopsWithTheEarlierCheckpointIntact) {
  test::TempDir tmp;
  TrainOptions o = monitored(tiny_chat_options(tmp.path), tmp.path, "temps 40");
  o.save_every = 2;
  o.monitor.disk_warn_checkpoints = 3;
  int checks = 0;
  Trainer* trainer = nullptr;
  o.monitor.free_disk_bytes_for_tests = [&](const std::string&) -> uint64_t {
    const uint64_t needed = checkpoint_bytes_estimate(trainer->model());
    ++checks;  // checkpoints of steps 2, 4, 6: plenty, room for two, not even one
    return checks == 1 ? UINT64_MAX : checks == 2 ? 2 * needed : needed - 1;
  };
  Trainer t(o);
  trainer = &t;
  try {
    t.run();
    FAIL() << "the third checkpoint cannot fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_DISK_FULL) << e.what();
  }
  auto records = monitor_records(o.output_dir);
  const nlohmann::json* low = find_event(records, "disk_low");
  const nlohmann::json* full = find_event(records, "disk_full");
  ASSERT_TRUE(low && full);
  EXPECT_EQ(low->at("step"), 4);
  EXPECT_EQ(full->at("step"), 6);
  EXPECT_EQ(full->at("bytes_checkpoint"), checkpoint_bytes_estimate(t.model()));
  EXPECT_EQ(CheckpointStore::verify(o.output_dir + "/checkpoints/checkpoint-4").at("step"), 4);
  EXPECT_FALSE(fs::exists(o.output_dir + "/checkpoints/checkpoint-6"));
}

// `backprop train` runs the monitor by default (--max-memory auto becomes its budget, written to
// metrics.jsonl); --no-monitor turns it off and the CPU plan is not enforced.
TEST(MonitorRun, CliMonitorsByDefaultAndNoMonitorTurnsItOff) {
  auto train = [](const std::string& dir, const std::string& extra) {
    std::string out;
    int rc = test::run_command(test::backprop_exe() + " train --device cpu --model " + test::source_dir() +
                                   "/models/tiny-chat --data " + test::source_dir() +
                                   "/examples/quickstart_sharegpt.jsonl --steps 1 --batch-size 1 --max-seq-length 128 "
                                   "--holdout 0 --lora-r 4 --threads 1 --output " +
                                   dir + " " + extra,
                               &out);
    EXPECT_EQ(rc, 0) << out;
    for (const auto& e : fs::directory_iterator(dir)) return read_file((e.path() / "metrics.jsonl").string());
    return std::string();
  };
  test::TempDir on, off;
  std::string with = train(on.path, "");
  EXPECT_NE(with.find("\"event\":\"memory_budget\""), std::string::npos) << with;
  EXPECT_EQ(with.find("not enforced"), std::string::npos) << "the plan is held to the monitor's budget";
  std::string without = train(off.path, "--no-monitor");
  EXPECT_EQ(without.find("\"type\":\"monitor\""), std::string::npos) << without;
  EXPECT_NE(without.find("(machine RAM, not enforced)"), std::string::npos) << without;
}

// In a real cgroup v2 with memory.max, a run without the monitor plans against the machine's RAM
// and is killed by the kernel; the monitored run plans against the cgroup and finishes. Needs root
// and a writable cgroup v2 with the memory controller.
TEST(MonitorRun, RealCgroupMonitoredRunFinishesWhereUnmonitoredIsKilled) {
  std::string controllers;
  {
    std::ifstream in("/sys/fs/cgroup/cgroup.controllers");
    std::getline(in, controllers);
  }
  const std::string group = "/sys/fs/cgroup/bp_monitor_test_" + std::to_string(getpid());
  if (controllers.find("memory") == std::string::npos)
    GTEST_SKIP() << "/sys/fs/cgroup is not a cgroup v2 with the memory controller here (controllers: '" << controllers
                 << "')";
  if (::mkdir(group.c_str(), 0755) != 0)
    GTEST_SKIP() << "cannot create a cgroup under /sys/fs/cgroup (needs root and a writable cgroup v2): "
                 << std::strerror(errno);
  struct RemoveGroup {
    std::string path;
    ~RemoveGroup() { ::rmdir(path.c_str()); }
  } remove_group{group};
  test::write_text_file(group + "/memory.max", std::to_string(600 * kMiB));
  test::write_text_file(group + "/memory.swap.max", "0");
  test::TempDir tmp;
  auto train = [&](const std::string& extra) {
    std::string cmd =
        "sh -c 'echo $$ > " + group + "/cgroup.procs && exec " + test::backprop_exe() + " train --device cpu --model " +
        test::source_dir() + "/models/tiny-chat --data " + test::source_dir() +
        "/examples/quickstart_sharegpt.jsonl --mode full --steps 2 --batch-size 128 --max-seq-length 512 --threads 1 "
        "--holdout 0 --gradient-checkpointing false --output " +
        tmp.path + " " + extra + "'";
    std::string out;
    int rc = test::run_command(cmd, &out);
    return std::make_pair(rc, out);
  };
  auto [rc_off, out_off] = train("--no-monitor --max-memory none");
  EXPECT_NE(rc_off, 0) << "128 sequences in one micro-batch without checkpointing do not fit in 600 MiB:\n" << out_off;
  auto [rc_on, out_on] = train("--max-memory auto");
  EXPECT_EQ(rc_on, 0) << out_on;
}

}  // namespace bp
