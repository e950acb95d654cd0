// Tests that train compare against CPU and torch references with f32 tolerances, so they must train
// on the CPU even on a machine with a GPU, where the default --device auto would pick the card. This
// scans the test sources (outside tests/cuda, whose tests are the ones meant for the card) for
// `backprop train` / `multi-run` command lines without --device and for TrainOptions built from
// scratch in a file that never sets .device.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

TEST(DevicePin, TrainingTestsPinTheCpu) {
  const std::regex command(R"((^|[ "(])(train|multi-run) --(?!help|device ))");
  const std::regex fresh_options(R"(\bTrainOptions [a-z_]+;)");
  std::vector<std::string> unpinned;
  int files = 0;
  for (auto it = fs::recursive_directory_iterator(source_dir() + "/tests"); it != fs::recursive_directory_iterator();
       ++it) {
    const fs::path& p = it->path();
    if (it->is_directory() && (p.filename() == "node_modules" || p.filename() == "cuda")) {
      it.disable_recursion_pending();  // npm packages; tests/cuda trains on the (simulated) card on purpose
      continue;
    }
    const std::string path = p.string();
    if (p.extension() != ".cpp" || p.filename() == "device_pin_test.cpp") continue;
    ++files;
    std::ifstream f(path);
    std::stringstream text;
    text << f.rdbuf();
    const std::string s = text.str();
    std::istringstream lines(s);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      const size_t first = line.find_first_not_of(" \t");
      const bool comment = first != std::string::npos && line.compare(first, 2, "//") == 0;
      if (!comment && std::regex_search(line, command))
        unpinned.push_back(path + ":" + std::to_string(n) + ": " + line);
    }
    if (std::regex_search(s, fresh_options) && s.find(".device = \"cpu\"") == std::string::npos)
      unpinned.push_back(path + ": builds TrainOptions but never sets .device = \"cpu\"");
  }
  EXPECT_GT(files, 50) << "the scan found the test sources";
  for (const auto& u : unpinned) ADD_FAILURE() << "train on the CPU (--device cpu / o.device = \"cpu\"): " << u;
}

}  // namespace
}  // namespace bp::test
