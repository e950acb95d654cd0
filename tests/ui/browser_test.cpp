// Runs tests/ui/browser_test.mjs: `backprop ui` in headless Chromium (Debian's chromium, driven by
// playwright-core from tests/oracles). A missing browser or node package fails the test with the
// reason (scripts/setup.sh --test installs both); it never skips. The screenshot of the run page is
// kept at build/test_artifacts/ui_run_page.png.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_util.h"

namespace bp::test {
namespace {

TEST(UiBrowser, StartWatchStopResumeExportATinyRun) {
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium")) << "apt-get install chromium (scripts/setup.sh --test)";
  ASSERT_TRUE(std::filesystem::exists(source_dir() + "/tests/oracles/node_modules/playwright-core"))
      << "cd tests/oracles && npm ci (scripts/setup.sh --test)";
  TempDir work;
  const std::string artifacts = binary_dir() + "/test_artifacts";
  std::filesystem::create_directories(artifacts);
  std::string out;
  const int rc = run_command("node " + source_dir() + "/tests/ui/browser_test.mjs " + backprop_exe() + " " +
                                 source_dir() + " " + work.path + " " + artifacts + "/ui_run_page.png",
                             &out);
  EXPECT_EQ(rc, 0) << out;
  std::cout << out;
}

}  // namespace
}  // namespace bp::test
