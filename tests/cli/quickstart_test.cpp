// End-to-end test of the README's quick start (issue 8): `backprop train` with no model and no
// data fine-tunes models/tiny-chat with LoRA on examples/quickstart_sharegpt.jsonl, measures the
// held-out set before and after, and writes a PEFT adapter and a GGUF file. Run here with a few
// steps so it takes seconds; the assertions are the promises of the full run: held-out loss
// falls, and every output exists, loads, and reproduces the answer the command printed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/gguf_reader.h"
#include "model/loader.h"
#include "model/peft.h"
#include "support/test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/task_eval.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The no-argument flow lives in src/cli/train_quickstart.cpp; its --json output is the training
// summary plus exact_match_before/after, example{prompt,reference,before,after} and gguf.
TEST(Quickstart, NoArgumentTrainFineTunesEvaluatesAndExports) {
  test::TempDir dir;
  const std::string src = test::source_dir();
  // From the repository folder, as the README says; fewer steps than the real quick start.
  // Grouped: run_command appends its own 2>&1, which must not undo these redirections.
  const std::string cmd = "(cd " + src + " && " + test::backprop_exe() +
                          " train --device cpu --steps 8 --warmup-steps 2 --output " + dir.path + "/runs --json > " +
                          dir.path + "/out.json 2> " + dir.path + "/err.txt)";
  std::string out;
  const int rc = test::run_command(cmd, &out);
  const std::string err = read_text(dir.path + "/err.txt");
  ASSERT_EQ(rc, 0) << cmd << "\n" << out << err;
  const json j = json::parse(read_text(dir.path + "/out.json"));

  // Held-out loss falls.
  ASSERT_TRUE(j.contains("initial_eval_loss") && j["initial_eval_loss"].is_number()) << j.dump(2);
  ASSERT_TRUE(j.contains("final_eval_loss") && j["final_eval_loss"].is_number()) << j.dump(2);
  EXPECT_LT(j["final_eval_loss"].get<double>(), j["initial_eval_loss"].get<double>()) << j.dump(2);
  EXPECT_EQ(j.at("steps").get<int64_t>(), 8);
  for (const char* k : {"exact_match_before", "exact_match_after"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GE(j[k].get<double>(), 0.0);
    EXPECT_LE(j[k].get<double>(), 1.0);
  }

  // The outputs exist and load: the PEFT adapter (on the shipped base model) ...
  const std::string run_dir = j.at("output_dir").get<std::string>();
  EXPECT_EQ(fs::path(run_dir).parent_path(), fs::path(dir.path + "/runs"));
  const std::string adapter_dir = run_dir + "/adapter";
  ASSERT_TRUE(fs::exists(adapter_dir + "/adapter_model.safetensors")) << adapter_dir;
  ASSERT_TRUE(fs::exists(adapter_dir + "/adapter_config.json")) << adapter_dir;
  const std::string model_dir = src + "/models/tiny-chat";
  Model model(load_model(model_dir), ModelOptions{TrainMode::Lora});
  LoraAdapter adapter = load_peft_adapter(adapter_dir, model.config());
  model.attach_lora(adapter);
  model.set_training(false);

  // ... answers the example prompt exactly as the command reported after training.
  ASSERT_TRUE(j.contains("example")) << j.dump(2);
  auto tok = Tokenizer::from_dir(model_dir);
  const ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  const auto examples = load_task_examples(src + "/examples/quickstart_sharegpt_holdout.jsonl");
  TaskEvalOptions teo;
  teo.max_examples = 1;
  teo.max_new_tokens = 24;
  const TaskEvalResult r = evaluate_task(model, *tok, tmpl, examples, teo);
  ASSERT_EQ(r.num_examples, 1);
  EXPECT_EQ(r.answers[0].prompt, j["example"].at("prompt").get<std::string>());
  EXPECT_EQ(r.answers[0].output, j["example"].at("after").get<std::string>());

  // ... and the GGUF file parses, with the llama architecture and every layer's tensors.
  const std::string gguf = j.at("gguf").get<std::string>();
  ASSERT_TRUE(fs::exists(gguf)) << gguf;
  GGUFReader reader(gguf);
  const GGUFValue* arch = reader.find("general.architecture");
  ASSERT_NE(arch, nullptr);
  EXPECT_EQ(arch->value.get<std::string>(), "llama");
  EXPECT_NE(reader.find_tensor("token_embd.weight"), nullptr);
  EXPECT_NE(reader.find_tensor("blk.5.ffn_down.weight"), nullptr);
  const GGUFValue* tokens = reader.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->value.size(), 515u);
}

}  // namespace
}  // namespace bp
