// The GGUF oracle shared by the io/ and export/ tests: @huggingface/gguf (tests/oracles/gguf_read.mjs)
// parses a file independently, and its view is compared with our reader's.
#include "support/gguf_oracle.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_util.h"

namespace bp {

namespace gguf_testing {

// Runs tests/oracles/gguf_read.mjs (@huggingface/gguf) on `path`; fails the test when node or the
// npm package is missing: an oracle test never skips silently.
nlohmann::json oracle_read(const std::string& path) {
  const std::string script = test::source_dir() + "/tests/oracles/gguf_read.mjs";
  const std::string pkg = test::source_dir() + "/tests/oracles/node_modules/@huggingface/gguf/package.json";
  std::string out;
  if (test::run_command("node --version", &out) != 0) {
    ADD_FAILURE() << "GGUF oracle needs `node` on PATH (not found): " << out;
    return nullptr;
  }
  if (!std::filesystem::exists(pkg)) {
    ADD_FAILURE() << "GGUF oracle needs the npm package @huggingface/gguf in tests/oracles/node_modules "
                     "(run `npm ci` in tests/oracles); missing "
                  << pkg;
    return nullptr;
  }
  const int rc = test::run_command("node '" + script + "' '" + path + "' 2>&1", &out);
  if (rc != 0) {
    ADD_FAILURE() << "GGUF oracle failed on " << path << " (rc " << rc << "): " << out.substr(0, 2000);
    return nullptr;
  }
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "GGUF oracle printed no JSON: " << e.what() << " " << out.substr(0, 500);
    return nullptr;
  }
}

// Every metadata value (type, element type, value) and tensor-table entry of our reader equals the oracle's.
void expect_oracle_matches(const nlohmann::json& o, const GGUFReader& r) {
  ASSERT_TRUE(o.is_object()) << "no oracle output";
  ASSERT_EQ(o["metadata"].size(), r.metadata().size());
  for (const auto& [key, v] : r.metadata()) {
    ASSERT_TRUE(o["metadata"].contains(key)) << "oracle lacks " << key;
    const auto& e = o["metadata"][key];
    EXPECT_EQ(e["type"], static_cast<uint32_t>(v.type)) << key;
    if (v.type == GGUFValueType::ARRAY) {
      EXPECT_EQ(e["sub_type"], static_cast<uint32_t>(v.elem_type)) << key;
    }
    EXPECT_EQ(e["value"], v.value) << key;
  }
  ASSERT_EQ(o["tensors"].size(), r.tensors().size());
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const auto& t = r.tensors()[i];
    const auto& e = o["tensors"][i];
    EXPECT_EQ(e["name"], t.name);
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    EXPECT_EQ(e["shape"], nlohmann::json(ne)) << t.name;
    EXPECT_EQ(e["dtype"], static_cast<uint32_t>(t.type)) << t.name;
    EXPECT_EQ(e["offset"], t.offset) << t.name;
  }
}

}  // namespace gguf_testing

}  // namespace bp
