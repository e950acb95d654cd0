// core/file_read: the one reader of user files refuses what would hang or exhaust memory (FIFOs,
// devices, directories, files past their kind's cap, JSON nested past the depth bound), and the
// limits.* settings set the caps (environment first, so they also cap the --config file).
#include "core/file_read.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/file_lines.h"
#include "core/settings.h"
#include "support/expect_error.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::code_of;

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Restores the process-wide caps after a test changes them.
struct CapsGuard {
  FileReadLimits saved = file_read_limits();
  ~CapsGuard() { file_read_limits() = saved; }
};

constexpr FileReader kReader{"test", ErrorCode::DEP_MODEL_LOAD_FAILED};

TEST(FileRead, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  test::TempDir dir;
  const std::string fifo = dir.path + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A FIFO with no writer: a plain open() for reading would wait forever.
  EXPECT_EQ(code_of([&] { read_file_capped(fifo, FileKind::Config, kReader); }), ErrorCode::INPUT_FILE_NOT_REGULAR);
  EXPECT_EQ(code_of([&] { read_file_capped("/dev/zero", FileKind::Config, kReader); }),
            ErrorCode::INPUT_FILE_NOT_REGULAR);
  EXPECT_EQ(code_of([&] { read_file_capped(dir.path, FileKind::Config, kReader); }), ErrorCode::INPUT_FILE_NOT_REGULAR);
  EXPECT_EQ(code_of([&] { check_not_special_file(fifo, "log"); }), ErrorCode::INPUT_FILE_NOT_REGULAR);
  check_not_special_file(dir.path + "/not-there-yet", "log");  // a new file is fine
  // A missing file keeps the reader's own code and names the path.
  try {
    read_file_capped(dir.path + "/missing.json", FileKind::Config, kReader);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
  }
}

TEST(FileRead, EachKindHasItsOwnCap) {
  CapsGuard guard;
  test::TempDir dir;
  const std::string f = write(dir.path + "/f.json", std::string(100, 'x'));
  file_read_limits().config_bytes = 100;
  EXPECT_EQ(read_file_capped(f, FileKind::Config, kReader).size(), 100u);
  file_read_limits().config_bytes = 99;
  try {
    read_file_capped(f, FileKind::Config, kReader);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_FILE_TOO_LARGE);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("100 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limits.max_config_bytes"), std::string::npos) << msg;
  }
  // The other kinds are not affected by the config cap.
  EXPECT_EQ(read_file_capped(f, FileKind::Tokenizer, kReader).size(), 100u);
  file_read_limits().tokenizer_bytes = 10;
  EXPECT_EQ(code_of([&] { read_file_capped(f, FileKind::Tokenizer, kReader); }), ErrorCode::INPUT_FILE_TOO_LARGE);
  file_read_limits().dataset_bytes = 10;
  EXPECT_EQ(code_of([&] { read_file_capped(f, FileKind::Dataset, kReader); }), ErrorCode::INPUT_FILE_TOO_LARGE);
}

TEST(FileRead, JsonDepthIsBoundedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(json_nesting_depth(deep), 100000);
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[{{{", "b": [[1]]})"), 3);  // brackets in strings do not count
  EXPECT_EQ(json_nesting_depth(R"(["\"[[[", [2]])"), 2);                // nor after an escaped quote
  EXPECT_EQ(code_of([&] { parse_json_bounded(deep, "deep.json", "test"); }), ErrorCode::INPUT_JSON_TOO_DEEP);
  const std::string ok = std::string(kMaxJsonFileDepth, '[') + std::string(kMaxJsonFileDepth, ']');
  EXPECT_FALSE(parse_json_bounded(ok, "ok.json", "test").is_discarded());
  const std::string over = "[" + ok + "]";
  EXPECT_EQ(code_of([&] { parse_json_bounded(over, "over.json", "test"); }), ErrorCode::INPUT_JSON_TOO_DEEP);
  // Trailing garbage after a complete value is not JSON.
  EXPECT_TRUE(parse_json_bounded("[1, 2] trailing", "t.json", "test").is_discarded());
  EXPECT_TRUE(parse_json_bounded("{} {}", "t.json", "test").is_discarded());
}

TEST(FileRead, LimitSettingsSetTheCapsAndCapTheConfigFileItself) {
  CapsGuard guard;
  test::TempDir dir;
  const std::string toml = write(dir.path + "/c.toml", "[training]\nlr = 0.001\n# " + std::string(200, 'x') + "\n");
  // From the environment: applies to the --config file read by the same load.
  EXPECT_EQ(code_of([&] {
              Settings::load(toml, {{"BACKPROPAGATE_LIMITS__MAX_CONFIG_BYTES", "100"}}, {});
            }),
            ErrorCode::INPUT_FILE_TOO_LARGE);
  Settings s =
      Settings::load(toml, {{"BACKPROPAGATE_LIMITS__MAX_TOKENIZER_BYTES", "2K"}}, {{"limits.max_dataset_bytes", "3M"}});
  EXPECT_DOUBLE_EQ(s.get_float("training.lr"), 0.001);
  EXPECT_EQ(file_read_limits().tokenizer_bytes, 2048u);
  EXPECT_EQ(file_read_limits().dataset_bytes, 3u << 20);
  EXPECT_EQ(file_read_limits().config_bytes, 64u << 20);  // the default
  EXPECT_EQ(code_of([&] {
              Settings::load("", {{"BACKPROPAGATE_LIMITS__MAX_CONFIG_BYTES", "lots"}}, {});
            }),
            ErrorCode::CONFIG_INVALID_SETTING);
  // --config naming a directory or a device is an error, not an empty file.
  EXPECT_EQ(code_of([&] { Settings::load(dir.path, {}, {}); }), ErrorCode::INPUT_FILE_NOT_REGULAR);
  EXPECT_EQ(code_of([&] { Settings::load("/dev/zero", {}, {}); }), ErrorCode::INPUT_FILE_NOT_REGULAR);
}

// The line reader of run files (metrics.jsonl): read in pieces, an overlong line skipped instead of
// grown without bound, a device refused like everywhere else.
TEST(FileReadLines, LinesAreReadInPiecesAndOverlongOnesSkipped) {
  test::TempDir tmp;
  const std::string path = tmp.path + "/m.jsonl";
  std::ofstream(path, std::ios::binary) << "a\n" << std::string(200000, 'y') << "\nb\n\nc";
  std::vector<std::string> lines;
  const size_t skipped = for_each_line_capped(
      path, FileKind::Dataset, {"test"}, [&](std::string_view l) { lines.emplace_back(l); }, 100000);
  EXPECT_EQ(skipped, 1u);
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "b", "", "c"}));
  try {
    for_each_line_capped("/dev/zero", FileKind::Dataset, {"test"}, [](std::string_view) {});
    ADD_FAILURE() << "a character device is not read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_FILE_NOT_REGULAR) << e.what();
  }
}

}  // namespace
}  // namespace bp
