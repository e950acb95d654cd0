#include "train/checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "io/atomic_file.h"
#include "io/sha256.h"
#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

static CheckpointFile text_file(const std::string& name, const std::string& body) {
  return {name, [body](const std::string& path) { write_file_atomic(path, body); }};
}

static std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class CheckpointTest : public ::testing::Test {
 protected:
  void TearDown() override { io_faults() = IoFaults{}; }
  test::TempDir tmp;
};

TEST_F(CheckpointTest, WritesVerifiesAndListsByStep) {
  CheckpointStore store(tmp.path + "/checkpoints");
  store.write(10, {text_file("weights.bin", "abc")}, {{"step", 10}});
  store.write(2, {text_file("weights.bin", "xyz")}, {{"step", 2}});
  auto all = store.list();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 2);
  EXPECT_EQ(all[1].step, 10);
  auto latest = store.latest_valid();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 10);
  EXPECT_EQ(latest->trainer_state["step"], 10);
  EXPECT_TRUE(fs::exists(latest->path + "/manifest.json"));
  EXPECT_FALSE(fs::exists(latest->path + ".partial"));
}

TEST_F(CheckpointTest, CorruptedOrTruncatedIsRejectedAndOlderUsed) {
  CheckpointStore store(tmp.path);
  store.write(1, {text_file("weights.bin", "good weights")}, {{"step", 1}});
  std::string bad = store.write(2, {text_file("weights.bin", "newer weights")}, {{"step", 2}});
  {  // flip a byte
    std::fstream f(bad + "/weights.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('N' ^ 1);
  }
  std::vector<std::string> skipped;
  auto latest = store.latest_valid([&](const std::string& p, const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_CHECKPOINT_INVALID);
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
    skipped.push_back(p);
  });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 1);
  EXPECT_EQ(skipped.size(), 1u);
  // Truncation is named as such.
  fs::resize_file(latest->path + "/weights.bin", 3);
  try {
    CheckpointStore::verify(latest->path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_CHECKPOINT_INVALID);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  // A missing manifest too.
  fs::remove(bad + "/manifest.json");
  EXPECT_THROW(CheckpointStore::verify(bad), Error);
  EXPECT_FALSE(store.latest_valid());
}

TEST_F(CheckpointTest, DiskFullLeavesPreviousCheckpointIntactAndNoPartial) {
  CheckpointStore store(tmp.path);
  std::string first = store.write(1, {text_file("weights.bin", std::string(1000, 'a'))}, {{"step", 1}});
  io_faults().enospc_after_bytes = 500;  // the next write runs out of space midway
  try {
    store.write(2, {text_file("weights.bin", std::string(1000, 'b'))}, {{"step", 2}});
    FAIL() << "expected STATE_DISK_FULL";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_DISK_FULL) << e.what();
  }
  io_faults() = IoFaults{};
  EXPECT_FALSE(fs::exists(tmp.path + "/checkpoint-2.partial"));
  EXPECT_FALSE(fs::exists(tmp.path + "/checkpoint-2"));
  auto latest = store.latest_valid();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->path, first);
  EXPECT_EQ(slurp(first + "/weights.bin"), std::string(1000, 'a'));
}

// Runs `write` in a child process that is SIGKILLed at crash point `point`.
static void write_and_crash_at(const std::string& point, const std::function<void()>& write) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    io_faults().crash_at = point;
    write();
    _exit(0);  // not reached when the crash fires
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << point;
  EXPECT_EQ(WTERMSIG(status), SIGKILL) << point;
}

static std::vector<std::string> folder_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A crash (SIGKILL) at every point inside a checkpoint write leaves a loadable checkpoint: the
// previous one, or the new one once its manifest was written (recovery then moves it in place).
TEST_F(CheckpointTest, CrashAtAnyPointKeepsPreviousLoadable) {
  for (std::string point :
       {"checkpoint:after_weights.bin", "checkpoint:after_optimizer.bin", "checkpoint:before_manifest",
        "checkpoint:before_rename", "checkpoint:before_remove_aside"}) {
    test::TempDir dir;
    CheckpointStore store(dir.path);
    store.write(1, {text_file("weights.bin", "w1"), text_file("optimizer.bin", "o1")}, {{"step", 1}});
    write_and_crash_at(point, [&] {
      store.write(2, {text_file("weights.bin", "w2"), text_file("optimizer.bin", "o2")}, {{"step", 2}});
    });
    auto before = store.latest_valid();
    ASSERT_TRUE(before) << point;
    bool manifest_written = point == "checkpoint:before_rename" || point == "checkpoint:before_remove_aside";
    auto actions = store.recover_interrupted_writes();
    EXPECT_EQ(actions.size(), point == "checkpoint:before_remove_aside" ? 0u : 1u) << point;
    auto latest = store.latest_valid();
    ASSERT_TRUE(latest) << point;
    EXPECT_EQ(latest->step, manifest_written ? 2 : 1) << point;
    EXPECT_EQ(slurp(latest->path + "/weights.bin"), manifest_written ? "w2" : "w1") << point;
    std::vector<std::string> want = {"checkpoint-1"};
    if (manifest_written) want.push_back("checkpoint-2");
    EXPECT_EQ(folder_names(dir.path), want) << point;
  }
}

// Re-writing a step that has a folder (the final save after a periodic one, with
// --keep-checkpoints 1 the only checkpoint): a crash between any two steps of the promotion
// leaves a complete checkpoint-2 after recovery, old or new, and nothing else.
TEST_F(CheckpointTest, CrashDuringRewriteOfSameStepNeverLosesTheCheckpoint) {
  for (std::string point : {"checkpoint:after_weights.bin", "checkpoint:before_manifest", "checkpoint:before_rename",
                            "checkpoint:after_set_aside", "checkpoint:before_remove_aside"}) {
    test::TempDir dir;
    CheckpointStore store(dir.path);
    store.write(2, {text_file("weights.bin", "old")}, {{"step", 2}});
    write_and_crash_at(point, [&] { store.write(2, {text_file("weights.bin", "new")}, {{"step", 2}}); });
    auto actions = store.recover_interrupted_writes();
    auto latest = store.latest_valid();
    ASSERT_TRUE(latest) << point << ": no complete checkpoint left";
    EXPECT_EQ(latest->step, 2);
    bool new_in = point == "checkpoint:after_set_aside" || point == "checkpoint:before_remove_aside";
    EXPECT_EQ(slurp(latest->path + "/weights.bin"), new_in ? "new" : "old") << point;
    EXPECT_EQ(folder_names(dir.path), std::vector<std::string>{"checkpoint-2"}) << point;
  }
}

// Only the folder set aside is complete (the new .partial is damaged): it is restored, not deleted.
TEST_F(CheckpointTest, RecoveryRestoresTheAsideFolderWhenItIsTheOnlyCompleteOne) {
  CheckpointStore store(tmp.path);
  store.write(2, {text_file("weights.bin", "old")}, {{"step", 2}});
  write_and_crash_at("checkpoint:after_set_aside", [&] {
    store.write(2, {text_file("weights.bin", "new")}, {{"step", 2}});
  });
  ASSERT_TRUE(fs::exists(tmp.path + "/checkpoint-2.old"));
  ASSERT_FALSE(fs::exists(tmp.path + "/checkpoint-2"));
  fs::resize_file(tmp.path + "/checkpoint-2.partial/weights.bin", 1);  // the new one is damaged
  auto actions = store.recover_interrupted_writes();
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_NE(actions[0].find("restored"), std::string::npos) << actions[0];
  auto latest = store.latest_valid();
  ASSERT_TRUE(latest);
  EXPECT_EQ(slurp(latest->path + "/weights.bin"), "old");
  EXPECT_EQ(folder_names(tmp.path), std::vector<std::string>{"checkpoint-2"});
}

// --keep-checkpoints 0 is documented as "keep all".
TEST_F(CheckpointTest, PruneZeroKeepsEveryCheckpoint) {
  CheckpointStore store(tmp.path);
  for (int s = 1; s <= 3; ++s) store.write(s, {text_file("w", std::to_string(s))}, {{"step", s}});
  EXPECT_TRUE(store.prune(0).empty());
  EXPECT_EQ(store.list().size(), 3u);
}

// Wrong JSON types in manifest.json / trainer_state.json and a folder whose step overflows are
// STATE_CHECKPOINT_INVALID, reported, and the next older valid checkpoint is used.
TEST_F(CheckpointTest, MalformedJsonTypesAndHugeStepFallBackToOlder) {
  CheckpointStore store(tmp.path);
  store.write(1, {text_file("w", "1")}, {{"step", 1}});
  auto damage = [&](int step, const std::string& file, const std::string& body) {
    std::string dir = store.write(step, {text_file("w", "x")}, {{"step", step}});
    write_file_atomic(dir + "/" + file, body);
    if (file == "trainer_state.json") {  // keep the checksum right: only the types are wrong
      auto m = nlohmann::json::parse(slurp(dir + "/manifest.json"));
      m["files"]["trainer_state.json"] = {{"bytes", body.size()}, {"sha256", sha256_file_hex(dir + "/" + file)}};
      write_file_atomic(dir + "/manifest.json", m.dump());
    }
  };
  damage(2, "manifest.json", R"({"files": {"w": {"bytes": "abc", "sha256": "00"}}})");
  damage(3, "manifest.json", R"({"files": ["w"]})");
  damage(4, "manifest.json", R"([1, 2])");
  damage(5, "trainer_state.json", R"([1, 2])");
  damage(6, "trainer_state.json", R"({"step": "six"})");
  damage(7, "manifest.json", std::string(100000, '[') + std::string(100000, ']'));  // deep: bounded, no crash
  damage(8, "trainer_state.json", std::string(100000, '{') + "}");
  fs::create_directories(tmp.path + "/checkpoint-99999999999999999999999");
  std::vector<std::string> skipped;
  auto latest = store.latest_valid([&](const std::string& p, const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_CHECKPOINT_INVALID) << e.what();
    skipped.push_back(fs::path(p).filename().string());
  });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 1);
  EXPECT_EQ(skipped,
            (std::vector<std::string>{"checkpoint-99999999999999999999999", "checkpoint-8", "checkpoint-7",
                                      "checkpoint-6", "checkpoint-5", "checkpoint-4", "checkpoint-3", "checkpoint-2"}));
  EXPECT_EQ(store.list().size(), 8u);  // the overflowing folder is no step, and no crash
}

// The caller's check skips a checkpoint by throwing STATE_CHECKPOINT_INVALID; other errors propagate.
TEST_F(CheckpointTest, CheckCallbackSkipsInvalidAndPropagatesOtherErrors) {
  CheckpointStore store(tmp.path);
  store.write(1, {text_file("w", "1")}, {{"step", 1}});
  store.write(2, {text_file("w", "2")}, {{"step", 2}});
  auto latest = store.latest_valid({}, [](const CheckpointInfo& c) {
    if (c.step == 2) throw Error(ErrorCode::STATE_CHECKPOINT_INVALID, "non-finite weights");
  });
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 1);
  try {
    store.latest_valid({}, [](const CheckpointInfo&) { throw Error(ErrorCode::CONFIG_INVALID, "modes differ"); });
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID);
  }
}

TEST_F(CheckpointTest, PruneKeepsLastKAndBest) {
  CheckpointStore store(tmp.path);
  std::vector<std::string> paths;
  for (int s = 1; s <= 5; ++s) paths.push_back(store.write(s, {text_file("w", std::to_string(s))}, {{"step", s}}));
  auto removed = store.prune(2, paths[0]);  // keep 4, 5 and the best (1)
  EXPECT_EQ(removed.size(), 2u);
  auto left = store.list();
  ASSERT_EQ(left.size(), 3u);
  EXPECT_EQ(left[0].step, 1);
  EXPECT_EQ(left[1].step, 4);
  EXPECT_EQ(left[2].step, 5);
}

TEST(AtomicFile, UncommittedWriteLeavesNothingAndOldContentStays) {
  test::TempDir tmp;
  std::string p = tmp.path + "/f.txt";
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write("new content");
  }  // destroyed without commit
  EXPECT_EQ(slurp(p), "old");
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

TEST(AtomicFile, RequireFreeSpaceReportsNumbers) {
  test::TempDir tmp;
  try {
    require_free_space(tmp.path + "/x/y.gguf", UINT64_MAX / 2, "the GGUF export");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_DISK_FULL);
    EXPECT_NE(std::string(e.what()).find("the GGUF export needs"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(require_free_space(tmp.path, 1, "a byte"));
}

}  // namespace bp
