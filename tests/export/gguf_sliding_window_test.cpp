// The sliding-window metadata of our GGUF exports, read by an independent reader
// (@huggingface/gguf, tests/oracles/gguf_read.mjs), against what llama.cpp writes and reads:
//  - convert_hf_to_gguf.py Phi3MiniModel writes phi3.attention.sliding_window always, 0 for a
//    config without one (Phi-4-mini: "use zero value of sliding_window to distinguish Phi-4");
//  - Gemma2Model writes gemma2.attention.sliding_window, Gemma3Model gemma3.attention.sliding_window
//    (unless sliding_window_pattern is 1); neither writes a per-layer key: llama-model.cpp takes the
//    pattern from the architecture (set_swa_pattern(2) for Gemma 2, 6 for Gemma 3: layer il slides
//    when il % n < n - 1). Our {arch}.attention.sliding_window_pattern (one bool per layer, the
//    key llama.cpp's converters write for per-layer windows) must say the same;
//  - LlamaModel (Mistral) writes no window: llama.cpp's llama architecture has none. We write
//    llama.attention.sliding_window (a key llama.cpp does not read for llama) so that our GGUF reader
//    gives the Mistral model back; the value must be config.json's.
// The values are UINT32 (gguf-py's add_sliding_window) and the pattern an ARRAY of BOOL.
#include <gtest/gtest.h>

#include "export/gguf_export.h"
#include "model/model_test_helpers.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"

namespace bp {
namespace {

constexpr int kUint32 = 4, kBool = 7, kArray = 9;  // GGUF value types (gguf.md)

nlohmann::json exported_metadata(const ModelWeights& w, const test::TempDir& dir, const std::string& name) {
  const std::string path = dir.path + "/" + name + ".gguf";
  export_gguf(w, test::shared_dir() + "/models/stories260K", GGUFQuant::F32, path);
  return gguf_testing::oracle_read(path)["metadata"];
}

void expect_window(const nlohmann::json& md, const std::string& arch, int64_t window) {
  const std::string key = arch + ".attention.sliding_window";
  ASSERT_TRUE(md.contains(key)) << key;
  EXPECT_EQ(md[key]["type"], kUint32) << key;
  EXPECT_EQ(md[key]["value"], window) << key;
}

// llama.cpp's set_swa_pattern(n): layer il has the window when il % n < n - 1.
std::vector<bool> llama_cpp_pattern(int64_t layers, int64_t n) {
  std::vector<bool> v;
  for (int64_t il = 0; il < layers; ++il) v.push_back(il % n < n - 1);
  return v;
}

test::TinySpec tiny(Arch arch, int64_t layers, int64_t window) {
  test::TinySpec s;
  s.arch = arch;
  s.vocab = 512;  // the stories tokenizer's
  s.layers = layers;
  s.sliding_window = window;
  return s;
}

TEST(GGUFSlidingWindow, MistralGemmaAndPhi3KeysReadByAnIndependentReader) {
  test::TempDir dir;
  {  // Mistral: every layer windowed, no per-layer key.
    const ModelConfig c = test::tiny_config(tiny(Arch::Mistral, 2, 5));
    const nlohmann::json md = exported_metadata(test::tiny_weights(c, 1), dir, "mistral");
    expect_window(md, "llama", 5);
    EXPECT_FALSE(md.contains("llama.attention.sliding_window_pattern"));
  }
  {  // Llama: no window, no key.
    const ModelConfig c = test::tiny_config(tiny(Arch::Llama, 2, 0));
    const nlohmann::json md = exported_metadata(test::tiny_weights(c, 1), dir, "llama");
    EXPECT_FALSE(md.contains("llama.attention.sliding_window"));
  }
  for (int64_t window : {int64_t{7}, int64_t{0}}) {  // Phi-3 with a window; Phi-4-mini without (0)
    test::TinySpec s = tiny(Arch::Phi3, 2, 0);
    s.heads = 4, s.kv_heads = 4;
    s.hf = nlohmann::json::object();
    if (window > 0) s.hf["sliding_window"] = window;
    const ModelConfig c = test::tiny_config(s);
    const nlohmann::json md = exported_metadata(test::tiny_weights(c, 1), dir, "phi3-" + std::to_string(window));
    expect_window(md, "phi3", window);
    EXPECT_FALSE(md.contains("phi3.attention.sliding_window_pattern"));
  }
  // Gemma 2 (alternating from layer 0) and Gemma 3 (five sliding, one global) on 7 layers.
  for (auto [arch, name, n] : {std::tuple{Arch::Gemma2, "gemma2", 2}, std::tuple{Arch::Gemma3, "gemma3", 6}}) {
    SCOPED_TRACE(name);
    const ModelConfig c = test::tiny_config(tiny(arch, 7, 4));
    const nlohmann::json md = exported_metadata(test::tiny_weights(c, 1), dir, name);
    expect_window(md, name, 4);
    const std::string key = std::string(name) + ".attention.sliding_window_pattern";
    ASSERT_TRUE(md.contains(key));
    EXPECT_EQ(md[key]["type"], kArray);
    EXPECT_EQ(md[key]["sub_type"], kBool);
    EXPECT_EQ(md[key]["value"].get<std::vector<bool>>(), llama_cpp_pattern(7, n));
  }
}

}  // namespace
}  // namespace bp
