// `backprop train` and chat templates through the real CLI (issues 15 and 13): --chat-template
// FILE is used and named in the log and the run's settings.json, and the render budget settings
// (data.template_max_steps / data.template_max_bytes, here through their environment variables)
// stop a template with INPUT_CHAT_TEMPLATE_BUDGET before training. Uses stories260K (tiny).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf_reader.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

std::string train_cmd(const std::string& dir, const std::string& extra) {
  return backprop_exe() + " train --device cpu --model " + shared_dir() + "/models/stories260K --data " + dir +
         "/chat.jsonl --batch-size 2 --micro-batch-size 2 --warmup-steps 0 --lora-r 4 --max-seq-length 64 "
         "--threads 1 --steps 1 --save-every 0 --holdout 0 --output " +
         dir + "/runs " + extra + " 2>&1";
}

TEST(ChatTemplateCli, ChosenTemplateIsUsedNamedAndBudgeted) {
  TempDir dir;
  {
    std::ofstream data(dir.path + "/chat.jsonl");
    for (int i = 0; i < 4; ++i)
      data << R"({"conversations": [{"from": "human", "value": "Who is Lily?"}, {"from": "gpt", "value": "A girl."}]})"
           << "\n";
  }
  // 3,000 loop steps and a 2,000-byte string: fine by default, past the small budgets below.
  std::ofstream(dir.path + "/mine.jinja") << "{% for i in range(3000) %}{% endfor %}{% set pad = 'x' * 2000 %}"
                                             "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                             "{% if add_generation_prompt %}assistant: {% endif %}";
  std::string out;
  ASSERT_EQ(run_command(train_cmd(dir.path, "--chat-template " + dir.path + "/mine.jinja"), &out), 0) << out;
  EXPECT_NE(out.find("chat template: --chat-template " + dir.path + "/mine.jinja"), std::string::npos) << out;
  std::string settings_path;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path + "/runs"))
    if (e.path().filename() == "settings.json") settings_path = e.path().string();
  ASSERT_FALSE(settings_path.empty()) << out;
  const nlohmann::json settings = nlohmann::json::parse(std::ifstream(settings_path));
  EXPECT_EQ(settings["chat_template_used"]["source"], "--chat-template") << settings.dump(2);
  EXPECT_EQ(settings["chat_template_used"]["origin"], dir.path + "/mine.jinja");

  for (const char* env :
       {"BACKPROPAGATE_DATA__TEMPLATE_MAX_STEPS=2000", "BACKPROPAGATE_DATA__TEMPLATE_MAX_BYTES=1024"}) {
    SCOPED_TRACE(env);
    const int rc =
        run_command(std::string(env) + " " + train_cmd(dir.path, "--chat-template " + dir.path + "/mine.jinja"), &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("INPUT_CHAT_TEMPLATE_BUDGET"), std::string::npos) << out;
    EXPECT_NE(out.find("mine.jinja"), std::string::npos) << out;  // the message names the template
  }
}

// The train/serve mismatch of issue 15: a model folder whose template is only in
// chat_template.jinja (current transformers) ships that template in the GGUF export, read by the
// same reader training uses (and winning over a key left in tokenizer_config.json).
TEST(ChatTemplateCli, ExportShipsTheJinjaFileTemplate) {
  TempDir dir;
  const std::string model = dir.path + "/model";
  std::filesystem::copy(shared_dir() + "/models/stories260K", model, std::filesystem::copy_options::recursive);
  const std::string tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  std::ofstream(model + "/chat_template.jinja") << tmpl;
  // An older template left in tokenizer_config.json: the .jinja file wins, as in transformers.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model + "/tokenizer_config.json"));
  config["chat_template"] = "{% for m in messages %}OLD{% endfor %}";
  std::ofstream(model + "/tokenizer_config.json", std::ios::trunc) << config.dump();
  std::string out;
  ASSERT_EQ(run_command(backprop_exe() + " export " + model + " --format gguf --quantization f32 --output " + dir.path +
                            "/m.gguf 2>&1",
                        &out),
            0)
      << out;
  GGUFReader r(dir.path + "/m.gguf");
  const GGUFValue* v = r.find("tokenizer.chat_template");
  ASSERT_NE(v, nullptr) << out;
  EXPECT_EQ(v->value.get<std::string>(), tmpl);
}

}  // namespace
}  // namespace bp::test
