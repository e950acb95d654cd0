// Task metric (train/task_eval.h): normalisation, held-out splitting, and greedy answers checked
// against llama2.c run.c's golden continuations of stories260K (an independent implementation).
#include "train/task_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/loader.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string stories_dir() {
  return bp::test::shared_dir() + "/models/stories260K";
}

TEST(TaskEval, NormalisationTrimsCollapsesSpacesAndLowercases) {
  EXPECT_EQ(normalize_answer("  Answer:   In the\tPark. \n"), "answer: in the park.");
  EXPECT_EQ(normalize_answer(""), "");
  EXPECT_EQ(normalize_answer(" \n "), "");
  EXPECT_TRUE(answers_match("Tom ", "tom"));
  EXPECT_TRUE(answers_match("a  Red\nball", "a red ball"));
  EXPECT_FALSE(answers_match("red.", "red"));  // punctuation is part of the answer
  EXPECT_FALSE(answers_match("Answer: red.", "red"));
  EXPECT_FALSE(answers_match("", "red"));
}

TEST(TaskEval, ExamplesSplitAtTheLastAssistantMessage) {
  std::vector<Conversation> convs = {
      {{"user", "Tom has a ball. What does Tom have?"}, {"assistant", "Answer: a ball."}},
      {{"system", "Be short."},
       {"user", "q1"},
       {"assistant", "a1"},
       {"user", "q2"},
       {"assistant", "a2"},
       {"user", "dangling"}},
  };
  const auto ex = task_examples_from_conversations(convs);
  ASSERT_EQ(ex.size(), 2u);
  ASSERT_EQ(ex[0].prompt.size(), 1u);
  EXPECT_EQ(ex[0].reference, "Answer: a ball.");
  ASSERT_EQ(ex[1].prompt.size(), 4u);  // system, q1, a1, q2
  EXPECT_EQ(ex[1].prompt.back().content, "q2");
  EXPECT_EQ(ex[1].reference, "a2");
}

// A prompt keeps its conversation's tools and template variables (issue 43): eval renders it as
// training rendered the row; --tools gives a held-out file's rows without tools the list.
TEST(TaskEval, PromptsKeepTheRowsToolsAndTemplateVariables) {
  test::TempDir dir;
  const std::string path = dir.path + "/held.jsonl";
  std::ofstream(path) << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], )"
                         R"("tools": [{"type": "function", "function": {"name": "f"}}], )"
                         R"("chat_template_kwargs": {"enable_thinking": false}})"
                         "\n"
                      << R"({"messages": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "B"}]})"
                         "\n";
  const std::string tools = dir.path + "/tools.json";
  std::ofstream(tools) << R"([{"type": "function", "function": {"name": "g"}}])";
  ChatDataOptions chat;
  chat.tools_path = tools;
  const auto ex = load_task_examples(path, DatasetFormat::Auto, false, chat);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].prompt.tools[0]["function"]["name"], "f");
  EXPECT_EQ(ex[0].prompt.template_kwargs, (nlohmann::ordered_json{{"enable_thinking", false}}));
  EXPECT_EQ(ex[1].prompt.tools[0]["function"]["name"], "g");
}

TEST(TaskEval, ConversationsWithoutAPromptOrAnAnswerAreInputErrors) {
  for (const Conversation& bad :
       {Conversation{{"user", "only a question"}}, Conversation{{"assistant", "no prompt"}}}) {
    try {
      task_examples_from_conversations({{{"user", "fine"}, {"assistant", "ok"}}, bad});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
      EXPECT_NE(std::string(e.what()).find("conversation 1"), std::string::npos) << e.what();
    }
  }
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

TEST(TaskEval, HeldOutFilesLoadInEveryConversationFormat) {
  test::TempDir dir;
  write_file(
      dir.path + "/s.jsonl",
      R"({"conversations": [{"from": "human", "value": "Where is Tom?"}, {"from": "gpt", "value": "Answer: home."}]})"
      "\n");
  write_file(dir.path + "/a.jsonl", R"({"instruction": "Where is Tom?", "input": "Tom is home.", "output": "home"})"
                                    "\n");
  write_file(dir.path + "/t.jsonl", R"({"text": "Tom is home."})"
                                    "\n");
  const auto s = load_task_examples(dir.path + "/s.jsonl");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].prompt.at(0).content, "Where is Tom?");
  EXPECT_EQ(s[0].reference, "Answer: home.");
  const auto a = load_task_examples(dir.path + "/a.jsonl");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].prompt.at(0).content, "Where is Tom?\n\nTom is home.");
  EXPECT_EQ(a[0].reference, "home");
  try {
    load_task_examples(dir.path + "/t.jsonl");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_INVALID);
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  // The shipped quick-start held-out files load, with one example per row.
  for (const char* name : {"sharegpt", "alpaca"}) {
    const auto ex =
        load_task_examples(test::source_dir() + "/examples/quickstart_" + std::string(name) + "_holdout.jsonl");
    EXPECT_EQ(ex.size(), 50u) << name;
  }
}

// A template that renders "<s>" + the user text, so the prompt ids equal run.c's (BOS first).
const char* const kPlainTemplate = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}";

struct Stories {
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(stories_dir());
  Model model{load_model(stories_dir()), ModelOptions{TrainMode::Frozen}};
  ChatTemplate tmpl{kPlainTemplate, "<s>", "</s>"};
};

nlohmann::json golden_samples() {
  std::ifstream f(stories_dir() + "/golden/greedy.json");
  EXPECT_TRUE(f.good()) << "missing " << stories_dir() << "/golden/greedy.json";
  return nlohmann::json::parse(f).at("samples");
}

TEST(TaskEval, GreedyAnswersEqualRunCsGoldenContinuations) {
  Stories s;
  ASSERT_FALSE(s.tmpl.is_fallback()) << s.tmpl.warning();
  std::vector<TaskExample> examples;
  for (const auto& g : golden_samples()) {
    const std::string prompt = g.at("prompt").get<std::string>();
    const std::string text = g.at("text").get<std::string>();
    ASSERT_EQ(text.rfind(prompt, 0), 0u);
    examples.push_back({{{"user", prompt}}, text.substr(prompt.size())});  // run.c's continuation
  }
  ASSERT_EQ(examples.size(), 3u);
  // A wrong reference: the golden continuation with its last word changed.
  TaskExample wrong = examples[0];
  wrong.reference = wrong.reference.substr(0, wrong.reference.rfind(' ')) + " laughed";
  examples.push_back(wrong);

  TaskEvalOptions opts;
  opts.max_new_tokens = 64;  // the golden files hold 64 tokens per prompt
  const TaskEvalResult r = evaluate_task(s.model, *s.tok, s.tmpl, examples, opts);
  ASSERT_EQ(r.num_examples, 4);
  EXPECT_EQ(r.num_exact, 3);
  EXPECT_DOUBLE_EQ(r.exact_match(), 0.75);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(r.answers[i].exact) << i;
    // The decoder's Strip drops the one leading space of the continuation (" was" -> "was").
    const std::string& ref = examples[i].reference;
    EXPECT_EQ(r.answers[i].output, ref.substr(ref[0] == ' ' ? 1 : 0)) << i;
    EXPECT_EQ(r.answers[i].new_tokens, 64) << i;
    EXPECT_EQ(r.answers[i].prompt, examples[i].prompt[0].content);
  }
  EXPECT_FALSE(r.answers[3].exact);
  EXPECT_EQ(r.answers[3].output, r.answers[0].output);

  opts.max_examples = 1;
  opts.max_new_tokens = 5;  // a shorter answer is a prefix of the golden one and no longer matches
  const TaskEvalResult one = evaluate_task(s.model, *s.tok, s.tmpl, examples, opts);
  ASSERT_EQ(one.num_examples, 1);
  EXPECT_EQ(one.num_exact, 0);
  EXPECT_EQ(r.answers[0].output.rfind(one.answers[0].output, 0), 0u) << one.answers[0].output;
  EXPECT_LT(one.answers[0].output.size(), examples[0].reference.size());
}

TEST(TaskEval, PromptsLongerThanTheContextAndBadOptionsAreInputErrors) {
  Stories s;
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "Once upon a time ";
  const std::vector<TaskExample> examples = {{{{"user", "The dog"}}, "x"}, {{{"user", long_text}}, "x"}};
  try {
    evaluate_task(s.model, *s.tok, s.tmpl, examples, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("example 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
  TaskEvalOptions bad;
  bad.max_new_tokens = 0;
  EXPECT_THROW(evaluate_task(s.model, *s.tok, s.tmpl, examples, bad), Error);
}

}  // namespace
}  // namespace bp
