// LoRA merge (W + scale·B·A) against a plain reference and an independent numpy oracle; merged
// folders reload with identical weights (f32) or the dtype's rounding (bf16), with tokenizer
// files copied.
#include <filesystem>
#include <fstream>

#include "export/merged_model.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/peft.h"
#include "model/weight_names.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config(const char* dtype) {
  nlohmann::json j = {{"architectures", {"Qwen2ForCausalLM"}},
                      {"vocab_size", 40},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"torch_dtype", dtype}};
  return ModelConfig::from_json(j, "tiny");
}

LoraAdapter trained_adapter(const ModelConfig& c, LoraConfig lc, uint64_t seed) {
  LoraAdapter ad = init_lora(c, lc, seed);
  uint64_t s = seed * 100;
  for (LoraLayer& l : ad.layers)
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t)) l.b(t).copy_from(test::random_tensor(l.b(t).shape(), ++s));
  return ad;
}

LoraConfig lora_config(int64_t r, float alpha, std::vector<std::string> targets) {
  LoraConfig lc;
  lc.r = r;
  lc.alpha = alpha;
  lc.target_modules = std::move(targets);
  return lc;
}

// W + scale·B·A in double, plainly.
std::vector<float> reference_merge(const Tensor& W, const Tensor& A, const Tensor& B, double scale) {
  const int64_t out = W.dim(0), in = W.dim(1), r = A.dim(0);
  std::vector<float> w = W.to_vector(), a = A.to_vector(), b = B.to_vector(), res(w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += double(b[o * r + k]) * a[k * in + i];
      res[o * in + i] = static_cast<float>(w[o * in + i] + scale * acc);
    }
  return res;
}

void run_oracle(const std::string& base, const std::string& adapter, const std::string& merged, double tol) {
  const std::string script = test::source_dir() + "/tests/model/merge_oracle.py";
  std::string out;
  const int rc =
      test::run_command(fmt::format("/usr/bin/python3 {} {} {} {} {}", script, base, adapter, merged, tol), &out);
  ASSERT_EQ(rc, 0) << "numpy merge oracle failed (it needs /usr/bin/python3 with numpy):\n" << out;
  EXPECT_EQ(out.rfind("OK ", 0), 0u) << out;
}

}  // namespace

TEST(Merge, MatchesPlainFormulaAndLeavesBaseAlone) {
  ModelConfig c = tiny_config("float32");
  ModelWeights base = init_random_weights(c, 1);
  LoraConfig lc = lora_config(3, 5, {"q_proj", "k_proj", "o_proj", "up_proj", "down_proj"});
  lc.use_rslora = true;
  LoraAdapter ad = trained_adapter(c, lc, 2);
  const std::vector<float> q_before = base.layers[1].q.to_vector();
  ModelWeights m = merge_lora(base, ad);
  EXPECT_EQ(base.layers[1].q.to_vector(), q_before);  // base untouched
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : kAllLoraTargets) {
      const WeightRole role = lora_target_role(t);
      const Tensor &W = weight_ref(base, role, int64_t(li)), &M = weight_ref(m, role, int64_t(li));
      if (ad.layers[li].has(t)) {
        EXPECT_TRUE(test::all_close(
            M.to_vector(), reference_merge(W, ad.layers[li].a(t), ad.layers[li].b(t), lc.scale()), test::kTolF32))
            << lora_target_name(t);
        EXPECT_NE(M.to_vector(), W.to_vector());
      } else {
        EXPECT_EQ(M.raw(), W.raw()) << lora_target_name(t);  // shared, not copied
      }
    }
  EXPECT_EQ(m.layers[0].q_bias.raw(), base.layers[0].q_bias.raw());  // biases untouched
}

// A base held narrower for training (--base-dtype bf16 or q8_0; auto on a CPU with bf16 dot
// products) merges in f32: its held values widened, then W + scale·B·A, as the plain formula over the
// widened weights gives. (Before, merging into a held bf16 base stopped with RUNTIME_EXPORT_FAILED.)
TEST(Merge, AHeldBaseIsWidenedToF32AndMerged) {
  ModelConfig c = tiny_config("float32");
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"all-linear"};
  const LoraAdapter ad = trained_adapter(c, lc, 4);
  for (DType held : {DType::BF16, DType::Q8_0}) {
    ModelWeights base = init_random_weights(c, 1);
    hold_weights(base, held);
    ModelWeights m = merge_lora(base, ad);
    for (size_t li = 0; li < 2; ++li)
      for (LoraTarget t : kAllLoraTargets) {
        const WeightRole role = lora_target_role(t);
        const Tensor &W = weight_ref(base, role, int64_t(li)), &M = weight_ref(m, role, int64_t(li));
        ASSERT_EQ(M.dtype(), DType::F32) << dtype_name(held) << " " << lora_target_name(t);
        EXPECT_TRUE(test::all_close(
            M.to_vector(), reference_merge(W, ad.layers[li].a(t), ad.layers[li].b(t), lc.scale()), test::kTolF32))
            << dtype_name(held) << " " << lora_target_name(t);
      }
  }
}

// DoRA's merge (PEFT's): W' = (m / ||W + s·B·A||_row) ⊙ (W + s·B·A), against the plain merge
// rescaled row by row in double here.
TEST(Merge, DoraScalesEachMergedRowToItsMagnitude) {
  ModelConfig c = tiny_config("float32");
  ModelWeights base = init_random_weights(c, 2);
  LoraConfig lc = lora_config(3, 6, {"q_proj", "up_proj"});
  lc.use_dora = true;
  LoraAdapter ad = trained_adapter(c, lc, 4);
  test::randomize_dora_magnitudes(ad, 40);
  const ModelWeights m = merge_lora(base, ad);
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : {LoraTarget::Q, LoraTarget::Up}) {
      const Tensor& W = weight_ref(base, lora_target_role(t), static_cast<int64_t>(li));
      std::vector<float> ref = reference_merge(W, ad.layers[li].a(t), ad.layers[li].b(t), ad.config.scale());
      const int64_t out = W.dim(0), in = W.dim(1);
      const std::vector<float> mag = ad.layers[li].m(t).to_vector();
      for (int64_t o = 0; o < out; ++o) {
        double n = 0;
        for (int64_t i = 0; i < in; ++i) n += double(ref[o * in + i]) * ref[o * in + i];
        for (int64_t i = 0; i < in; ++i) ref[o * in + i] = static_cast<float>(ref[o * in + i] * mag[o] / std::sqrt(n));
      }
      const std::vector<float> got = weight_ref(m, lora_target_role(t), static_cast<int64_t>(li)).to_vector();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], 1e-6 + 1e-5 * std::fabs(ref[i])) << lora_target_name(t) << " " << i;
    }
}

TEST(Merge, FreshAdapterChangesNothing) {
  ModelConfig c = tiny_config("float32");
  ModelWeights base = init_random_weights(c, 1);
  LoraConfig lc;
  lc.target_modules = {"all-linear"};
  ModelWeights m = merge_lora(base, init_lora(c, lc, 3));  // B = 0
  for (const auto& [role, layer] : model_roles(c))
    EXPECT_EQ(weight_ref(m, role, layer).to_vector(), weight_ref(base, role, layer).to_vector());
}

TEST(Merge, AdapterThatDoesNotFitFails) {
  ModelConfig c = tiny_config("float32");
  ModelWeights base = init_random_weights(c, 1);
  ModelConfig other = c;
  other.intermediate_size = 32;
  LoraConfig lc;
  lc.target_modules = {"down_proj"};
  try {
    merge_lora(base, init_lora(other, lc, 1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_EXPORT_FAILED);
    EXPECT_NE(std::string(e.what()).find("layer 0 down_proj"), std::string::npos) << e.what();
  }
  other = c;
  other.num_layers = 3;
  EXPECT_THROW(merge_lora(base, init_lora(other, lc, 1)), Error);
}

TEST(Merge, ExportF32ReloadsIdenticallyAndPassesOracle) {
  test::TempDir tmp;
  const std::string base_dir = tmp.path + "/base", ad_dir = tmp.path + "/adapter", out_dir = tmp.path + "/merged";
  ModelConfig c = tiny_config("float32");
  ModelWeights base = init_random_weights(c, 4);
  save_hf_model(base, base_dir);
  std::ofstream(base_dir + "/tokenizer.json") << R"({"model": {"type": "BPE"}})";
  std::ofstream(base_dir + "/tokenizer_config.json") << R"({"chat_template": "x"})";
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = trained_adapter(c, lc, 5);
  save_peft_adapter(ad, ad_dir);

  auto files = export_merged_model(base, load_peft_adapter(ad_dir, c), base_dir, out_dir);
  EXPECT_NE(std::find(files.begin(), files.end(), "tokenizer.json"), files.end());
  EXPECT_TRUE(fs::exists(out_dir + "/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(out_dir + "/special_tokens_map.json"));
  ModelWeights back = load_model(out_dir);
  EXPECT_EQ(back.config.torch_dtype, DType::F32);
  EXPECT_EQ(back.config.arch, Arch::Qwen2);
  ModelWeights m = merge_lora(base, ad);
  for (const auto& [role, layer] : model_roles(c))
    EXPECT_EQ(weight_ref(back, role, layer).to_vector(), weight_ref(m, role, layer).to_vector())
        << hf_name(role, layer);
  run_oracle(base_dir, ad_dir, out_dir, 1e-6);
}

TEST(Merge, ExportKeepsBaseDtypeAndShards) {
  test::TempDir tmp;
  const std::string base_dir = tmp.path + "/base", ad_dir = tmp.path + "/adapter", out_dir = tmp.path + "/merged";
  ModelConfig c = tiny_config("bfloat16");
  // A bf16 base: its f32 values are exactly representable, as after loading a bf16 file.
  ModelWeights base = init_random_weights(c, 6);
  save_hf_model(base, base_dir);
  base = load_model(base_dir);
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"q_proj", "v_proj"};
  LoraAdapter ad = trained_adapter(c, lc, 7);
  save_peft_adapter(ad, ad_dir);
  SaveModelOptions o;
  o.max_shard_bytes = 2000;
  export_merged_model(base, ad, base_dir, out_dir, o);
  EXPECT_TRUE(fs::exists(out_dir + "/model.safetensors.index.json"));
  SafetensorsReader r = SafetensorsReader::open_model(out_dir);
  EXPECT_EQ(r.entry("model.layers.0.self_attn.q_proj.weight").dtype_str, "BF16");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out_dir + "/config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  ModelWeights back = load_model(out_dir);
  ModelWeights m = merge_lora(base, ad);
  for (const auto& [role, layer] : model_roles(c))  // the merged f32 values rounded once to bf16
    EXPECT_EQ(weight_ref(back, role, layer).to_vector(), weight_ref(m, role, layer).to(DType::BF16).to_vector());
  run_oracle(base_dir, ad_dir, out_dir, 8e-3);  // bf16 rounding: 2^-8 relative
}

TEST(Merge, Stories260KExportReloads) {
  const std::string src = test::shared_dir() + "/models/stories260K";
  ModelWeights base = load_model(src);
  LoraConfig lc;
  lc.r = 8;
  lc.alpha = 16;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = trained_adapter(base.config, lc, 9);
  test::TempDir tmp;
  save_peft_adapter(ad, tmp.path + "/adapter");
  export_merged_model(base, ad, src, tmp.path + "/merged");
  ModelWeights back = load_model(tmp.path + "/merged");
  ModelWeights m = merge_lora(base, ad);
  for (const auto& [role, layer] : model_roles(base.config))
    EXPECT_EQ(weight_ref(back, role, layer).to_vector(), weight_ref(m, role, layer).to_vector());
  std::ifstream a(src + "/tokenizer.json"), b(tmp.path + "/merged/tokenizer.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));
  EXPECT_TRUE(fs::exists(tmp.path + "/merged/generation_config.json"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tmp.path + "/merged/config.json"));
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["rms_norm_eps"], 1e-5);
  run_oracle(src, tmp.path + "/adapter", tmp.path + "/merged", 1e-6);
}

}  // namespace bp
