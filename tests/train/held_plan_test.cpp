// Memory of frozen weights held quantized (model.base_dtype, model/held_weights.h):
//  - a model folder loaded with --base-dtype q8_0 / q4_k / bf16 really holds those bytes: the CPU
//    allocator's live bytes after loading equal the plan's weights group, a fraction of f32, and
//    loading never holds the whole model in f32 (peak = held bytes + about one f32 tensor);
//  - the Llama-3-8B LoRA plan (its config.json shape) at q4_k, sequence 2048, micro-batch 1 is
//    under 8 GiB; at f32 it is not;
//  - estimate-vram's search offers the quantized base as a fix: the 16 GiB Llama-3-8B run
//    that used to get "No change of these settings fits" now gets --base-dtype.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "support/test_util.h"
#include "train/estimate.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

nlohmann::json llama3_8b_json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128256},
          {"hidden_size", 4096},
          {"intermediate_size", 14336},
          {"num_hidden_layers", 32},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"max_position_embeddings", 8192},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"}};
}

ModelConfig config_in(const TempDir& dir, const nlohmann::json& j) {
  std::ofstream(fs::path(dir.path) / "config.json") << j.dump(2);
  return load_model_config(dir.path);
}

// A random model (hidden 256, so q4_K needs no fallback except the 384-wide MLP input) written as a
// Hugging Face folder.
ModelConfig write_random_model(const TempDir& dir) {
  nlohmann::json j = llama3_8b_json();
  j["vocab_size"] = 300;
  j["hidden_size"] = 256;
  j["intermediate_size"] = 384;  // down_proj rows of 384: not whole q4_K blocks -> q5_0
  j["num_hidden_layers"] = 2;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  const ModelConfig cfg = config_in(dir, j);
  const ModelWeights w = init_random_weights(cfg, 3);
  NamedTensors named;
  for (const auto& [role, layer] : model_roles(cfg))
    named.emplace_back(hf_name(role, layer), weight_ref(w, role, layer));
  write_safetensors_model(dir.path, named);
  return cfg;
}

TEST(HeldPlan, LoadedHeldWeightsTakeThePlannedBytesNotAnF32Copy) {
  TempDir dir;
  const ModelConfig cfg = write_random_model(dir);
  const size_t f32_bytes = held_weight_bytes(cfg, DType::F32);
  size_t largest = 0;
  for (const auto& [role, layer] : model_roles(cfg))
    largest = std::max<size_t>(largest, role_shape(cfg, role).numel() * 4);
  for (DType base : {DType::Q8_0, DType::Q4_K, DType::BF16}) {
    SCOPED_TRACE(dtype_name(base));
    Allocator& a = cpu_allocator();
    const size_t before = a.stats().bytes_in_use;
    a.reset_peak();
    std::vector<std::string> notes;
    ModelWeights w = load_model(dir.path, base, &notes);
    const size_t live = a.stats().bytes_in_use - before, peak = a.stats().bytes_peak - before;
    const size_t planned = held_weight_bytes(cfg, base);
    EXPECT_EQ(resident_weight_bytes(w), planned);
    EXPECT_EQ(live, planned);  // nothing else stays: no f32 shadow copy
    EXPECT_LT(peak, planned + 2 * largest) << "loading held the model in f32";
    EXPECT_EQ(w.layers[0].q.dtype(), base);
    EXPECT_EQ(w.embed.dtype(), base);
    EXPECT_EQ(w.layers[0].input_norm.dtype(), DType::F32);
    if (base == DType::Q4_K) {
      EXPECT_EQ(w.layers[0].down.dtype(), DType::Q5_0);
      ASSERT_EQ(notes.size(), 1u);
      EXPECT_NE(notes[0].find("held as q5_0"), std::string::npos) << notes[0];
    } else {
      EXPECT_TRUE(notes.empty());
    }
    // q8_0 is 34 bytes per 32 values, q4_K 144 per 256 (q5_0 22 per 32), bf16 2 per value.
    const double ratio = static_cast<double>(planned) / static_cast<double>(f32_bytes);
    const double bound = base == DType::Q8_0 ? 34.0 / 128.0 + 0.01 : base == DType::Q4_K ? 0.17 : 0.5 + 0.01;
    EXPECT_LT(ratio, bound);
    EXPECT_GT(ratio, bound - 0.1);
  }
  EXPECT_EQ(load_model(dir.path).layers[0].q.dtype(), DType::F32);  // the default stays f32
}

TEST(HeldPlan, Llama3_8B_LoraAtQ4KPlansUnder8GiB) {
  TempDir dir;
  const ModelConfig cfg = config_in(dir, llama3_8b_json());
  EstimateRequest r;
  r.lora.r = 16;
  r.batch_size = 1;
  r.micro_batch_size = 1;
  r.max_seq_length = 2048;
  r.limit_bytes = size_t{8} << 30;
  r.weights_dtype = DType::Q4_K;
  const Estimate q4 = estimate_memory(cfg, r);
  EXPECT_TRUE(q4.fits) << q4.to_json().dump(2);
  EXPECT_LT(q4.plan.total(), size_t{8} << 30);
  // Every linear weight and the embedding / head are whole q4_K blocks at 4.5 bits per value.
  EXPECT_EQ(q4.plan.weights, held_weight_bytes(cfg, DType::Q4_K));
  EXPECT_LT(q4.plan.weights, static_cast<size_t>(8030261248.0 * 4.5 / 8.0) + (size_t{1} << 20));
  r.weights_dtype = DType::F32;
  const Estimate f32 = estimate_memory(cfg, r);
  EXPECT_FALSE(f32.fits);
  EXPECT_GT(f32.plan.weights, size_t{29} << 30);
}

TEST(HeldPlan, EstimateOffersTheQuantizedBaseAsAFix) {
  TempDir dir;
  const ModelConfig cfg = config_in(dir, llama3_8b_json());
  EstimateRequest r;  // defaults: LoRA r 16, batch 8, micro-batch auto, sequence 2048, f32
  r.limit_bytes = size_t{16} << 30;
  const Estimate e = estimate_memory(cfg, r);
  EXPECT_FALSE(e.fits);
  ASSERT_TRUE(e.has_fix);
  EXPECT_TRUE(e.fix.fits) << e.to_json().dump(2);
  EXPECT_NE(e.fix.flags.find("--base-dtype"), std::string::npos) << e.fix.flags;
  bool offered = false;
  for (const auto& c : e.tried) offered |= c.kind == "base_dtype";
  EXPECT_TRUE(offered);
  // With a micro-batch of one the quantized base alone is the fix: q8_0 when it fits, else q4_k.
  r.micro_batch_size = 1;
  const Estimate one = estimate_memory(cfg, r);
  ASSERT_TRUE(one.has_fix);
  EXPECT_EQ(one.fix.kind, "base_dtype");
  EXPECT_EQ(one.fix.flags, "--base-dtype q8_0");
  r.limit_bytes = size_t{7} << 30;
  const Estimate seven = estimate_memory(cfg, r);
  ASSERT_TRUE(seven.has_fix);
  EXPECT_EQ(seven.fix.kind, "base_dtype");
  EXPECT_EQ(seven.fix.flags, "--base-dtype q4_k");
}

}  // namespace
}  // namespace bp::test
