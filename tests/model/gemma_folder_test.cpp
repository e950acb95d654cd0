// Gemma 3 end to end on the CPU: a tiny Gemma3ForCausalLM folder (config.json with transformers'
// Gemma keys, safetensors, the stories260K tokenizer) loads back to the same config and the same
// weights; `backprop train` fine-tunes it with LoRA and in full, and `export --format merged`
// writes a folder that loads back as the same architecture with the trained weights.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/loader.h"
#include "model/merge.h"
#include "model/model_test_helpers.h"
#include "model/weight_names.h"

namespace bp::test {
namespace {

ModelConfig tiny_gemma3() {
  TinySpec s;
  s.arch = Arch::Gemma3;
  s.vocab = 512;  // the stories tokenizer's
  s.layers = 3;
  s.head_dim = 16;
  s.sliding_window = 8;
  s.linear_rope = 4.0f;
  s.bf16 = true;
  return tiny_config(s);
}

std::string write_folder(const TempDir& dir) {
  const ModelConfig c = tiny_gemma3();
  SaveModelOptions so;
  so.copy_files_from = shared_dir() + "/models/stories260K";
  save_hf_model(tiny_weights(c, 21), dir.path + "/gemma3", so);
  return dir.path + "/gemma3";
}

TEST(GemmaFolder, SavedFolderLoadsBackTheSame) {
  TempDir dir;
  const std::string folder = write_folder(dir);
  const ModelConfig c = tiny_gemma3();
  const ModelWeights w = tiny_weights(c, 21);
  const ModelWeights back = load_model(folder);
  const ModelConfig& b = back.config;
  EXPECT_EQ(b.arch, Arch::Gemma3);
  EXPECT_EQ(b.model_type, "gemma3_text");
  EXPECT_EQ(b.layer_windows, c.layer_windows);
  EXPECT_EQ(b.embed_scale, c.embed_scale);
  EXPECT_EQ(b.rope.linear_factor, 4.0f);
  EXPECT_EQ(b.rope_local.theta, c.rope_local.theta);
  EXPECT_EQ(b.attention_scale, c.attention_scale);
  std::ifstream f(folder + "/model.safetensors");
  ASSERT_TRUE(f.good());
  // Written as bfloat16 (the config's torch_dtype): each weight comes back as its bf16 rounding.
  for (const auto& [role, layer] : model_roles(c)) {
    std::vector<float> want = weight_ref(w, role, layer).to_vector();
    for (float& x : want) x = bf16_to_f32(f32_to_bf16(x));
    EXPECT_EQ(weight_ref(back, role, layer).to_vector(), want) << hf_name(role, layer);
  }
}

// `train` reads the folder, trains, and the merged export is a Gemma 3 folder again.
TEST(GemmaFolder, TrainAndExportMergedOnTheCpu) {
  TempDir dir;
  const std::string folder = write_folder(dir);
  const std::string data = dir.path + "/data.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily saw a bird number " << i << ". It was happy.\"}\n";
  }
  for (const char* mode : {"--mode lora --lora-r 4", "--mode full"}) {
    SCOPED_TRACE(mode);
    const std::string run = dir.path + "/runs-" + std::string(mode).substr(7, 4);
    std::string out;
    ASSERT_EQ(run_command(backprop_exe() + " train --device cpu --model " + folder + " --data " + data +
                              " --batch-size 4 --micro-batch-size 4 --steps 2 " + mode +
                              " --max-seq-length 32 --threads 1 --save-every 0 --output " + run + " 2>&1",
                          &out),
              0)
        << out;
    std::string run_dir;
    for (const auto& e : std::filesystem::directory_iterator(run)) run_dir = e.path().string();
    ASSERT_FALSE(run_dir.empty()) << out;
    ASSERT_EQ(
        run_command(backprop_exe() + " export " + run_dir + " --format merged --output " + run + "/merged 2>&1", &out),
        0)
        << out;
    const ModelWeights merged = load_model(run + "/merged");
    EXPECT_EQ(merged.config.arch, Arch::Gemma3);
    EXPECT_EQ(merged.config.layer_windows, tiny_gemma3().layer_windows);
    EXPECT_TRUE(merged.layers[0].post_ffn_norm.defined());
    // Training changed the weights (the q projection in both modes).
    EXPECT_NE(merged.layers[0].q.to_vector(), load_model(folder).layers[0].q.to_vector());
  }
}

}  // namespace
}  // namespace bp::test
