// The layer order of DESIGN.md ("Layers"), enforced on every #include in src/ so it cannot drift:
//   core < backend < ops < io < hub < text < model < train = export < ui = cli = python
// A file may include headers of its own layer and of layers below it, never above. Backends are
// reached only through the ops' dispatch: outside backend/ and ops/ nothing includes backend/.
// Only cli/ and ui/ include CLI11 (core parses and checks settings; binding flags is cli/'s job).
// The check reads the sources (BP_SOURCE_DIR) and lists every offending line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const std::map<std::string, int>& layer_rank() {
  static const std::map<std::string, int> rank = {{"core", 0},   {"backend", 1}, {"ops", 2},   {"io", 3},
                                                  {"hub", 4},    {"text", 5},    {"model", 6}, {"train", 7},
                                                  {"export", 7}, {"ui", 8},      {"cli", 8},   {"python", 8}};
  return rank;
}

// Violations of the order in one file's text; `layer` is the folder under src/ the file lives in.
std::vector<std::string> include_violations(const std::string& file, const std::string& layer,
                                            const std::string& text) {
  static const std::regex include_re(R"(^\s*#\s*include\s+"([a-z_]+)/[^"]+")");
  static const std::regex cli11_re(R"(^\s*#\s*include\s+<CLI/)");
  std::vector<std::string> out;
  const auto& rank = layer_rank();
  const auto own = rank.find(layer);
  if (own == rank.end()) return {file + ": folder src/" + layer + " is not in the layer list"};
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    if (std::regex_search(line, cli11_re) && layer != "cli" && layer != "ui")
      out.push_back(file + ":" + std::to_string(n) + ": only cli/ and ui/ parse command lines (CLI11): " + line);
    if (!std::regex_search(line, m, include_re)) continue;
    const std::string target = m[1];
    const auto it = rank.find(target);
    if (it == rank.end()) continue;  // generated headers (build_info.h) and the like
    if (it->second > own->second)
      out.push_back(file + ":" + std::to_string(n) + ": " + layer + " includes the higher layer " + target + ": " +
                    line);
    else if (target == "backend" && layer != "backend" && layer != "ops")
      out.push_back(file + ":" + std::to_string(n) + ": only ops/ reaches backend/ (through its dispatch): " + line);
  }
  return out;
}

TEST(LayerOrder, EveryIncludeInSrcPointsDownTheLayerList) {
  const fs::path src = fs::path(BP_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  std::vector<std::string> violations;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".inc") continue;
    const std::string layer = fs::relative(e.path(), src).begin()->string();
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    for (auto& v : include_violations(fs::relative(e.path(), src.parent_path()).string(), layer, ss.str()))
      violations.push_back(std::move(v));
    ++files;
  }
  EXPECT_GT(files, 100);  // the walk found the tree
  std::string all;
  for (const auto& v : violations) all += v + "\n";
  EXPECT_TRUE(violations.empty()) << violations.size() << " includes break the layer order:\n" << all;
}

// The checker itself catches what it must (so the test above can fail).
TEST(LayerOrder, CheckerFlagsUpwardAndBackendIncludes) {
  EXPECT_EQ(include_violations("src/core/x.h", "core", "#include \"model/config.h\"\n").size(), 1u);
  EXPECT_EQ(include_violations("src/io/x.h", "io", "#include <vector>\n#include \"export/ollama.h\"\n").size(), 1u);
  EXPECT_EQ(include_violations("src/train/x.cpp", "train", "#include \"backend/cpu/gemm.h\"\n").size(), 1u);
  EXPECT_EQ(include_violations("src/core/x.h", "core", "#include \"backend/cuda/cuda_device.h\"\n").size(), 1u);
  EXPECT_TRUE(include_violations("src/ops/x.cpp", "ops", "#include \"backend/cpu/gemm.h\"\n").empty());
  EXPECT_TRUE(include_violations("src/export/x.cpp", "export", "#include \"train/checkpoint.h\"\n").empty());
  EXPECT_TRUE(include_violations("src/cli/x.cpp", "cli", "  #  include \"core/error.h\"\n").empty());
  EXPECT_EQ(include_violations("src/widgets/x.h", "widgets", "").size(), 1u);  // a new folder needs a rank
  EXPECT_EQ(include_violations("src/core/x.cpp", "core", "#include <CLI/CLI.hpp>\n").size(), 1u);
  EXPECT_TRUE(include_violations("src/cli/x.cpp", "cli", "#include <CLI/CLI.hpp>\n").empty());
}

}  // namespace
