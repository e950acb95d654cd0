// GGUF LoRA adapters end to end (the real binary) on stories260K (llama architecture: q/k rows are
// permuted in GGUF files):
//   - `export --format gguf-lora` writes llama.cpp's format (general.type adapter, adapter.type lora,
//     adapter.lora.alpha, blk.N.<proj>.weight.lora_a/.lora_b with ne {in, r} / {r, out}, lora_b of
//     q/k in the base's row order), read by @huggingface/gguf as by our reader; f16 and rsLoRA;
//   - training from a q8_0 GGUF base writes <run>/adapter.gguf; an independent consumer
//     (tests/oracles/gguf_lora_apply.py: @huggingface/gguf for the layout, NumPy for the bytes and
//     W + alpha/r·B·A as llama.cpp applies it) gets our merged GGUF's weights, and our runtime gives
//     the merged model the logits of base + adapter; the export says the q8_0 base was dequantized;
//   - an Ollama base (--model ollama:NAME) registers FROM NAME + ADAPTER (no base blob uploaded),
//     keeping the manifest's template, system prompt and stops; a GGUF-file base uploads both.
//   - merging into a q4_K base (a synthetic model with rows of 256) dequantizes, merges in f32,
//     says so, and the independent consumer gets the merged weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hub/gguf_source.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/sha256.h"
#include "model/loader.h"
#include "model/loader_gguf.h"
#include "model/lora.h"
#include "model/merge.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "support/fake_ollama.h"
#include "support/gguf_oracle.h"
#include "support/lora_test_util.h"
#include "support/shaped_config.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

std::string stories() {
  return shared_dir() + "/models/stories260K";
}

// Runs `backprop export ARGS`; stdout only (stderr dropped) unless `with_stderr`.
int backprop(const std::string& args, std::string* out, const std::string& env = "", bool with_stderr = false) {
  return run_command(
      fmt::format("({} {} export {} {})", env, backprop_exe(), args, with_stderr ? "2>&1" : "2>/dev/null"), out);
}

// A PEFT adapter for stories260K whose B is far from zero (r 4, alpha 8).
LoraAdapter random_b_adapter(const ModelConfig& cfg, uint64_t seed, bool rslora = false) {
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.use_rslora = rslora;
  LoraAdapter ad = init_lora(cfg, lc, seed);
  randomize_lora_b(ad, seed * 1000);
  ad.base_model_name_or_path = stories();
  return ad;
}

TEST(GgufLora, FileFollowsLlamaCppConventions) {
  TempDir d;
  const ModelConfig cfg = load_model_config(stories());
  const LoraAdapter ad = random_b_adapter(cfg, 3);
  save_peft_adapter(ad, d.path + "/adapter");
  std::string out;
  ASSERT_EQ(
      backprop(d.path + "/adapter --format gguf-lora --quantization f32 --output " + d.path + "/a.gguf --json", &out),
      0)
      << out;
  GGUFReader r(d.path + "/a.gguf");
  EXPECT_EQ(r.find("general.type")->value, "adapter");
  EXPECT_EQ(r.find("adapter.type")->value, "lora");
  EXPECT_EQ(r.find("general.architecture")->value, "llama");
  EXPECT_EQ(r.find("adapter.lora.alpha")->type, GGUFValueType::FLOAT32);
  EXPECT_EQ(r.find("adapter.lora.alpha")->value, 8.0);
  EXPECT_EQ(r.tensors().size(), static_cast<size_t>(cfg.num_layers * 7 * 2));
  const int64_t hd = cfg.head_dim;
  for (int64_t l : {0, 4}) {
    const LoraLayer& L = ad.layers[static_cast<size_t>(l)];
    const auto* va = r.find_tensor(fmt::format("blk.{}.attn_v.weight.lora_a", l));
    const auto* vb = r.find_tensor(fmt::format("blk.{}.attn_v.weight.lora_b", l));
    ASSERT_TRUE(va && vb);
    EXPECT_EQ(va->shape, (std::vector<int64_t>{4, cfg.hidden_size}));        // ne {in, r}
    EXPECT_EQ(vb->shape, (std::vector<int64_t>{cfg.num_kv_heads * hd, 4}));  // ne {r, out}
    EXPECT_EQ(r.dequantize(*va), L.a(LoraTarget::V).to_vector());
    EXPECT_EQ(r.dequantize(*vb), L.b(LoraTarget::V).to_vector());
    EXPECT_EQ(r.dequantize(*r.find_tensor(fmt::format("blk.{}.ffn_down.weight.lora_b", l))),
              L.b(LoraTarget::Down).to_vector());
    for (LoraTarget t : {LoraTarget::Q, LoraTarget::K}) {  // lora_b rows in the base export's q/k order
      const auto* b =
          r.find_tensor(fmt::format("blk.{}.{}.weight.lora_b", l, t == LoraTarget::Q ? "attn_q" : "attn_k"));
      ASSERT_NE(b, nullptr);
      const std::vector<float> got = r.dequantize(*b), hf = L.b(t).to_vector();
      EXPECT_NE(got, hf) << "q/k rows must be permuted";
      const int64_t rows = b->shape[0];
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t c = 0; c < 4; ++c)
          ASSERT_EQ(got[static_cast<size_t>(row * 4 + c)],
                    hf[static_cast<size_t>(gguf_unpermuted_row(row, hd) * 4 + c)]);
    }
  }
  gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(d.path + "/a.gguf"), r);

  // f16 tensors; rsLoRA (scale alpha/sqrt(r)) written as the alpha that gives llama.cpp's alpha/r that scale.
  save_peft_adapter(random_b_adapter(cfg, 4, true), d.path + "/rs");
  ASSERT_EQ(backprop(d.path + "/rs --format gguf-lora --output " + d.path + "/rs.gguf --json", &out), 0) << out;
  GGUFReader rs(d.path + "/rs.gguf");
  EXPECT_EQ(rs.find_tensor("blk.1.attn_o.weight.lora_a") ? 0 : 1, 1);  // llama.cpp's name is attn_output
  ASSERT_NE(rs.find_tensor("blk.1.attn_output.weight.lora_a"), nullptr);
  EXPECT_EQ(rs.find_tensor("blk.1.attn_output.weight.lora_a")->type, GGMLType::F16);
  EXPECT_NEAR(rs.find("adapter.lora.alpha")->value.get<double>() / 4, 8.0 / 2, 1e-5);
  EXPECT_EQ(rs.find("general.file_type")->value, 1);

  // Refusals: a quantized adapter type, a full model.
  EXPECT_NE(backprop(d.path + "/adapter --format gguf-lora --quantization q4_0", &out, "", true), 0) << out;
  EXPECT_NE(out.find("[INPUT_VALIDATION_FAILED] [export] a GGUF LoRA adapter is stored as f32 or f16"),
            std::string::npos)
      << out;
  EXPECT_NE(backprop(stories() + " --format gguf-lora", &out, "", true), 0) << out;
  EXPECT_NE(out.find("not a LoRA adapter"), std::string::npos) << out;
}

// Runs the independent consumer (tests/oracles/gguf_lora_apply.py) and checks every adapted tensor.
void expect_consumer_matches(const std::string& base, const std::string& adapter, const std::string& merged,
                             size_t tensors, double min_change) {
  std::string out;
  const std::string json_path = merged + ".oracle.json";
  ASSERT_EQ(run_command(fmt::format("/usr/bin/python3 {}/tests/oracles/gguf_lora_apply.py {} {} {} {} 2>&1",
                                    source_dir(), base, adapter, merged, json_path),
                        &out),
            0)
      << out;
  const auto o = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(o["general_type"], "adapter");
  EXPECT_EQ(o["adapter_type"], "lora");
  EXPECT_EQ(o["alpha_type"], 6);  // FLOAT32
  EXPECT_EQ(o["arch_matches"], true);
  EXPECT_TRUE(o["shape_errors"].empty()) << o["shape_errors"].dump();
  EXPECT_EQ(o["tensors"].size(), tensors);
  for (const auto& [name, t] : o["tensors"].items()) {
    EXPECT_LT(t.at("max_diff_merged").template get<double>(), 2e-6) << name;
    EXPECT_GT(t.at("max_change").template get<double>(), min_change) << name << ": the adapter should change it";
  }
}

TEST(GgufLora, TrainedFromAQuantizedGgufAnIndependentConsumerGetsOurMergedModel) {
  TempDir d;
  std::string out;
  const std::string base = d.path + "/base-q8_0.gguf";
  ASSERT_EQ(backprop(stories() + " --format gguf --quantization q8_0 --output " + base, &out), 0) << out;
  {
    std::ofstream f(d.path + "/data.jsonl");
    for (int i = 0; i < 12; ++i) f << "{\"text\": \"Lily had a red ball. Tom liked it and they played.\"}\n";
  }
  const std::string env = "XDG_CACHE_HOME=" + d.path + "/cache";
  ASSERT_EQ(
      run_command(
          fmt::format("({} {} train --device cpu --json --model {} --data {}/data.jsonl --output {}/runs --steps 3 "
                      "--batch-size 2 --threads 1 --lr 0.05 --lora-r 4 2>/dev/null)",
                      env, backprop_exe(), base, d.path, d.path),
          &out),
      0)
      << out;
  const auto summary = nlohmann::json::parse(out);
  const std::string run = summary.at("output_dir"), gguf_adapter = summary.at("final_gguf_adapter");
  EXPECT_EQ(gguf_adapter, run + "/adapter.gguf");
  ASSERT_TRUE(fs::is_regular_file(gguf_adapter));
  ASSERT_TRUE(fs::is_regular_file(run + "/adapter/adapter_config.json"));  // PEFT as before

  // Merging into the q8_0 base: dequantized, merged in f32, written as f32, and said so.
  const std::string merged = d.path + "/merged-f32.gguf";
  ASSERT_EQ(backprop(run + " --format gguf --quantization f32 --output " + merged, &out, env), 0) << out;
  EXPECT_NE(out.find("The base " + base +
                     " is quantized (q8_0): its weights were dequantized to f32, the adapter merged in f32, and the "
                     "result written as f32."),
            std::string::npos)
      << out;

  // The independent consumer applies adapter.gguf to base-q8_0.gguf and compares with merged-f32.gguf.
  expect_consumer_matches(base, gguf_adapter, merged, 5u * 7u, 1e-4);

  // Our runtime: the merged GGUF gives the logits of the q8_0 base with the PEFT adapter attached.
  const std::string derived = d.path + "/derived";
  ModelWeights base_w = load_model(hub::gguf_model_folder(base, derived));
  LoraAdapter peft = load_peft_adapter(run + "/adapter", base_w.config);
  Model plain(load_model(hub::gguf_model_folder(base, derived)), ModelOptions{TrainMode::Frozen});
  plain.set_training(false);
  Model with_lora(std::move(base_w), ModelOptions{TrainMode::Lora});
  with_lora.attach_lora(peft);
  with_lora.set_training(false);
  Model from_merged(load_model(hub::gguf_model_folder(merged, derived)), ModelOptions{TrainMode::Frozen});
  from_merged.set_training(false);
  const auto want = story_logits(with_lora), got = story_logits(from_merged), before = story_logits(plain);
  EXPECT_TRUE(all_close(got, want, {1e-4, 1e-4}));
  double moved = 0;
  for (size_t i = 0; i < want.size(); ++i) moved = std::max(moved, std::abs(double(want[i]) - before[i]));
  EXPECT_GT(moved, 1e-3) << "the adapter should change the logits";

  // An f32 base is not quantized: no such line.
  const std::string base32 = d.path + "/base-f32.gguf";
  ASSERT_EQ(backprop(stories() + " --format gguf --quantization f32 --output " + base32, &out), 0) << out;
  ASSERT_EQ(backprop(run + " --format gguf --quantization f32 --model " + base32 + " --output " + d.path + "/m2.gguf",
                     &out, env),
            0)
      << out;
  EXPECT_EQ(out.find("is quantized"), std::string::npos) << out;
}

TEST(GgufLora, MergingIntoAQ4KBaseDequantizesAndSaysSo) {
  TempDir d;
  // A model whose rows are whole q4_K blocks (256): hidden 256, intermediate 512.
  const nlohmann::json j = stories_config_shaped(256, 4, 2, 64, 2, 512);
  const ModelConfig cfg = ModelConfig::from_json(j, "q4k-test");
  SaveModelOptions so;
  so.copy_files_from = stories();
  save_hf_model(init_random_weights(cfg, 5), d.path + "/model", so);
  std::string out;
  const std::string base = d.path + "/base-q4_k_m.gguf";
  ASSERT_EQ(backprop(d.path + "/model --format gguf --quantization q4_k_m --output " + base, &out), 0) << out;
  ASSERT_EQ(GGUFReader(base).find_tensor("blk.1.attn_q.weight")->type, GGMLType::Q4_K);
  save_peft_adapter(random_b_adapter(cfg, 21), d.path + "/adapter");
  const std::string env = "XDG_CACHE_HOME=" + d.path + "/cache";
  const std::string adapter = d.path + "/a.gguf", merged = d.path + "/merged-f32.gguf";
  ASSERT_EQ(backprop(d.path + "/adapter --model " + base + " --format gguf-lora --quantization f32 --output " + adapter,
                     &out, env),
            0)
      << out;
  ASSERT_EQ(
      backprop(d.path + "/adapter --model " + base + " --format gguf --quantization f32 --output " + merged, &out, env),
      0)
      << out;
  EXPECT_NE(out.find("The base " + base + " is quantized ("), std::string::npos) << out;
  EXPECT_NE(out.find("q4_K"), std::string::npos) << out;
  EXPECT_NE(out.find("its weights were dequantized to f32, the adapter merged in f32, and the result written as f32."),
            std::string::npos)
      << out;
  expect_consumer_matches(base, adapter, merged, 2u * 7u, 1e-2);
  // --json carries the same facts.
  ASSERT_EQ(
      backprop(d.path + "/adapter --model " + base + " --format merged --output " + d.path + "/m --json", &out, env), 0)
      << out;
  const auto r = nlohmann::json::parse(out);
  EXPECT_EQ(r["base_dequantized"]["merged_in"], "f32");
  EXPECT_EQ(r["base_dequantized"]["written_as"], r["dtype"]);
  EXPECT_NE(std::find(r["base_dequantized"]["types"].begin(), r["base_dequantized"]["types"].end(), "q4_K"),
            r["base_dequantized"]["types"].end());
}

TEST(GgufLora, OllamaBaseIsRegisteredFromItsNameWithTheAdapter) {
  TempDir d;
  std::string out;
  const std::string base = d.path + "/base.gguf";
  ASSERT_EQ(backprop(stories() + " --format gguf --quantization q8_0 --output " + base, &out), 0) << out;
  FakeOllamaStore store;
  const std::string tmpl = "{{ if .System }}<s>{{ .System }}</s>{{ end }}{{ .Prompt }}";
  store.add_model("library/tiny", "v1", read_file(base), tmpl, "You are terse.", R"({"stop":["<|end|>"]})");
  save_peft_adapter(random_b_adapter(load_model_config(stories()), 7), d.path + "/adapter");
  FakeOllama server;
  const std::string env = "OLLAMA_MODELS=" + store.root.path + " XDG_CACHE_HOME=" + d.path + "/cache";
  ASSERT_EQ(backprop(d.path + "/adapter --model ollama:tiny:v1 --format gguf-lora --output " + d.path +
                         "/out/ --ollama --ollama-name tiny-tuned --ollama-host 127.0.0.1:" +
                         std::to_string(server.port) + " --json",
                     &out, env),
            0)
      << out;
  const std::string adapter = d.path + "/out/adapter-f16.gguf";
  const std::string digest = "sha256:" + sha256_file_hex(adapter);
  ASSERT_EQ(server.created.size(), 1u);
  const auto& c = server.created[0];
  EXPECT_EQ(c["model"], "tiny-tuned");
  EXPECT_EQ(c["from"], "tiny:v1");
  EXPECT_FALSE(c.contains("files")) << "an Ollama base is named, not uploaded again";
  EXPECT_EQ(c["adapters"]["adapter-f16.gguf"], digest);
  EXPECT_EQ(c["template"], tmpl);
  EXPECT_EQ(c["system"], "You are terse.");
  EXPECT_EQ(c["parameters"]["stop"], nlohmann::json::array({"<|end|>"}));
  EXPECT_EQ(server.blobs.size(), 1u);
  EXPECT_EQ(server.blobs.at(digest), fs::file_size(adapter));
  const std::string mf = read_file(d.path + "/out/adapter-f16.Modelfile");
  EXPECT_NE(mf.find("FROM tiny:v1\nADAPTER " + adapter + "\nTEMPLATE \"\"\"" + tmpl +
                    "\"\"\"\nSYSTEM \"\"\"You are terse.\"\"\"\n"),
            std::string::npos)
      << mf;
  EXPECT_NE(mf.find("PARAMETER stop \"<|end|>\""), std::string::npos) << mf;

  // A GGUF-file base: both files are uploaded, the base as the model and the adapter as its ADAPTER.
  FakeOllama server2;
  ASSERT_EQ(backprop(d.path + "/adapter --model " + base + " --format gguf-lora --quantization f32 --output " + d.path +
                         "/out2/ --ollama --ollama-name tiny-file --ollama-host 127.0.0.1:" +
                         std::to_string(server2.port) + " --json",
                     &out, env),
            0)
      << out;
  ASSERT_EQ(server2.created.size(), 1u);
  EXPECT_EQ(server2.created[0]["files"]["base.gguf"], "sha256:" + sha256_file_hex(base));
  EXPECT_EQ(server2.created[0]["adapters"]["adapter-f32.gguf"],
            "sha256:" + sha256_file_hex(d.path + "/out2/adapter-f32.gguf"));
  EXPECT_FALSE(server2.created[0].contains("from"));
  EXPECT_EQ(server2.blobs.size(), 2u);

  // A Hugging Face folder base cannot be registered with its adapter: INPUT_VALIDATION_FAILED.
  EXPECT_NE(backprop(d.path + "/adapter --model " + stories() +
                         " --format gguf-lora --ollama --ollama-host 127.0.0.1:" + std::to_string(server2.port),
                     &out, env, true),
            0)
      << out;
  EXPECT_NE(out.find("[INPUT_VALIDATION_FAILED] [export] --ollama with --format gguf-lora needs a GGUF or Ollama base"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace bp::test
