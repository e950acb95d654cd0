#include "train/checkpoint.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/atomic_file.h"
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

// A crash (SIGKILL) at every point inside a checkpoint write leaves the previous one loadable.
TEST_F(CheckpointTest, CrashAtAnyPointKeepsPreviousLoadable) {
  for (std::string point : {"checkpoint:after_weights.bin", "checkpoint:after_optimizer.bin",
                            "checkpoint:before_manifest", "checkpoint:before_rename"}) {
    test::TempDir dir;
    CheckpointStore store(dir.path);
    store.write(1, {text_file("weights.bin", "w1"), text_file("optimizer.bin", "o1")}, {{"step", 1}});
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      io_faults().crash_at = point;
      store.write(2, {text_file("weights.bin", "w2"), text_file("optimizer.bin", "o2")}, {{"step", 2}});
      _exit(0);  // not reached when the crash fires
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << point;
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    auto latest = store.latest_valid();
    ASSERT_TRUE(latest) << point;
    EXPECT_EQ(latest->step, 1) << point;
    EXPECT_EQ(slurp(latest->path + "/weights.bin"), "w1");
    auto removed = store.remove_stale_partials();
    EXPECT_EQ(removed.size(), 1u) << point;
    EXPECT_FALSE(fs::exists(dir.path + "/checkpoint-2.partial"));
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
