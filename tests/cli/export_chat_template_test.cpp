// Issue 15: `backprop export` ships the chat template the run trained with, not the base model's.
//
// The base is stories260K with a real Gemma-3 template in its tokenizer_config.json. Short runs
// (LoRA, and one full fine-tuning) choose another template: `--chat-template phi3.5.jinja` (a real Phi-3.5 template)
// and
// `--chat-template chatml`. Each run is exported to GGUF and to a merged model folder, and the
// template is read back from every output: the GGUF's tokenizer.chat_template (our reader, and
// @huggingface/gguf for one file), the merged folder's chat_template.jinja and tokenizer_config.json
// key, and the Ollama Modelfile's TEMPLATE family; a checkpoint of the run and a multi-run's final
// adapter too. Exporting the base itself still gives Gemma's, so the checks can tell the two apart.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gguf_reader.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"
#include "text/chat_template.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string real_template(const std::string& name) {
  return slurp(source_dir() + "/tests/text/data/templates/" + name + ".jinja");
}

nlohmann::json run_json(const std::string& args) {
  std::string out;
  const int rc = run_command(fmt::format("({} {} 2>/dev/null)", backprop_exe(), args), &out);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON: " << out;
    return nlohmann::json::object();
  }
}

class ExportChatTemplate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    // The base: stories260K's files, with Gemma-3's template added to tokenizer_config.json.
    base_ = dir_->path + "/base";
    fs::create_directories(base_);
    const std::string stories = shared_dir() + "/models/stories260K";
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
      fs::create_symlink(stories + "/" + f, base_ + "/" + f);
    nlohmann::ordered_json tc = nlohmann::ordered_json::parse(slurp(stories + "/tokenizer_config.json"));
    tc["chat_template"] = real_template("gemma3");
    std::ofstream(base_ + "/tokenizer_config.json") << tc.dump(2);
    // A chat dataset whose roles alternate (every template here accepts it).
    data_ = dir_->path + "/chat.jsonl";
    std::ofstream d(data_);
    const char* names[] = {"Lily", "Tom", "Ben", "Sue"};
    for (int i = 0; i < 8; ++i)
      d << "{\"messages\": [{\"role\": \"user\", \"content\": \"Who had the ball?\"}, {\"role\": \"assistant\", "
           "\"content\": \""
        << names[i % 4] << " had a red ball.\"}]}\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A 2-step LoRA run with `--chat-template choice`; returns its folder.
  static std::string train(const std::string& choice, const std::string& extra = "--lora-r 4") {
    const nlohmann::json j =
        run_json(fmt::format("train --device cpu --json --model {} --data {} --output {}/runs --steps 2 --batch-size 2 "
                             "--threads 1 --lr 0.01 --save-every 1 --chat-template {} {}",
                             base_, data_, dir_->path, choice, extra));
    return j.value("output_dir", "");
  }

  // Exports `run` to GGUF and merged and checks every output carries `expected`.
  static void expect_exports_carry(const std::string& run, const std::string& expected, const char* family) {
    ASSERT_FALSE(run.empty());
    const nlohmann::json g = run_json("export --json " + run + " --format gguf");
    const std::string gguf = g.value("output", "");
    GGUFReader rd(gguf);
    const auto* kv = rd.find("tokenizer.chat_template");
    ASSERT_NE(kv, nullptr);
    EXPECT_EQ(kv->value, expected);
    EXPECT_EQ(g.value("chat_template_family", ""), family);
    const std::string modelfile = slurp(g.value("modelfile", ""));
    EXPECT_EQ(modelfile.find("<start_of_turn>"), std::string::npos) << modelfile;  // not Gemma's

    const nlohmann::json m = run_json("export --json " + run + " --format merged");
    const std::string merged = m.value("output", "");
    EXPECT_EQ(slurp(merged + "/chat_template.jinja"), expected);
    const nlohmann::json tc = nlohmann::json::parse(slurp(merged + "/tokenizer_config.json"));
    EXPECT_EQ(tc.value("chat_template", ""), expected);
  }

  static TempDir* dir_;
  static std::string base_, data_;
};
TempDir* ExportChatTemplate::dir_ = nullptr;
std::string ExportChatTemplate::base_;
std::string ExportChatTemplate::data_;

TEST_F(ExportChatTemplate, TemplateFileChosenForTrainingIsTheOneExported) {
  const std::string file = source_dir() + "/tests/text/data/templates/phi3.5.jinja";
  const std::string run = train(file);
  // The run names it and keeps it beside the adapter.
  const nlohmann::json settings = nlohmann::json::parse(slurp(run + "/settings.json"));
  EXPECT_EQ(settings["chat_template_used"]["source"], "--chat-template");
  EXPECT_EQ(slurp(run + "/adapter/chat_template.jinja"), real_template("phi3.5"));
  expect_exports_carry(run, real_template("phi3.5"), "derived");
  // @huggingface/gguf reads the same template from the file.
  const nlohmann::json o = gguf_testing::oracle_read(run + "/export/model-f16.gguf");
  EXPECT_EQ(o["metadata"]["tokenizer.chat_template"]["value"], real_template("phi3.5"));
  // A checkpoint of the run (exported through a staging folder) finds it in the run folder.
  const nlohmann::json c = run_json(
      fmt::format("export --json {}/checkpoints/checkpoint-1 --format gguf --output {}/ck.gguf", run, dir_->path));
  GGUFReader ck(c.value("output", ""));
  ASSERT_NE(ck.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(ck.find("tokenizer.chat_template")->value, real_template("phi3.5"));
}

TEST_F(ExportChatTemplate, ChatMLChosenForTrainingIsTheOneExported) {
  expect_exports_carry(train("chatml"), kChatMLTemplate, "chatml");
}

TEST_F(ExportChatTemplate, FullFineTuningRecordsItInTheModelFolder) {
  const std::string run = train(source_dir() + "/tests/text/data/templates/phi3.5.jinja", "--mode full");
  // model/ got the base's tokenizer files, its template replaced by the one trained with.
  const nlohmann::json tc = nlohmann::json::parse(slurp(run + "/model/tokenizer_config.json"));
  EXPECT_EQ(tc.value("chat_template", ""), real_template("phi3.5"));
  expect_exports_carry(run, real_template("phi3.5"), "derived");
}

TEST_F(ExportChatTemplate, MultiRunFinalAdapterShipsTheRunsTemplate) {
  const std::string mr = dir_->path + "/mr";
  run_json(
      fmt::format("multi-run --device cpu --json --model {} --data {} --output {} --runs 2 --samples 3 --steps 1 "
                  "--batch-size 2 --threads 1 --lora-r 4 --chat-template chatml",
                  base_, data_, mr));
  EXPECT_EQ(slurp(mr + "/adapter/chat_template.jinja"), kChatMLTemplate);
  const nlohmann::json g =
      run_json(fmt::format("export --json {}/adapter --format gguf --output {}/mr.gguf", mr, dir_->path));
  GGUFReader rd(g.value("output", ""));
  ASSERT_NE(rd.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(rd.find("tokenizer.chat_template")->value, kChatMLTemplate);
}

TEST_F(ExportChatTemplate, TheBaseModelExportsItsOwnTemplate) {
  // Control: the base folder itself goes to GGUF with Gemma's template (what a run must not ship).
  const nlohmann::json g =
      run_json(fmt::format("export --json {} --format gguf --output {}/base.gguf", base_, dir_->path));
  GGUFReader rd(g.value("output", ""));
  ASSERT_NE(rd.find("tokenizer.chat_template"), nullptr);
  EXPECT_EQ(rd.find("tokenizer.chat_template")->value, real_template("gemma3"));
  EXPECT_EQ(g.value("chat_template_family", ""), "gemma");
}

}  // namespace
}  // namespace bp::test
