// Llama-3.1-style rope scaling through a GGUF file: llama.cpp keeps it only as rope_freqs.weight, so
// loading the GGUF as a model rebuilds rope_scaling from that tensor (hub/gguf_rope.h). A tiny
// synthetic model (head_dim 16, theta 500000: rotary wavelengths from 6 to 6e5 tokens, so high,
// blended and low frequencies all occur) is exported to an f32 GGUF and read back; at positions
// near 5000 its logits equal the Hugging Face config path's, and differ clearly without the scaling
// (so the check can fail). Both the canonical band (low 1, high 4, L 8192) and another one
// (L 1024, low 1, high 8: two blended frequencies, solved) are covered, and a rope_freqs that is
// no Llama-3 scaling is refused; Llama-3.1/3.2 shapes give exactly their own parameters; a
// rope_freqs of the wrong size (or a head_dim without rotary pairs) is refused before it is read.
#include "hub/gguf_rope.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "export/gguf_export.h"
#include "hub/gguf_source.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/expect_error.h"
#include "support/shaped_config.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string stories() {
  return test::shared_dir() + "/models/stories260K";
}

ModelConfig llama31_config(double factor, double low, double high, int original) {
  nlohmann::json j = test::stories_config_shaped(64, 4, 2, 16, 2, 128);
  j["rope_theta"] = 500000.0;
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", factor},
                       {"low_freq_factor", low},
                       {"high_freq_factor", high},
                       {"original_max_position_embeddings", original}};
  return ModelConfig::from_json(j, "llama31-test");
}

// Weights large enough that rotary angles move the logits visibly; norms near 1.
ModelWeights weights_for(const ModelConfig& c) {
  ModelWeights w;
  w.config = c;
  w.layers.resize(static_cast<size_t>(c.num_layers));
  uint64_t seed = 11;
  for (const auto& [role, layer] : model_roles(c)) {
    const bool norm = role == WeightRole::InputNorm || role == WeightRole::PostNorm || role == WeightRole::FinalNorm;
    weight_ref(w, role, layer) =
        test::random_tensor(role_shape(c, role), ++seed, norm ? 0.8f : -0.4f, norm ? 1.2f : 0.4f);
  }
  return w;
}

std::vector<float> logits_at_5000(ModelWeights w) {
  Model m(std::move(w), ModelOptions{TrainMode::Frozen});
  m.set_training(false);
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 56, 424, 263};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(5000 + 97 * i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

void expect_round_trip(double factor, double low, double high, int original, bool canonical) {
  SCOPED_TRACE(fmt::format("factor {} low {} high {} L {}", factor, low, high, original));
  test::TempDir d;
  const ModelConfig hf = llama31_config(factor, low, high, original);
  const std::string path = d.path + "/llama31.gguf";
  export_gguf(weights_for(hf), stories(), GGUFQuant::F32, path);
  ASSERT_NE(GGUFReader(path).find_tensor("rope_freqs.weight"), nullptr);

  const std::string folder = hub::gguf_model_folder(path, d.path + "/derived");
  const ModelConfig back = load_model_config(folder);
  ASSERT_TRUE(back.rope.llama3_scaling);
  EXPECT_FLOAT_EQ(back.rope.factor, static_cast<float>(factor));
  if (canonical) {
    EXPECT_FLOAT_EQ(back.rope.low_freq_factor, static_cast<float>(low));
    EXPECT_FLOAT_EQ(back.rope.high_freq_factor, static_cast<float>(high));
    EXPECT_EQ(back.rope.original_max_position, original);
  }
  EXPECT_TRUE(test::all_close(rope_inv_freq(back.rope), rope_inv_freq(hf.rope), {1e-6, 1e-7}));

  const std::vector<float> want = logits_at_5000(weights_for(hf));
  EXPECT_TRUE(test::all_close(logits_at_5000(load_model(folder)), want, {1e-4, 1e-4}));
  ModelConfig unscaled = hf;
  unscaled.rope.llama3_scaling = false;
  const std::vector<float> plain = logits_at_5000(weights_for(unscaled));
  double diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(static_cast<double>(want[i]) - plain[i]));
  EXPECT_GT(diff, 1e-2) << "rope scaling should matter at these positions";
}

TEST(GGUFRope, Llama31RopeFreqsRebuildTheScaling) {
  expect_round_trip(8, 1, 4, 8192, true);    // Llama-3.1's values: one blended frequency
  expect_round_trip(16, 1, 8, 1024, false);  // another band: two blended frequencies, solved
}

TEST(GGUFRope, RopeFreqsThatAreNoLlama3ScalingAreRefused) {
  test::TempDir d;
  const ModelConfig hf = llama31_config(8, 1, 4, 8192);
  GGUFWriter w;
  add_model_to_gguf(w, weights_for(hf), GGUFQuant::F32, "odd");
  // Replace the divisors by ones that fall and rise again (no monotone Llama-3 band).
  GGUFWriter odd;
  for (const auto& [k, v] : w.metadata()) odd.set(k, v);
  for (const auto& t : w.tensors())
    if (t.name != "rope_freqs.weight") odd.add_tensor(t);
  const std::vector<float> f = {1, 3, 1, 8, 2, 8, 8, 8};
  odd.add_tensor(gguf_tensor_from("rope_freqs.weight", Tensor::from_vector(f, Shape{8}), GGMLType::F32));
  const std::string path = d.path + "/odd.gguf";
  odd.write(path);
  try {
    hub::gguf_model_folder(path, d.path + "/derived");
    FAIL() << "expected DEP_MODEL_LOAD_FAILED";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("is not Llama-3 rope scaling"), std::string::npos) << e.what();
  }
}

// Llama-3.1 8B's rotary shape (head_dim 128, theta 500000) with its scaling (factor 8) and Llama-3.2's
// (factor 32) come back as exactly Hugging Face's parameters.
TEST(GGUFRope, RealLlama3ShapesGiveTheirOwnParameters) {
  for (double factor : {8.0, 32.0}) {
    nlohmann::json j = test::stories_config_shaped(128, 1, 1, 128, 1, 128);
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", factor},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    const ModelConfig hf = ModelConfig::from_json(j, "llama3-shape");
    test::TempDir d;
    const std::string path = d.path + "/m.gguf";
    export_gguf(weights_for(hf), stories(), GGUFQuant::F16, path);
    const ModelConfig back = load_model_config(hub::gguf_model_folder(path, d.path + "/derived"));
    ASSERT_TRUE(back.rope.llama3_scaling);
    EXPECT_EQ(back.rope.factor, static_cast<float>(factor));
    EXPECT_EQ(back.rope.low_freq_factor, 1.0f);
    EXPECT_EQ(back.rope.high_freq_factor, 4.0f);
    EXPECT_EQ(back.rope.original_max_position, 8192);
    EXPECT_EQ(rope_inv_freq(back.rope), rope_inv_freq(hf.rope));
  }
}

// rope_freqs.weight must hold head_dim / 2 divisors for an even head_dim of at least 2: an empty one
// with head_dim 0 or 1 once passed the size check (0 == 1 / 2) and dereferenced an empty vector.
TEST(GGUFRope, RopeFreqsOfTheWrongSizeAreRefusedBeforeReading) {
  test::TempDir d;
  for (int64_t n : {0, 3}) {
    GGUFWriter w;
    w.add_tensor(gguf_tensor_from("rope_freqs.weight", Tensor::zeros(Shape{n}), GGMLType::F32));
    const std::string path = d.path + fmt::format("/rope{}.gguf", n);
    w.write(path);
    const GGUFReader r(path);
    for (int64_t head_dim : {0, 1, 3, 8}) {
      SCOPED_TRACE(fmt::format("{} values, head_dim {}", n, head_dim));
      test::expect_error(
          [&] { hub::llama3_rope_scaling_from_gguf(r, path, 10000.0, head_dim); }, ErrorCode::DEP_MODEL_LOAD_FAILED,
          {"rope_freqs.weight has " + std::to_string(n) + " values for head_dim " + std::to_string(head_dim)});
    }
  }
}

}  // namespace
}  // namespace bp
