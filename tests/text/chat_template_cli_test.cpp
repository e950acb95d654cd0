// `backprop train` and chat templates through the real CLI (issues 15 and 13): --chat-template
// FILE is used and named in the log and the run's settings.json, and the render budget settings
// (data.template_max_steps / data.template_max_bytes, here through their environment variables)
// stop a template with INPUT_CHAT_TEMPLATE_BUDGET before training. Uses stories260K (tiny).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace bp::test {
namespace {

std::string train_cmd(const std::string& dir, const std::string& extra) {
  return backprop_exe() + " train --model " + shared_dir() + "/models/stories260K --data " + dir +
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

}  // namespace
}  // namespace bp::test
