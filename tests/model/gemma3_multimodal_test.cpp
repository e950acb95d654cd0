// The text model of Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration: Gemma 3
// 4B/12B/27B): config.json nests the text settings under text_config without the keys equal to
// Gemma3TextConfig's defaults, and the weights live under language_model.model. (Google's files,
// transformers < 4.52) or model.language_model. (transformers >= 4.52), beside the vision tower.
// A tiny such folder loads as the same model as a Gemma3ForCausalLM folder with the same weights
// (same loss), holds no byte of the vision tower, trains, saves its PEFT adapter with the names
// PEFT gives on the multimodal model, and exports merged as a text-only Gemma3ForCausalLM.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "core/allocator.h"
#include "core/file_read.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/model_test_helpers.h"
#include "model/peft.h"
#include "model/weight_names.h"

namespace bp::test {
namespace {

// google/gemma-3-4b-it's config.json, as published (vision_config shortened).
nlohmann::json gemma3_4b_config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "model_type": "siglip_vision_model"}})");
}

TEST(Gemma3Multimodal, TextConfigTakesGemma3TextConfigDefaults) {
  const ModelConfig c = ModelConfig::from_json(gemma3_4b_config(), "gemma-3-4b-it/config.json");
  EXPECT_TRUE(c.multimodal_text);
  EXPECT_EQ(c.arch, Arch::Gemma3);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_layers, 34);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);  // Gemma3TextConfig's default, not num_attention_heads
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope.theta, 1.0e6f);
  EXPECT_EQ(c.rope.linear_factor, 8.0f);
  EXPECT_EQ(c.rope_local.theta, 1.0e4f);
  EXPECT_EQ(c.attention_scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, DType::BF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 106}));
  EXPECT_EQ(c.bos_token_id, 2);
  ASSERT_EQ(c.layer_windows.size(), 34u);  // every 6th layer global (sliding_window_pattern 6)
  for (size_t l = 0; l < 34; ++l) EXPECT_EQ(c.layer_windows[l], (l + 1) % 6 == 0 ? 0 : 1024) << l;
  // Written back (merged export) as the text-only model.
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Gemma3ForCausalLM"}));
  EXPECT_EQ(j["model_type"], "gemma3_text");
  EXPECT_FALSE(j.contains("text_config"));
  EXPECT_FALSE(j.contains("vision_config"));
  const ModelConfig back = ModelConfig::from_json(j, "exported");
  EXPECT_FALSE(back.multimodal_text);
  EXPECT_EQ(back.layer_windows, c.layer_windows);
  EXPECT_EQ(back.num_kv_heads, 4);
}

ModelConfig tiny_text() {
  TinySpec s;  // hidden 32, head_dim 8, GQA 4/2
  s.arch = Arch::Gemma3;
  s.theta = 1.0e6f;  // Gemma3TextConfig's default: left out of text_config below
  s.vocab = 512;     // the stories tokenizer's
  s.layers = 4;
  s.sliding_window = 5;
  return tiny_config(s);
}

// The multimodal folder of `w`: text_config without the keys at Gemma3TextConfig's defaults, the
// text model's weights under `layout`'s prefix, and vision-tower tensors of `vision_floats` floats.
void write_multimodal(const ModelWeights& w, const std::string& dir, MultimodalLayout layout, int64_t vision_floats) {
  std::filesystem::create_directories(dir);
  nlohmann::json text = w.config.to_json();
  for (const char* k : {"architectures", "rope_theta", "tie_word_embeddings", "torch_dtype", "rope_scaling",
                        "bos_token_id", "eos_token_id"})
    text.erase(k);
  text["model_type"] = "gemma3_text";
  const nlohmann::json cfg = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                              {"model_type", "gemma3"},
                              {"torch_dtype", "float32"},
                              {"text_config", text},
                              {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  NamedTensors ts;
  const std::string tower = layout == MultimodalLayout::LanguageModelModel ? "" : "model.";
  ts.emplace_back(tower + "vision_tower.vision_model.embeddings.patch_embedding.weight",
                  random_tensor({vision_floats}, 3));
  ts.emplace_back(tower + "multi_modal_projector.mm_input_projection_weight", random_tensor({64, 32}, 4));
  for (const auto& [name, t] : named_hf_weights(w)) ts.emplace_back(multimodal_hf_name(name, layout), t);
  write_safetensors(dir + "/model.safetensors", ts);
  for (const std::string& f : tokenizer_file_names())
    if (std::filesystem::exists(shared_dir() + "/models/stories260K/" + f))
      std::filesystem::copy_file(shared_dir() + "/models/stories260K/" + f, dir + "/" + f);
}

// Bytes the CPU allocator holds for the weights a load returns.
size_t loaded_bytes(const std::string& folder, ModelWeights* out) {
  const size_t before = cpu_allocator().stats().bytes_in_use;
  cpu_allocator().reset_peak();
  *out = load_model(folder);
  EXPECT_EQ(cpu_allocator().stats().bytes_peak, cpu_allocator().stats().bytes_in_use) << folder;
  return cpu_allocator().stats().bytes_in_use - before;
}

TEST(Gemma3Multimodal, LoadsAsTheTextModelInBothLayoutsWithTheSameLoss) {
  TempDir dir;
  const ModelWeights w = tiny_weights(tiny_text(), 31);
  save_hf_model(w, dir.path + "/text");
  ModelWeights text;
  const size_t text_bytes = loaded_bytes(dir.path + "/text", &text);
  Model text_model(std::move(text), ModelOptions{TrainMode::Frozen});
  const Batch batch = tiny_batch(512, 7);
  const double want = text_model.forward_loss(batch).loss_sum;
  for (MultimodalLayout layout : {MultimodalLayout::LanguageModelModel, MultimodalLayout::ModelLanguageModel}) {
    const std::string folder = dir.path + "/mm" + std::to_string(static_cast<int>(layout));
    write_multimodal(w, folder, layout, int64_t{1} << 20);  // a 4 MB vision tower
    ModelWeights mm;
    // The vision tower is never read: the load holds exactly the text model's bytes, at its peak too.
    EXPECT_EQ(loaded_bytes(folder, &mm), text_bytes);
    EXPECT_TRUE(mm.config.multimodal_text);
    EXPECT_EQ(mm.config.layer_windows, w.config.layer_windows);
    EXPECT_EQ(mm.config.rope.theta, w.config.rope.theta);
    for (const auto& [role, layer] : model_roles(w.config))
      EXPECT_EQ(weight_ref(mm, role, layer).to_vector(), weight_ref(w, role, layer).to_vector())
          << hf_name(role, layer);
    Model m(std::move(mm), ModelOptions{TrainMode::Frozen});
    EXPECT_EQ(m.forward_loss(batch).loss_sum, want);
  }
  // A multimodal config whose files hold neither prefix names both.
  write_multimodal(w, dir.path + "/bad", MultimodalLayout::ModelLanguageModel, 16);
  NamedTensors plain = named_hf_weights(w);
  write_safetensors(dir.path + "/bad/model.safetensors", plain);
  try {
    load_model(dir.path + "/bad");
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("language_model.model.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

TEST(Gemma3Multimodal, PeftAdapterHasTheMultimodalModelsModuleNames) {
  TempDir dir;
  ModelConfig cfg = tiny_text();
  cfg.multimodal_text = true;
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"q_proj", "down_proj"};
  LoraAdapter ad = init_lora(cfg, lc, 5);
  for (auto& l : ad.layers)
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t)) l.b(t) = random_tensor(l.b(t).shape(), 9);
  save_peft_adapter(ad, dir.path + "/a");
  const SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/a/adapter_model.safetensors");
  EXPECT_TRUE(r.contains("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.language_model.layers.2.mlp.down_proj.lora_B.weight"));
  EXPECT_EQ(r.names().size(), static_cast<size_t>(2 * 2 * cfg.num_layers));  // q and down, A and B
  // target_modules: a pattern PEFT full-matches against module paths, the text model's only.
  const nlohmann::json j =
      read_json_file_capped(dir.path + "/a/adapter_config.json", FileKind::Config, {"t", ErrorCode::RUNTIME_INTERNAL});
  ASSERT_TRUE(j["target_modules"].is_string()) << j.dump();
  const std::regex re(j["target_modules"].get<std::string>());
  EXPECT_TRUE(std::regex_match("model.language_model.layers.0.self_attn.q_proj", re));
  EXPECT_TRUE(std::regex_match("language_model.model.layers.11.mlp.down_proj", re));
  EXPECT_FALSE(std::regex_match("model.language_model.layers.0.self_attn.k_proj", re));
  EXPECT_FALSE(std::regex_match("model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj", re));
  // Read back, and in the older layout (PEFT on transformers < 4.52) too.
  NamedTensors older;
  for (const std::string& n : r.names()) {
    std::string o = n;
    o.replace(0, std::string("base_model.model.model.language_model.").size(),
              "base_model.model.language_model.model.");
    older.emplace_back(o, r.read(n, Shape(r.entry(n).shape)));
  }
  std::filesystem::create_directories(dir.path + "/old");
  std::filesystem::copy_file(dir.path + "/a/adapter_config.json", dir.path + "/old/adapter_config.json");
  write_safetensors(dir.path + "/old/adapter_model.safetensors", older);
  for (const char* sub : {"/a", "/old"}) {
    const LoraAdapter back = load_peft_adapter(dir.path + sub, cfg);
    EXPECT_TRUE(back.config.multimodal_text);
    for (size_t l = 0; l < ad.layers.size(); ++l)
      for (LoraTarget t : kAllLoraTargets) {
        ASSERT_EQ(back.layers[l].has(t), ad.layers[l].has(t)) << sub;
        if (!ad.layers[l].has(t)) continue;
        EXPECT_EQ(back.layers[l].a(t).to_vector(), ad.layers[l].a(t).to_vector()) << sub;
        EXPECT_EQ(back.layers[l].b(t).to_vector(), ad.layers[l].b(t).to_vector()) << sub;
      }
  }
}

// `train` fine-tunes the text model with LoRA; the adapter is named for the multimodal model and
// the merged export is a text-only Gemma3ForCausalLM with the trained weights.
TEST(Gemma3Multimodal, TrainsWithLoraAndExportsTheTextModelMerged) {
  TempDir dir;
  const ModelWeights w = tiny_weights(tiny_text(), 31);
  const std::string folder = dir.path + "/mm";
  write_multimodal(w, folder, MultimodalLayout::LanguageModelModel, 64);
  const std::string data = dir.path + "/data.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily saw a bird number " << i << ". It was happy.\"}\n";
  }
  const std::string run = dir.path + "/runs";
  std::string out;
  ASSERT_EQ(run_command(backprop_exe() + " train --device cpu --model " + folder + " --data " + data +
                            " --batch-size 4 --micro-batch-size 4 --steps 2 --mode lora --lora-r 4 --max-seq-length 32"
                            " --threads 1 --save-every 0 --output " +
                            run + " 2>&1",
                        &out),
            0)
      << out;
  std::string run_dir;
  for (const auto& e : std::filesystem::directory_iterator(run)) run_dir = e.path().string();
  ASSERT_FALSE(run_dir.empty()) << out;
  const SafetensorsReader r = SafetensorsReader::open_file(run_dir + "/adapter/adapter_model.safetensors");
  EXPECT_TRUE(r.contains("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"));
  ASSERT_EQ(
      run_command(backprop_exe() + " export " + run_dir + " --format merged --output " + run + "/merged 2>&1", &out), 0)
      << out;
  const ModelWeights merged = load_model(run + "/merged");
  EXPECT_FALSE(merged.config.multimodal_text);
  EXPECT_EQ(merged.config.architecture_name, "Gemma3ForCausalLM");
  EXPECT_EQ(merged.config.layer_windows, w.config.layer_windows);
  EXPECT_NE(merged.layers[0].q.to_vector(), w.layers[0].q.to_vector());
  EXPECT_EQ(merged.layers[0].input_norm.to_vector(), w.layers[0].input_norm.to_vector());
}

}  // namespace
}  // namespace bp::test
