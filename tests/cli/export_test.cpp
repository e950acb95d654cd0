// `backprop export` end to end (the real binary) on stories260K:
//   - a run folder made by a short `backprop train` exports as lora, merged and gguf with the
//     default output paths, and the outputs load again (PEFT reader, model loader, GGUF reader);
//   - a merged export of an adapter with large non-zero B gives the same logits as base + adapter
//     through Model::attach_lora (and logits that differ from the base's, so the check can fail);
//   - a GGUF export of an adapter holds the merged weights (f32 export, attn_v is not permuted);
//   - --ollama registers with a fake Ollama server (cpp-httplib, 127.0.0.1, ephemeral port) that
//     implements the blob and create endpoints; with nothing listening -> DEP_OLLAMA_REGISTRATION_FAILED;
//   - bad inputs, a missing base model and a full disk give their catalog codes and exit codes;
//   - an export never writes over what it reads or over anything but an earlier export of its kind.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/gguf_reader.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/merge.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/fake_ollama.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return shared_dir() + "/models/stories260K";
}

struct CliRun {
  int rc = -1;
  std::string out;
  nlohmann::json json;  // parsed stdout when it is JSON
};

// Runs `backprop export ... --json` (stderr dropped) with optional environment assignments.
CliRun export_json(const std::string& args, const std::string& env = "") {
  CliRun r;
  // (...) keeps stderr out of the captured output (run_command appends 2>&1).
  r.rc = run_command(fmt::format("({} {} export --json {} 2>/dev/null)", env, backprop_exe(), args), &r.out);
  try {
    r.json = nlohmann::json::parse(r.out);
  } catch (const std::exception&) {
  }
  return r;
}

// An adapter for stories260K with B far from zero, so merged and base logits differ clearly.
LoraAdapter strong_adapter(const ModelConfig& cfg, uint64_t seed) {
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  LoraAdapter ad = init_lora(cfg, lc, seed);
  randomize_lora_b(ad, seed * 100);
  ad.base_model_name_or_path = model_dir();
  return ad;
}

// A run folder from a real 2-step `backprop train` (made once for the suite).
class ExportRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const std::string data = dir_->path + "/data.jsonl";
    std::ofstream f(data);
    const char* names[] = {"Lily", "Tom", "Ben", "Sue"};
    for (int i = 0; i < 12; ++i)
      f << "{\"text\": \"" << names[i % 4] << " had a red ball. " << names[(i + 1) % 4] << " liked it.\"}\n";
    f.close();
    std::string out;
    const int rc =
        run_command(fmt::format("({} train --device cpu --json --model {} --data {} --output {}/runs --steps 2 "
                                "--batch-size 2 --threads 1 --lr 0.01 --lora-r 4 --save-every 1 2>/dev/null)",
                                backprop_exe(), model_dir(), data, dir_->path),
                    &out);
    ASSERT_EQ(rc, 0) << out;
    run_dir_ = nlohmann::json::parse(out).at("output_dir").get<std::string>();
    ASSERT_TRUE(fs::is_regular_file(run_dir_ + "/adapter/adapter_config.json")) << run_dir_;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
  static std::string run_dir_;
};
TempDir* ExportRun::dir_ = nullptr;
std::string ExportRun::run_dir_;

TEST_F(ExportRun, LoraReSavesTheAdapterNextToTheRun) {
  CliRun r = export_json(run_dir_ + " --format lora");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string out = run_dir_ + "/export/adapter";
  EXPECT_EQ(r.json["output"], out);
  EXPECT_EQ(r.json["base_model"], fs::absolute(model_dir()).lexically_normal().string());
  const ModelConfig cfg = load_model_config(model_dir());
  LoraAdapter a = load_peft_adapter(run_dir_ + "/adapter", cfg), b = load_peft_adapter(out, cfg);
  EXPECT_EQ(b.config.r, 4);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (LoraTarget t : kAllLoraTargets) {
      ASSERT_EQ(a.layers[l].has(t), b.layers[l].has(t));
      if (!a.layers[l].has(t)) continue;
      EXPECT_EQ(a.layers[l].a(t).to_vector(), b.layers[l].a(t).to_vector());
      EXPECT_EQ(a.layers[l].b(t).to_vector(), b.layers[l].b(t).to_vector());
    }
}

TEST_F(ExportRun, GgufWithModelfileNextToTheRun) {
  CliRun r = export_json(run_dir_ + " --format gguf");  // default quantization f16
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string gguf = run_dir_ + "/export/model-f16.gguf";
  EXPECT_EQ(r.json["output"], gguf);
  GGUFReader rd(gguf);
  // stories260K (tied): token_embd + output_norm + 5 layers x 9 tensors.
  EXPECT_EQ(rd.tensors().size(), 47u);
  EXPECT_EQ(r.json["tensor_count"], 47);
  EXPECT_EQ(rd.find("general.architecture")->value, "llama");
  EXPECT_EQ(rd.find("general.file_type")->value, 1);
  EXPECT_EQ(rd.find("llama.block_count")->value, 5);
  EXPECT_NE(rd.find("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(rd.find_tensor("blk.0.attn_q.weight")->type, GGMLType::F16);
  EXPECT_EQ(rd.find_tensor("blk.0.attn_norm.weight")->type, GGMLType::F32);

  EXPECT_EQ(r.json["modelfile"], run_dir_ + "/export/model-f16.Modelfile");  // named after its GGUF
  std::ifstream mf(run_dir_ + "/export/model-f16.Modelfile");
  std::stringstream ss;
  ss << mf.rdbuf();
  const std::string modelfile = ss.str();
  EXPECT_NE(modelfile.find("FROM " + gguf), std::string::npos) << modelfile;
  EXPECT_NE(modelfile.find("TEMPLATE"), std::string::npos) << modelfile;
  EXPECT_NE(modelfile.find("PARAMETER num_ctx 512"), std::string::npos) << modelfile;
  EXPECT_NE(modelfile.find("PARAMETER stop"), std::string::npos) << modelfile;
  // Without --ollama it says how to register.
  const std::string next = r.json["next"].dump();
  EXPECT_NE(next.find("ollama create"), std::string::npos) << next;
}

// Every path under `dir` with its size and content hash: what "nothing was touched" compares.
std::map<std::string, std::string> folder_state(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    m[rel] = e.is_regular_file() ? sha256_file_hex(e.path().string()) : (e.is_directory() ? "dir" : "other");
  }
  return m;
}

// An export never writes over what it reads, nor over a folder or file that is not an earlier
// export of its kind; each refusal is INPUT_VALIDATION_FAILED with nothing touched. Re-exporting to
// the same place replaces the earlier export and says so.
TEST_F(ExportRun, OutputNeverReplacesWhatItReadsOrOtherFiles) {
  TempDir d;
  const auto run_before = folder_state(run_dir_);
  auto refused = [&](const std::string& args, const std::string& what) {
    CliRun r = export_json(args);
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.out;
    EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << args << "\n" << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << args << "\n" << r.out;
  };
  // The run itself, the folder of runs holding it, the adapter folder.
  refused(run_dir_ + " --format merged --output " + run_dir_, "holds the adapter being exported");
  refused(run_dir_ + " --format merged --output " + dir_->path + "/runs/", "holds the adapter being exported");
  refused(run_dir_ + " --format lora --output " + run_dir_ + "/adapter", "is the adapter being exported");
  refused(run_dir_ + " --format gguf --output " + run_dir_ + "/adapter/adapter_model.safetensors",
          "is inside the adapter being exported");
  EXPECT_EQ(folder_state(run_dir_), run_before) << "a refused export touched the run";

  // A folder of other things, a file that is not a GGUF, and what is not a regular file.
  fs::create_directories(d.path + "/mine/sub");
  std::ofstream(d.path + "/mine/notes.txt") << "keep me";
  std::ofstream(d.path + "/mine/config.json") << "{}";
  const auto mine_before = folder_state(d.path + "/mine");
  refused(run_dir_ + " --format merged --output " + d.path + "/mine", "holds other things (sub/)");
  std::ofstream(d.path + "/notes.gguf") << "keep me";
  refused(run_dir_ + " --format gguf --output " + d.path + "/notes.gguf", "is a file that is not a GGUF");
  EXPECT_EQ(folder_state(d.path + "/mine"), mine_before);
  EXPECT_EQ(sha256_file_hex(d.path + "/notes.gguf"), sha256_file_hex(d.path + "/mine/notes.txt"));
  ASSERT_EQ(::mkfifo((d.path + "/pipe.gguf").c_str(), 0600), 0);
  refused(run_dir_ + " --format gguf --output " + d.path + "/pipe.gguf", "is not a regular file");
  EXPECT_TRUE(fs::is_fifo(d.path + "/pipe.gguf"));

  // The base model: a copy, so that a failure here cannot damage the shared one.
  fs::copy(model_dir(), d.path + "/base", fs::copy_options::recursive);
  const auto base_before = folder_state(d.path + "/base");
  refused(d.path + "/base --format gguf --output " + d.path + "/base/config.json",
          "is inside the model being exported");
  refused(d.path + "/base --format merged --output " + d.path + "/base", "is the model being exported");
  refused(run_dir_ + " --format merged --model " + d.path + "/base --output " + d.path, "holds the base model");
  EXPECT_EQ(folder_state(d.path + "/base"), base_before);

  // Re-exports replace the earlier one (a folder given with or without its trailing separator).
  CliRun r = export_json(run_dir_ + " --format merged --output " + d.path + "/merged");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["replaced_earlier_export"], false);
  r = export_json(run_dir_ + " --format merged --output " + d.path + "/merged/");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["output"], d.path + "/merged");
  EXPECT_EQ(r.json["replaced_earlier_export"], true);
  EXPECT_TRUE(fs::is_regular_file(d.path + "/merged/config.json"));
  EXPECT_FALSE(fs::exists(d.path + "/merged.old")) << "the earlier export set aside is removed";

  // A GGUF and a GGUF LoRA in one folder keep a Modelfile each, named after its file; a name
  // without an extension is a folder.
  r = export_json(run_dir_ + " --format gguf --quantization q8_0 --output " + d.path + "/out");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["output"], d.path + "/out/model-q8_0.gguf");
  r = export_json(run_dir_ + " --format gguf-lora --output " + d.path + "/out/");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["modelfile"], d.path + "/out/adapter-f16.Modelfile");
  std::ifstream merged_mf(d.path + "/out/model-q8_0.Modelfile"), lora_mf(d.path + "/out/adapter-f16.Modelfile");
  std::stringstream a, b;
  a << merged_mf.rdbuf();
  b << lora_mf.rdbuf();
  EXPECT_NE(a.str().find("FROM " + d.path + "/out/model-q8_0.gguf"), std::string::npos) << a.str();
  EXPECT_NE(b.str().find("ADAPTER " + d.path + "/out/adapter-f16.gguf"), std::string::npos) << b.str();
}

// --quantization is a choice of the GGUF formats; set for another, it is refused rather than ignored.
TEST_F(ExportRun, QuantizationForAFormatWithoutOneIsRefused) {
  TempDir d;
  for (const char* format : {"merged", "lora"}) {
    CliRun r =
        export_json(fmt::format("{} --format {} --quantization bf16 --output {}/{}", run_dir_, format, d.path, format));
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(r.json["code"], "CONFIG_INVALID_SETTING") << r.out;
    EXPECT_FALSE(fs::exists(d.path + "/" + format));
  }
  // Its default is no choice: the same exports without the flag succeed.
  CliRun r = export_json(run_dir_ + " --format lora --output " + d.path + "/lora");
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST_F(ExportRun, MergedIsAModelFolderThatLoads) {
  std::string out;
  ASSERT_EQ(run_command(backprop_exe() + " export " + run_dir_ + " --format merged", &out), 0) << out;
  EXPECT_NE(out.find("wrote " + run_dir_ + "/merged/config.json"), std::string::npos) << out;
  EXPECT_NE(out.find("backprop generate --model " + run_dir_ + "/merged"), std::string::npos) << out;
  EXPECT_TRUE(fs::is_regular_file(run_dir_ + "/merged/tokenizer.json"));
  ModelWeights m = load_model(run_dir_ + "/merged");
  EXPECT_EQ(m.config.num_layers, 5);
}

TEST_F(ExportRun, CheckpointOfALoraRunExportsItsWeights) {
  // checkpoint-1 (the run saves every step) holds step-1 weights, not the final adapter's.
  TempDir d;
  const std::string ckpt = run_dir_ + "/checkpoints/checkpoint-1";
  CliRun r = export_json(ckpt + " --format lora --output " + d.path + "/ck");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["input"], ckpt);
  const ModelConfig cfg = load_model_config(model_dir());
  LoraAdapter fin = load_peft_adapter(run_dir_ + "/adapter", cfg), got = load_peft_adapter(d.path + "/ck", cfg);
  auto st = SafetensorsReader::open_file(ckpt + "/trainable.safetensors");
  const std::string name = "base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight";
  EXPECT_EQ(got.layers[3].b(LoraTarget::V).to_vector(), st.read(name).to_vector());
  EXPECT_NE(got.layers[3].b(LoraTarget::V).to_vector(), fin.layers[3].b(LoraTarget::V).to_vector());
  r = export_json(ckpt + " --format gguf --quantization q8_0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["output"], run_dir_ + "/export/checkpoint-1/model-q8_0.gguf");
  EXPECT_EQ(GGUFReader(r.json["output"].get<std::string>()).tensors().size(), 47u);
}

// What a new user types: `train ... --output runs` then `export runs --format gguf`. The folder
// given to --output holds the run in runs/<run id>/: export takes its only run and says which.
TEST_F(ExportRun, TheTrainOutputFolderExportsItsRun) {
  TempDir d;
  std::string out;
  const std::string cmd =
      fmt::format("{} export {}/runs --format gguf --output {}/m.gguf", backprop_exe(), dir_->path, d.path);
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("holds one run: exporting " + run_dir_), std::string::npos) << out;
  EXPECT_EQ(GGUFReader(d.path + "/m.gguf").tensors().size(), 47u);
}

// Several runs in the folder: the newest (by the run folder's time) is taken, and a run id names
// one under training.output. Two copies of the run with set times make the choice visible.
TEST_F(ExportRun, SeveralRunsTakeTheNewestAndARunIdNamesOne) {
  TempDir d;
  const fs::path runs = fs::path(d.path) / "runs";
  fs::create_directories(runs);
  for (const char* name : {"run-a", "run-b"}) fs::copy(run_dir_, runs / name, fs::copy_options::recursive);
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(runs / "run-a", now - std::chrono::hours(2));
  fs::last_write_time(runs / "run-b", now - std::chrono::hours(1));
  CliRun r = export_json(runs.string() + " --format lora --output " + d.path + "/o1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["run_dir"], (runs / "run-b").string());
  fs::last_write_time(runs / "run-a", now);
  r = export_json(runs.string() + " --format lora --output " + d.path + "/o2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["run_dir"], (runs / "run-a").string());
  // A run id, looked up under training.output (here from the environment).
  r = export_json("run-b --format lora --output " + d.path + "/o3", "BACKPROPAGATE_TRAINING__OUTPUT=" + runs.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["run_dir"], (runs / "run-b").string());
  EXPECT_NE(export_json("run-c --format lora", "BACKPROPAGATE_TRAINING__OUTPUT=" + runs.string()).rc, 0);
}

TEST(Export, MergedGivesTheLogitsOfBasePlusAdapter) {
  TempDir d;
  ModelWeights base = load_model(model_dir());
  const ModelConfig cfg = base.config;
  LoraAdapter ad = strong_adapter(cfg, 5);
  save_peft_adapter(ad, d.path + "/adapter");
  CliRun r = export_json(d.path + "/adapter --format merged --output " + d.path + "/merged");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["dtype"], "f32");  // stories260K's torch_dtype

  expect_merged_logits_match(std::move(base), ad, load_model(d.path + "/merged"), 0.05);
}

TEST(Export, GgufOfAnAdapterHoldsTheMergedWeights) {
  TempDir d;
  ModelWeights base = load_model(model_dir());
  LoraAdapter ad = strong_adapter(base.config, 9);
  save_peft_adapter(ad, d.path + "/adapter");
  CliRun r = export_json(d.path + "/adapter --format gguf --quantization f32");
  ASSERT_EQ(r.rc, 0) << r.out;
  // Outside a run folder the default is <folder>-export/ next to it.
  const std::string gguf = d.path + "/adapter-export/model-f32.gguf";
  EXPECT_EQ(r.json["output"], gguf);
  EXPECT_TRUE(fs::is_regular_file(d.path + "/adapter-export/model-f32.Modelfile"));
  GGUFReader rd(gguf);
  const ModelWeights m = merge_lora(base, ad);
  for (int l : {0, 4}) {  // attn_v is stored as is (only q/k rows are permuted for llama)
    const auto* t = rd.find_tensor(fmt::format("blk.{}.attn_v.weight", l));
    ASSERT_NE(t, nullptr);
    // The binary may run other BLAS kernels than this process (OPENBLAS_CORETYPE), so the merge
    // W + scale·B·A may differ in the last bit: f32 tolerance, not bit equality.
    EXPECT_TRUE(test::all_close(rd.dequantize(*t), m.layers[l].v.to_vector(), test::kTolF32));
    EXPECT_NE(rd.dequantize(*t), base.layers[l].v.to_vector());
  }
}

TEST(Export, ModelFolderGoesStraightToGguf) {
  TempDir d;
  CliRun r = export_json(model_dir() + " --format gguf --quantization q8_0 --output " + d.path + "/out/");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.json["input_kind"], "model");
  EXPECT_EQ(r.json["base_model"], "");
  GGUFReader rd(d.path + "/out/model-q8_0.gguf");
  EXPECT_EQ(rd.tensors().size(), 47u);
  EXPECT_EQ(rd.find("general.file_type")->value, 7);
  EXPECT_EQ(rd.find_tensor("blk.2.ffn_down.weight")->type, GGMLType::F16);  // rows of 172: not whole q8_0 blocks
  EXPECT_EQ(rd.find_tensor("blk.2.ffn_up.weight")->type, GGMLType::Q8_0);
  EXPECT_EQ(rd.find_tensor("blk.2.attn_q.weight")->type, GGMLType::Q8_0);
}

// ---- Ollama ---------------------------------------------------------------------------------

TEST(Export, OllamaRegistersTheGguf) {
  TempDir d;
  FakeOllama server;
  CliRun r =
      export_json(model_dir() + " --format gguf --quantization q4_0 --output " + d.path +
                  "/m.gguf --ollama --ollama-name stories:test --ollama-host 127.0.0.1:" + std::to_string(server.port));
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(server.created.size(), 1u);
  const auto& c = server.created[0];
  EXPECT_EQ(c["model"], "stories:test");
  const std::string digest = "sha256:" + sha256_file_hex(d.path + "/m.gguf");
  EXPECT_EQ(c["files"]["m.gguf"], digest);
  EXPECT_EQ(server.blobs.at(digest), fs::file_size(d.path + "/m.gguf"));
  EXPECT_EQ(c["parameters"]["num_ctx"], 512);
  EXPECT_EQ(r.json["ollama"]["model"], "stories:test");
  EXPECT_EQ(r.json["ollama"]["digest"], digest);
  EXPECT_EQ(r.json["next"][0], "ollama run stories:test");
  EXPECT_TRUE(fs::is_regular_file(d.path + "/m.Modelfile"));
}

TEST(Export, OllamaHostFallsBackToOllamaHostVariable) {
  TempDir d;
  FakeOllama server;
  // export.ollama_host not set anywhere: OLLAMA_HOST (Ollama's own variable) is used.
  CliRun r = export_json(model_dir() + " --format gguf --output " + d.path + "/m.gguf --ollama",
                         "OLLAMA_HOST=http://127.0.0.1:" + std::to_string(server.port));
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(server.created.size(), 1u);
  EXPECT_EQ(server.created[0]["model"], "stories260k");  // derived from the folder name
  EXPECT_EQ(r.json["ollama"]["endpoint"], "127.0.0.1:" + std::to_string(server.port));
}

// A local port with nothing listening on it.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(Export, OllamaDownIsADependencyErrorWithTheFilesKept) {
  TempDir d;
  // Through the environment this time (BACKPROPAGATE_EXPORT__OLLAMA_HOST). One retry (0.5 s of
  // backoff) instead of the default 4 (7.5 s); the message counts the attempts.
  CliRun r = export_json(
      model_dir() + " --format gguf --quantization q8_0 --output " + d.path + "/m.gguf --ollama --ollama-retries 1",
      "BACKPROPAGATE_EXPORT__OLLAMA_HOST=127.0.0.1:" + std::to_string(closed_port()));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("after 2 attempts"), std::string::npos) << r.out;
  EXPECT_EQ(r.json["code"], "DEP_OLLAMA_REGISTRATION_FAILED") << r.out;
  EXPECT_NE(r.json["suggestion"].get<std::string>().find("ollama create"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_regular_file(d.path + "/m.gguf"));
  EXPECT_TRUE(fs::is_regular_file(d.path + "/m.Modelfile"));
}

// ---- errors ---------------------------------------------------------------------------------

TEST(Export, BadInputsGiveCatalogCodes) {
  TempDir d;
  CliRun r = export_json(d.path + "/nope --format gguf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << r.out;

  fs::create_directories(d.path + "/empty");
  r = export_json(d.path + "/empty --format gguf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << r.out;
  EXPECT_NE(r.out.find("not a run folder"), std::string::npos) << r.out;

  r = export_json(model_dir() + " --format lora");  // a full model is not an adapter
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << r.out;

  r = export_json(model_dir() + " --format merged --ollama");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << r.out;

  r = export_json(model_dir() + " --format gguf --quantization q3_k");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "CONFIG_INVALID_SETTING") << r.out;

  r = export_json(model_dir() + " --format gguf --ollama --ollama-name 'bad name!' --output " + d.path + "/x.gguf");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json["code"], "INPUT_VALIDATION_FAILED") << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/x.gguf")) << "the name is checked before the export";
}

TEST(Export, MissingBaseModelSaysToPassIt) {
  TempDir d;
  ModelWeights base = load_model(model_dir());
  LoraAdapter ad = strong_adapter(base.config, 3);
  ad.base_model_name_or_path = d.path + "/moved-away";
  save_peft_adapter(ad, d.path + "/adapter");
  CliRun r = export_json(d.path + "/adapter --format merged --output " + d.path + "/merged");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.json["code"], "DEP_MODEL_LOAD_FAILED") << r.out;
  EXPECT_NE(r.json["message"].get<std::string>().find("--model"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/merged"));
  // Passing the base fixes it; an adapter for another model fails the shape check.
  r = export_json(d.path + "/adapter --format lora --output " + d.path + "/copy --model " + model_dir());
  EXPECT_EQ(r.rc, 0) << r.out;
  std::ifstream copied(d.path + "/copy/adapter_config.json");
  EXPECT_EQ(nlohmann::json::parse(copied)["base_model_name_or_path"],
            fs::absolute(model_dir()).lexically_normal().string())
      << "a stale base path is replaced by the base actually used";
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"vocab_size", 512},
                        {"hidden_size", 32},
                        {"intermediate_size", 64},
                        {"num_hidden_layers", 5},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2}};
  fs::create_directories(d.path + "/other");
  std::ofstream(d.path + "/other/config.json") << cfg.dump();
  r = export_json(d.path + "/adapter --format lora --output " + d.path + "/copy2 --model " + d.path + "/other");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.json["code"], "DEP_MODEL_LOAD_FAILED") << r.out;
}

TEST(Export, FullDiskIsStateDiskFullAndLeavesNoFile) {
  TempDir d;
  CliRun r = export_json(model_dir() + " --format gguf --output " + d.path + "/m.gguf",
                         "BACKPROPAGATE_TRAINING__FAULT_INJECT_ENOSPC_AFTER_BYTES=4096");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.json["code"], "STATE_DISK_FULL") << r.out;
  for (const auto& e : fs::directory_iterator(d.path)) ADD_FAILURE() << "left behind: " << e.path();
}

}  // namespace
}  // namespace bp::test
