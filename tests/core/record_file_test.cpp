// core/record_file: a record that cannot be written (an injected ENOSPC) is warned about once,
// waits, and is written before the next one once there is room again, in order and whole; the wait
// is bounded (kMaxPendingBytes) and what is lost is counted.
#include "core/record_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace bp {
namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct FaultsReset {
  ~FaultsReset() { record_write_faults() = {}; }
};

int open_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

TEST(RecordFile, FailedWritesWarnOnceWaitAndAreWrittenInOrderWhenThereIsRoom) {
  test::TempDir tmp;
  FaultsReset reset;
  const std::string path = tmp.path + "/metrics.jsonl";
  RecordFile f;
  f.attach(open_append(path), path, "metrics file");
  std::vector<std::string> warnings;
  f.set_on_failure([&](const std::string& m) { warnings.push_back(m); });
  // 10 bytes fit; then 2 write attempts fail; then there is room again.
  record_write_faults() = {10, 2, ENOSPC};
  EXPECT_FALSE(f.write("record-1\nrecord-2\n"));  // a short write (10 bytes), then a failure
  EXPECT_FALSE(f.write("record-3\n"));
  EXPECT_EQ(f.records_waiting(), 2u);  // record-1 is out; record-2 was begun
  EXPECT_TRUE(f.write("record-4\n"));  // room again: the waiting ones first, then this one
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(path), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("No space left on device"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("metrics file"), std::string::npos) << warnings[0];
  f.close();
  EXPECT_EQ(f.records_lost(), 0u);
  EXPECT_EQ(slurp(path), "record-1\nrecord-2\nrecord-3\nrecord-4\n");
}

TEST(RecordFile, ABufferFullOfWaitingRecordsLosesTheNewOnesAndCountsThem) {
  test::TempDir tmp;
  FaultsReset reset;
  const std::string path = tmp.path + "/log.jsonl";
  RecordFile f;
  f.attach(open_append(path), path, "log file");
  record_write_faults() = {0, 0, ENOSPC};  // the disk stays full
  const std::string record(1000, 'x');
  const size_t fit = RecordFile::kMaxPendingBytes / 1001;
  for (size_t i = 0; i < fit + 5; ++i) f.write(record + "\n");
  EXPECT_EQ(f.records_waiting(), fit);
  EXPECT_EQ(f.records_lost(), 5u);
  EXPECT_TRUE(f.failed());
  f.close();  // still no room: the waiting ones are lost too
  EXPECT_EQ(f.records_lost(), fit + 5);
  EXPECT_EQ(slurp(path), "");
}

}  // namespace
}  // namespace bp
