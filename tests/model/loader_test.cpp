// Loading model folders: the real stories260K, bf16/f16 and sharded folders written by
// save_hf_model, every architecture's extra tensors, damaged folders, hub names.
#include "model/loader.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "model/merge.h"
#include "model/weight_names.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

std::string stories_dir() {
  return test::shared_dir() + "/models/stories260K";
}

ModelConfig tiny_config(Arch arch) {
  nlohmann::json j = {{"architectures", {arch_name(arch)}},
                      {"vocab_size", 40},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"tie_word_embeddings", arch == Arch::Qwen2},
                      {"torch_dtype", "float32"}};
  return ModelConfig::from_json(j, "tiny");
}

template <class F>
std::string load_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED";
  return "";
}

void expect_same_weights(const ModelWeights& a, const ModelWeights& b, test::Tolerance tol) {
  ASSERT_EQ(model_roles(a.config).size(), model_roles(b.config).size());
  for (const auto& [role, layer] : model_roles(a.config))
    EXPECT_TRUE(test::all_close(weight_ref(a, role, layer).to_vector(), weight_ref(b, role, layer).to_vector(), tol))
        << hf_name(role, layer);
}

}  // namespace

TEST(Loader, Stories260KShapesAndValues) {
  ModelWeights w = load_model(stories_dir());
  const ModelConfig& c = w.config;
  EXPECT_EQ(c.arch, Arch::Llama);
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.embed.shape(), Shape({512, 64}));
  EXPECT_EQ(w.layers[0].q.shape(), Shape({64, 64}));
  EXPECT_EQ(w.layers[4].k.shape(), Shape({32, 64}));
  EXPECT_EQ(w.layers[2].v.shape(), Shape({32, 64}));
  EXPECT_EQ(w.layers[3].o.shape(), Shape({64, 64}));
  EXPECT_EQ(w.layers[1].gate.shape(), Shape({172, 64}));
  EXPECT_EQ(w.layers[1].down.shape(), Shape({64, 172}));
  EXPECT_EQ(w.final_norm.shape(), Shape({64}));
  EXPECT_FALSE(w.lm_head.defined());  // tied
  EXPECT_EQ(&w.output_weight(), &w.embed);
  EXPECT_FALSE(w.layers[0].q_bias.defined());
  EXPECT_FALSE(w.layers[0].q_norm.defined());
  EXPECT_EQ(w.embed.dtype(), DType::F32);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});

  // Values against the file, read here independently of the library's reader.
  std::ifstream in(stories_dir() + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  int64_t total = 0;
  for (const auto& [role, layer] : model_roles(c)) {
    const std::string name = hf_name(role, layer);
    ASSERT_TRUE(h.contains(name)) << name;
    const Tensor& t = weight_ref(w, role, layer);
    EXPECT_EQ(h[name]["shape"].get<std::vector<int64_t>>(), t.shape().vec()) << name;
    const size_t off = 8 + n + h[name]["data_offsets"][0].get<size_t>();
    std::vector<float> file(static_cast<size_t>(t.numel()));
    std::memcpy(file.data(), bytes.data() + off, file.size() * 4);
    EXPECT_EQ(t.to_vector(), file) << name;
    total += t.numel();
  }
  EXPECT_EQ(total, 260032);  // README: parameters without RoPE tables
  // Spot values are real trained numbers, not zeros or garbage.
  float max_abs = 0;
  for (float v : w.embed.to_vector()) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_GT(max_abs, 0.1f);
  EXPECT_LT(max_abs, 100.0f);
}

TEST(Loader, HalfPrecisionFoldersConvertToF32) {
  ModelWeights ref = init_random_weights(tiny_config(Arch::Llama), 3);
  for (DType dt : {DType::BF16, DType::F16}) {
    test::TempDir dir;
    SaveModelOptions o;
    o.dtype = dt;
    save_hf_model(ref, dir.path, o);
    EXPECT_EQ(SafetensorsReader::open_model(dir.path).entry("model.norm.weight").dtype_str,
              dt == DType::BF16 ? "BF16" : "F16");
    ModelWeights w = load_model(dir.path);
    EXPECT_EQ(w.config.torch_dtype, dt);
    EXPECT_EQ(w.layers[1].up.dtype(), DType::F32);
    for (const auto& [role, layer] : model_roles(w.config))  // exactly the dtype's rounding
      EXPECT_EQ(weight_ref(w, role, layer).to_vector(), weight_ref(ref, role, layer).to(dt).to_vector());
    // Without torch_dtype in config.json the stored dtype is used.
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.path + "/config.json"));
    j.erase("torch_dtype");
    std::ofstream(dir.path + "/config.json") << j.dump();
    EXPECT_EQ(load_model(dir.path).config.torch_dtype, dt);
  }
}

TEST(Loader, ShardedFolderLoadsTheSame) {
  ModelWeights ref = init_random_weights(tiny_config(Arch::Mistral), 4);
  test::TempDir dir;
  SaveModelOptions o;
  o.max_shard_bytes = 4096;
  auto files = save_hf_model(ref, dir.path, o);
  EXPECT_TRUE(fs::exists(dir.path + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir.path + "/model.safetensors"));
  EXPECT_GT(files.size(), 4u);
  ModelWeights w = load_model(dir.path);
  EXPECT_FALSE(w.config.tie_word_embeddings);
  EXPECT_TRUE(w.lm_head.defined());
  expect_same_weights(w, ref, {0, 0});
}

TEST(Loader, Qwen2BiasAndQwen3NormsRoundTrip) {
  for (Arch arch : {Arch::Qwen2, Arch::Qwen3}) {
    ModelWeights ref = init_random_weights(tiny_config(arch), 5);
    // Make norms and biases non-trivial so a swapped tensor would show.
    for (auto& l : ref.layers) {
      if (l.q_bias.defined()) l.k_bias.copy_from(test::random_tensor(l.k_bias.shape(), 11));
      if (l.q_norm.defined()) l.k_norm.copy_from(test::random_tensor(l.k_norm.shape(), 12));
    }
    test::TempDir dir;
    save_hf_model(ref, dir.path);
    ModelWeights w = load_model(dir.path);
    EXPECT_EQ(w.config.arch, arch);
    EXPECT_EQ(w.layers[1].q_bias.defined(), arch == Arch::Qwen2);
    EXPECT_EQ(w.layers[1].k_norm.defined(), arch == Arch::Qwen3);
    expect_same_weights(w, ref, {0, 0});

    // Remove one arch-specific tensor: the error names the file and the tensor.
    const std::string missing =
        arch == Arch::Qwen2 ? "model.layers.1.self_attn.v_proj.bias" : "model.layers.0.self_attn.q_norm.weight";
    NamedTensors ts = named_hf_weights(ref);
    std::erase_if(ts, [&](const auto& nt) { return nt.first == missing; });
    write_safetensors(dir.path + "/model.safetensors", ts);
    const std::string msg = load_error([&] { load_model(dir.path); });
    EXPECT_NE(msg.find(dir.path + "/model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + missing + "' is missing"), std::string::npos) << msg;
  }
}

TEST(Loader, WrongShapeNamesFileAndTensor) {
  ModelWeights ref = init_random_weights(tiny_config(Arch::Llama), 6);
  test::TempDir dir;
  save_hf_model(ref, dir.path);
  NamedTensors ts = named_hf_weights(ref);
  for (auto& nt : ts)
    if (nt.first == "model.layers.1.mlp.down_proj.weight") nt.second = test::random_tensor({24, 16}, 1);
  write_safetensors(dir.path + "/model.safetensors", ts);
  const std::string msg = load_error([&] { load_model(dir.path); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.layers.1.mlp.down_proj.weight' has shape [24, 16] but the model config needs [16, 24]"),
            std::string::npos)
      << msg;
}

TEST(Loader, UntiedModelWithoutLmHeadFails) {
  ModelWeights ref = init_random_weights(tiny_config(Arch::Llama), 7);
  test::TempDir dir;
  save_hf_model(ref, dir.path);
  NamedTensors ts = named_hf_weights(ref);
  ts.pop_back();  // lm_head is last
  write_safetensors(dir.path + "/model.safetensors", ts);
  const std::string msg = load_error([&] { load_model(dir.path); });
  EXPECT_NE(msg.find("'lm_head.weight' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tie_word_embeddings is false"), std::string::npos) << msg;
}

TEST(Loader, TruncatedWeightsFail) {
  ModelWeights ref = init_random_weights(tiny_config(Arch::Llama), 8);
  test::TempDir dir;
  save_hf_model(ref, dir.path);
  fs::resize_file(dir.path + "/model.safetensors", fs::file_size(dir.path + "/model.safetensors") - 100);
  const std::string msg = load_error([&] { load_model(dir.path); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Loader, HubNameAndMissingPaths) {
  std::string msg = load_error([] { load_model("Qwen/Qwen2.5-7B"); });
  EXPECT_NE(msg.find("'Qwen/Qwen2.5-7B' is not a local folder"), std::string::npos) << msg;
  EXPECT_NE(msg.find("huggingface-cli download Qwen/Qwen2.5-7B --local-dir ./Qwen2.5-7B"), std::string::npos) << msg;
  EXPECT_TRUE(looks_like_hub_name("meta-llama/Llama-3.2-1B"));
  EXPECT_FALSE(looks_like_hub_name("./models/x"));
  EXPECT_FALSE(looks_like_hub_name("/abs/path"));
  EXPECT_FALSE(looks_like_hub_name("a/b/c"));
  EXPECT_FALSE(looks_like_hub_name("plainname"));

  test::TempDir dir;
  msg = load_error([&] { load_model(dir.path + "/nothing-here"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  msg = load_error([&] { load_model(dir.path); });
  EXPECT_NE(msg.find("no config.json"), std::string::npos) << msg;
  std::ofstream(dir.path + "/file.txt") << "x";
  msg = load_error([&] { load_model(dir.path + "/file.txt"); });
  EXPECT_NE(msg.find("is a file"), std::string::npos) << msg;
  // config.json but no weights.
  std::ofstream(dir.path + "/config.json") << tiny_config(Arch::Llama).to_json().dump();
  msg = load_error([&] { load_model(dir.path); });
  EXPECT_NE(msg.find("no model.safetensors"), std::string::npos) << msg;
}

TEST(Loader, EosFromGenerationConfig) {
  test::TempDir dir;
  nlohmann::json j = tiny_config(Arch::Llama).to_json();
  j.erase("eos_token_id");
  std::ofstream(dir.path + "/config.json") << j.dump();
  std::ofstream(dir.path + "/generation_config.json") << R"({"eos_token_id": [5, 6]})";
  EXPECT_EQ(load_model_config(dir.path).eos_token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(Loader, InitRandomWeightsIsHfStyle) {
  ModelConfig c = tiny_config(Arch::Qwen2);
  c.raw["initializer_range"] = 0.05;
  ModelWeights a = init_random_weights(c, 1), b = init_random_weights(c, 1), d = init_random_weights(c, 2);
  EXPECT_EQ(a.layers[1].gate.to_vector(), b.layers[1].gate.to_vector());
  EXPECT_NE(a.layers[1].gate.to_vector(), d.layers[1].gate.to_vector());
  EXPECT_NE(a.layers[0].gate.to_vector(), a.layers[1].gate.to_vector());
  for (float v : a.layers[0].input_norm.to_vector()) EXPECT_EQ(v, 1.0f);
  for (float v : a.final_norm.to_vector()) EXPECT_EQ(v, 1.0f);
  for (float v : a.layers[0].q_bias.to_vector()) EXPECT_EQ(v, 0.0f);
  // Sample moments over all linear weights: mean ~ 0, std ~ initializer_range.
  double s = 0, s2 = 0;
  int64_t n = 0;
  for (const auto& [role, layer] : model_roles(c)) {
    if (role_shape(c, role).rank != 2) continue;
    for (float v : weight_ref(a, role, layer).to_vector()) s += v, s2 += double(v) * v, ++n;
  }
  const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.003);
  EXPECT_NEAR(sd, 0.05, 0.003);
  EXPECT_GT(n, 3000);
}

}  // namespace bp

namespace bp {

// Phi-3's folder: qkv_proj and gate_up_proj in the file (q, k, v rows; gate, up rows), loaded into
// the per-role weights as row views of the one tensor read, written back fused; load → save → load
// is exact. A merged LoRA lands in the fused tensor's rows. A bf16-held base splits the rows too.
TEST(Loader, Phi3FusedProjectionsRoundTrip) {
  const ModelConfig cfg = tiny_config(Arch::Phi3);  // q_dim 16, kv_dim 8, F 24, D 16
  const ModelWeights ref = init_random_weights(cfg, 9);
  test::TempDir dir;
  save_hf_model(ref, dir.path);
  SafetensorsReader r = SafetensorsReader::open_model(dir.path);
  EXPECT_FALSE(r.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(r.contains("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(r.entry("model.layers.1.self_attn.qkv_proj.weight").shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(r.entry("model.layers.1.mlp.gate_up_proj.weight").shape, (std::vector<int64_t>{48, 16}));
  const std::vector<float> qkv = r.read("model.layers.1.self_attn.qkv_proj.weight").to_vector();
  const std::vector<float> v = ref.layers[1].v.to_vector(), up = ref.layers[1].up.to_vector();
  EXPECT_EQ(std::vector<float>(qkv.begin() + 24 * 16, qkv.end()), v);  // v: rows 24..31
  const std::vector<float> gu = r.read("model.layers.1.mlp.gate_up_proj.weight").to_vector();
  EXPECT_EQ(std::vector<float>(gu.begin() + 24 * 16, gu.end()), up);  // up: rows 24..47

  ModelWeights w = load_model(dir.path);
  EXPECT_EQ(w.config.arch, Arch::Phi3);
  expect_same_weights(w, ref, {0, 0});
  // Row views of the one tensor read: no copy per projection.
  EXPECT_EQ(static_cast<const char*>(w.layers[0].k.raw()),
            static_cast<const char*>(w.layers[0].q.raw()) + 16 * 16 * sizeof(float));
  test::TempDir again;
  save_hf_model(w, again.path);
  expect_same_weights(load_model(again.path), ref, {0, 0});

  // A merged adapter on qkv_proj: the fused tensor = W + scale·B·A over all its rows.
  LoraConfig lc;
  lc.r = 2;
  lc.alpha = 2;
  lc.target_modules = {"qkv_proj"};
  LoraAdapter ad = init_lora(cfg, lc, 4);
  for (LoraLayer& l : ad.layers)
    for (LoraTarget t : {LoraTarget::Q, LoraTarget::K, LoraTarget::V})
      l.b(t).copy_from(test::random_tensor(l.b(t).shape(), 7 + static_cast<uint64_t>(t)));
  const ModelWeights merged = merge_lora(w, ad);
  auto named = [](const ModelWeights& m, const std::string& name) {
    for (auto& [n, t] : named_hf_weights(m))
      if (n == name) return t;
    ADD_FAILURE() << name;
    return Tensor();
  };
  const Tensor fused = named(merged, "model.layers.0.self_attn.qkv_proj.weight");
  const Tensor base = named(w, "model.layers.0.self_attn.qkv_proj.weight");
  std::vector<const Tensor*> bs = {&ad.layers[0].b(LoraTarget::Q), &ad.layers[0].b(LoraTarget::K),
                                   &ad.layers[0].b(LoraTarget::V)};
  const std::vector<float> B = join_rows_or_copy(bs).to_vector(), A = ad.layers[0].a(LoraTarget::Q).to_vector();
  const std::vector<float> got = fused.to_vector(), w0 = base.to_vector();
  for (int64_t o = 0; o < 32; ++o)
    for (int64_t i = 0; i < 16; ++i) {
      double want = w0[static_cast<size_t>(o * 16 + i)];
      for (int64_t k = 0; k < 2; ++k)
        want += 1.0 * B[static_cast<size_t>(o * 2 + k)] * A[static_cast<size_t>(k * 16 + i)];
      EXPECT_NEAR(got[static_cast<size_t>(o * 16 + i)], want, 1e-6) << o << "," << i;
    }

  // A bf16-held base: each projection held from its rows of the mapped tensor.
  const ModelWeights held = load_model(dir.path, DType::BF16);
  EXPECT_EQ(held.layers[1].up.dtype(), DType::BF16);
  EXPECT_EQ(held.layers[1].up.shape(), Shape({24, 16}));
  EXPECT_TRUE(test::all_close(held.layers[1].up.to(DType::F32).to_vector(), up, {0, 1.0 / 128}));

  // A Phi-3 folder without its fused tensor names it.
  NamedTensors ts = named_hf_weights(ref);
  std::erase_if(ts, [](const auto& nt) { return nt.first == "model.layers.1.mlp.gate_up_proj.weight"; });
  write_safetensors(dir.path + "/model.safetensors", ts);
  EXPECT_NE(load_error([&] { load_model(dir.path); }).find("'model.layers.1.mlp.gate_up_proj.weight' is missing"),
            std::string::npos);
}

}  // namespace bp
