#include "core/error_report.h"

#include <gtest/gtest.h>

namespace bp {
namespace {

TEST(ErrorReport, TextHasCodeRunIdAndSuggestionInOrder) {
  Error e(ErrorCode::STATE_DISK_FULL, "[checkpoint] no space left writing step 40");
  std::string t = render_error_text(e, "1b4e28ba-2fa1-41d2-883f-0016d3cca427");
  EXPECT_EQ(t,
            "[ERROR] [STATE_DISK_FULL] [checkpoint] no space left writing step 40\n"
            "Run id: 1b4e28ba-2fa1-41d2-883f-0016d3cca427\n"
            "Suggestion: " +
                std::string(error_info(ErrorCode::STATE_DISK_FULL).suggestion) + "\n");
  EXPECT_EQ(render_error_text(e, "").find("Run id"), std::string::npos);
}

// A file-system error reaching the CLI is the user's (a path) or a full disk, not "a bug".
TEST(ErrorReport, FilesystemErrorsBecomeUserErrorsNamingThePath) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories("/dev/null/run", ec);
  ASSERT_TRUE(ec);
  Error e = error_from_filesystem(fs::filesystem_error("cannot create directories", "/dev/null/run", ec));
  EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED) << e.what();
  EXPECT_NE(std::string(e.what()).find("/dev/null/run"), std::string::npos) << e.what();
  EXPECT_EQ(e.details()["path"], "/dev/null/run");
  auto with = [](std::errc c) {
    return error_from_filesystem(fs::filesystem_error("x", "/p", std::make_error_code(c))).code();
  };
  EXPECT_EQ(with(std::errc::no_space_on_device), ErrorCode::STATE_DISK_FULL);
  EXPECT_EQ(with(std::errc::read_only_file_system), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(with(std::errc::permission_denied), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(with(std::errc::io_error), ErrorCode::RUNTIME_INTERNAL);
}

TEST(ErrorReport, JsonEnvelopeIsCompleteAndRedacted) {
  Error e(ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED, "[ollama] refused: Bearer abcdefghijkl",
          {{"url", "http://u:hunter22@host/api"}, {"n", 3}});
  auto j = render_error_json(e, "");
  EXPECT_EQ(j["code"], "DEP_OLLAMA_REGISTRATION_FAILED");
  EXPECT_EQ(j["retryable"], "yes");
  EXPECT_TRUE(j["run_id"].is_null());
  EXPECT_EQ(j["details"]["n"], 3);
  std::string dumped = j.dump();
  EXPECT_EQ(dumped.find("abcdefghijkl"), std::string::npos) << dumped;
  EXPECT_EQ(dumped.find("hunter22"), std::string::npos) << dumped;
  for (const char* k : {"code", "message", "retryable", "suggestion", "details", "run_id"}) EXPECT_TRUE(j.contains(k));
  EXPECT_EQ(render_error_json(e, "abc")["run_id"], "abc");
}

TEST(ErrorReport, ExitCodesFollowCategories) {
  for (const auto& e : error_catalog()) {
    std::string cat = e.category;
    int want = e.code == ErrorCode::RUNTIME_TRAINING_ABORTED ? 130 : (cat == "config" || cat == "input") ? 1 : 2;
    EXPECT_EQ(exit_code_for(e.code), want) << e.name;
  }
}

TEST(ErrorReport, MarkdownListsEveryCode) {
  std::string md = error_catalog_markdown();
  for (const auto& e : error_catalog()) {
    EXPECT_NE(md.find(std::string("## ") + e.name + "\n"), std::string::npos) << e.name;
    EXPECT_NE(md.find(e.suggestion), std::string::npos) << e.name;
  }
}

}  // namespace
}  // namespace bp
