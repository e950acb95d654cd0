// `backprop generate` end to end on stories260K: greedy output equals llama2.c's golden text and
// ids, sampling is reproducible by seed, an adapter changes the output exactly as the in-process
// model with that adapter does, and bad input gives the documented exit codes. The shipped chat
// model (models/tiny-chat) gets its prompt through its chat template, as training rendered it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/generate.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "support/test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp::test {
namespace {

std::string model_dir() {
  return shared_dir() + "/models/stories260K";
}

nlohmann::json run_json(const std::string& args, int* rc_out = nullptr) {
  std::string out;
  const int rc =
      run_command(backprop_exe() + " generate --json --model " + model_dir() + " " + args + " 2>/dev/null", &out);
  if (rc_out) *rc_out = rc;
  EXPECT_EQ(rc, 0) << out;
  return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json();
}

TEST(GenerateCli, GreedyMatchesGoldenTextAndIds) {
  std::ifstream f(model_dir() + "/golden/greedy.json");
  auto golden = nlohmann::json::parse(f);
  auto s = golden["samples"][0];
  auto j = run_json("--prompt \"Once upon a time\" --temperature 0 --max-new-tokens 64");
  EXPECT_EQ(j["prompt_ids"], s["input_ids"]);
  EXPECT_EQ(j["output_ids"], s["output_ids"]);
  EXPECT_EQ(j["text"], s["text"]);
  EXPECT_EQ(j["stop_reason"], "max_new_tokens");
}

TEST(GenerateCli, SamplingIsReproducibleBySeed) {
  auto a = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7 --max-new-tokens 30");
  auto b = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7 --max-new-tokens 30");
  auto c = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 8 --max-new-tokens 30");
  EXPECT_EQ(a["output_ids"], b["output_ids"]);
  EXPECT_NE(a["output_ids"], c["output_ids"]);
}

TEST(GenerateCli, AdapterChangesOutputLikeTheInProcessModel) {
  ModelWeights w = load_model(model_dir());
  const ModelConfig cfg = w.config;
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  LoraAdapter ad = init_lora(cfg, lc, 3);
  for (auto& layer : ad.layers)  // non-zero B so the adapter matters
    for (auto& B : layer.B)
      if (B.defined()) B = random_tensor(B.shape(), 11, -0.3f, 0.3f);
  TempDir dir;
  save_peft_adapter(ad, dir.path);
  Model model(std::move(w), ModelOptions{TrainMode::Lora});
  model.attach_lora(ad);
  GenerateOptions o;
  o.max_new_tokens = 20;
  auto j = run_json("--prompt \"Lily wanted to\" --temperature 0 --max-new-tokens 20 --adapter " + dir.path);
  auto expected = generate(model, j["prompt_ids"].get<std::vector<int32_t>>(), o);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), expected.tokens);
  auto base = run_json("--prompt \"Lily wanted to\" --temperature 0 --max-new-tokens 20");
  EXPECT_NE(base["output_ids"], j["output_ids"]);
}

TEST(GenerateCli, BadInputExitCodes) {
  std::string out;
  EXPECT_EQ(run_command(backprop_exe() + " generate --model " + model_dir() + " --prompt hi --temperature -1", &out), 1)
      << out;
  EXPECT_NE(out.find("INPUT_VALIDATION_FAILED"), std::string::npos) << out;
  EXPECT_EQ(run_command(backprop_exe() + " generate --model /nonexistent/model --prompt hi", &out), 2) << out;
  EXPECT_NE(out.find("DEP_MODEL_LOAD_FAILED"), std::string::npos) << out;
}

TEST(GenerateCli, StopsAtTheContextAndSaysSo) {
  // stories260K's context is 512 tokens: asking for more ends there, and the reason says so.
  auto j = run_json("--prompt \"Once upon a time\" --temperature 0 --max-new-tokens 600");
  EXPECT_EQ(j["stop_reason"], "context_full");
  EXPECT_LT(j["new_tokens"].get<int64_t>(), 600);
  EXPECT_EQ(j["prompt_ids"].size() + j["new_tokens"].get<size_t>(), 513u);  // the last one is sampled, not fed
}

TEST(GenerateCli, SeedTakesTheWholeUnsignedRange) {
  // 2^63 and 2^63+1 were both clamped to INT64_MAX: the same text. Now they are two seeds.
  const std::string args = "--prompt \"The dog\" --temperature 1.0 --max-new-tokens 20 --seed ";
  auto a = run_json(args + "9223372036854775808");
  auto b = run_json(args + "9223372036854775809");
  EXPECT_EQ(a["seed"].get<uint64_t>(), 9223372036854775808ull);
  EXPECT_NE(a["output_ids"], b["output_ids"]);
  EXPECT_EQ(run_json(args + "18446744073709551615")["seed"].get<uint64_t>(), 18446744073709551615ull);
  for (const char* bad : {"18446744073709551616", "-1", "12x"}) {
    std::string out;
    EXPECT_EQ(run_command(backprop_exe() + " generate --model " + model_dir() + " --prompt hi --seed " + bad, &out), 1)
        << bad << out;
    EXPECT_NE(out.find("--seed must be an integer from 0 to 18446744073709551615"), std::string::npos) << out;
  }
}

class GenerateChat : public ::testing::Test {
 protected:
  static std::string tiny_chat() { return source_dir() + "/models/tiny-chat"; }
  static nlohmann::json run(const std::string& args) {
    std::string out;
    const int rc = run_command(backprop_exe() + " generate --json --temperature 0 --max-new-tokens 12 --model " +
                                   tiny_chat() + " " + args + " 2>/dev/null",
                               &out);
    EXPECT_EQ(rc, 0) << out;
    return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json();
  }
  // The ids training feeds for this chat: the template's render, tokenized without extra special tokens.
  static std::vector<int32_t> trainer_ids(const Conversation& chat, const std::string& template_file = "") {
    const auto tok = Tokenizer::from_dir(tiny_chat());
    const ChatTemplate t = ChatTemplate::from_tokenizer(*tok, template_file);
    return tok->encode(t.render(chat, true), false);
  }
  // A run folder in `dir` with a fresh adapter of tiny-chat, trained (as it says) with `chat_template`.
  static void make_run(const std::string& dir, const std::string& chat_template) {
    ModelWeights w = load_model(tiny_chat());
    LoraConfig lc;
    lc.r = 2;
    std::filesystem::create_directories(dir + "/adapter");
    save_peft_adapter(init_lora(w.config, lc, 1), dir + "/adapter");
    std::ofstream(dir + "/summary.json") << "{}";
    std::ofstream(dir + "/chat_template.jinja") << chat_template;
  }
  static constexpr const char* kQuestion =
      "Kate has an orange lamp. Eric has a pet owl. Lena likes grapes. What pet does Eric have?";
};

// The README quick start's question: through the template the demo model answers; as raw text it
// stops at once (the model only ever saw chats).
TEST_F(GenerateChat, TheChatTemplateWrapsThePromptAsTrainingDid) {
  auto chat = run(fmt::format("--prompt \"{}\"", kQuestion));
  EXPECT_TRUE(chat["chat_template_applied"].get<bool>());
  EXPECT_NE(chat["chat_template_source"].get<std::string>().find("tokenizer_config.json"), std::string::npos);
  EXPECT_EQ(chat["prompt_ids"].get<std::vector<int32_t>>(), trainer_ids({{"user", kQuestion}}));
  EXPECT_NE(chat["completion"].get<std::string>().find("owl"), std::string::npos) << chat["completion"];

  auto raw = run(fmt::format("--chat off --prompt \"{}\"", kQuestion));
  EXPECT_FALSE(raw["chat_template_applied"].get<bool>());
  EXPECT_EQ(raw["prompt_ids"], nlohmann::json(Tokenizer::from_dir(tiny_chat())->encode(kQuestion, true)));
  EXPECT_EQ(raw["completion"], "");
  EXPECT_EQ(raw["stop_reason"], "stop_token");

  auto sys = run(fmt::format("--system \"Be brief.\" --prompt \"{}\"", kQuestion));
  EXPECT_EQ(sys["prompt_ids"].get<std::vector<int32_t>>(), trainer_ids({{"system", "Be brief."}, {"user", kQuestion}}));
}

// An adapter's run trained with another template: that one is used, as export ships it.
TEST_F(GenerateChat, TheAdaptersTemplateWinsOverTheModels) {
  TempDir dir;
  make_run(dir.path, kChatMLTemplate);  // the template in the run folder only
  auto j = run(fmt::format("--adapter {}/adapter --chat on --prompt hi", dir.path));
  EXPECT_NE(j["chat_template_source"].get<std::string>().find(dir.path), std::string::npos) << j;
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), trainer_ids({{"user", "hi"}}, "chatml"));
}

// --template-kwargs reach the template at generation as in training (issue 43: Qwen3's
// enable_thinking); a value that is no JSON object is refused.
TEST_F(GenerateChat, TemplateKwargsReachTheTemplate) {
  TempDir dir;
  const std::string tmpl = std::string(kChatMLTemplate) + "{% if add_generation_prompt and thinking is defined %}" +
                           "<think>{{ thinking }}</think>{% endif %}";
  make_run(dir.path, tmpl);
  const auto tok = Tokenizer::from_dir(tiny_chat());
  ChatTemplate t(tmpl, "", "");
  const auto ids = [&] { return tok->encode(t.render({{"user", "hi"}}, true), false); };
  const auto plain = ids();
  t.set_template_kwargs(nlohmann::ordered_json{{"thinking", "no"}});
  const auto with = ids();
  ASSERT_NE(plain, with);
  const std::string adapter = fmt::format("--adapter {}/adapter --chat on --prompt hi", dir.path);
  EXPECT_EQ(run(adapter)["prompt_ids"].get<std::vector<int32_t>>(), plain);
  EXPECT_EQ(run(adapter + " --template-kwargs '{\"thinking\": \"no\"}'")["prompt_ids"].get<std::vector<int32_t>>(),
            with);
  std::string out;
  EXPECT_NE(run_command(backprop_exe() + " generate --model " + tiny_chat() + " --prompt hi --template-kwargs x", &out),
            0);
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
}

TEST_F(GenerateChat, ChatOnWithoutATemplateIsAClearError) {
  std::string out;
  EXPECT_EQ(run_command(backprop_exe() + " generate --model " + model_dir() + " --prompt hi --chat on", &out), 1)
      << out;
  EXPECT_NE(out.find("has no chat template"), std::string::npos) << out;
  EXPECT_NE(out.find("--chat off"), std::string::npos) << out;  // the suggestion
  // --system has nowhere to go in raw text: refused, not dropped.
  EXPECT_EQ(run_command(backprop_exe() + " generate --model " + model_dir() + " --prompt hi --system terse", &out), 1)
      << out;
  EXPECT_NE(out.find("--system needs the chat template"), std::string::npos) << out;
  // auto on a model without one: the raw text, as before.
  auto j = run_json("--prompt hi --temperature 0 --max-new-tokens 2");
  EXPECT_FALSE(j["chat_template_applied"].get<bool>());
}

}  // namespace
}  // namespace bp::test
