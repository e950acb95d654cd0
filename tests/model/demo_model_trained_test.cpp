// The trained weights of the demo base model (models/tiny-chat, made by scripts/make_base_model.sh):
// they load, fit the 25 MB budget, continue a story in the corpus' English, answer reading
// questions with full sentences, and do not already know the quick-start answer format.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "model/generate.h"
#include "model/loader.h"
#include "support/test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/task_eval.h"

namespace bp {
namespace {

std::string demo_dir() {
  return test::source_dir() + "/models/tiny-chat";
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else if (!w.empty()) {
      out.push_back(w);
      w.clear();
    }
  }
  return out;
}

struct Demo {
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(demo_dir());
  Model model{load_model(demo_dir()), ModelOptions{TrainMode::Frozen}};
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
};

TEST(DemoModelTrained, LoadsAndFitsTheSizeBudget) {
  const auto bytes = std::filesystem::file_size(demo_dir() + "/model.safetensors");
  EXPECT_LE(bytes, 25u * 1000 * 1000);
  Demo d;
  EXPECT_EQ(d.model.config().vocab_size, 515);
  EXPECT_GT(d.model.weights().embed.numel(), 0);
}

// Every word of a greedy continuation is a word of the corpus generator (its templates and word
// lists), and it writes enough of them: the model writes the corpus' English, not noise.
TEST(DemoModelTrained, ContinuesAStoryInTheCorpusLanguage) {
  Demo d;
  std::set<std::string> vocab;
  for (const char* f : {"/scripts/corpus_words.py", "/scripts/make_corpus.py"})
    for (const auto& w : words_of(read_text(test::source_dir() + f))) vocab.insert(w);
  GenerateOptions opts;
  opts.max_new_tokens = 60;
  opts.stop_ids = d.tok->eos_ids();
  for (const char* prompt : {"Once upon a time", "One day, Lily went to", "The dog"}) {
    const auto g = generate(d.model, d.tok->encode(prompt, true), opts);
    const std::string text = d.tok->decode(g.tokens, true);
    const auto words = words_of(text);
    EXPECT_GE(words.size(), 8u) << prompt << text;
    size_t known = 0;
    for (const auto& w : words) known += vocab.count(w);
    EXPECT_GE(static_cast<double>(known), 0.9 * static_cast<double>(words.size())) << prompt << text;
  }
}

// The base model answers chat questions in the corpus' style: one full sentence that starts with
// a capital and ends with ".", "!" or "?" (never the quick-start "Answer: ..." form), and it knows its
// small talk. It does NOT yet read the facts reliably (1.4M training tokens were too few for
// that; models/README.md), so the content of reading answers is not asserted.
TEST(DemoModelTrained, AnswersInFullSentences) {
  Demo d;
  const std::vector<TaskExample> ex = {
      {{{"user", "Tom has a red ball. Mia is in the park. What does Tom have?"}}, "Tom has a red ball."},
      {{{"user", "Lily is happy. Ben has a blue kite. How does Lily feel?"}}, "Lily feels happy."},
      {{{"user", "Sam likes cake. Anna has a pet frog. What does Sam like to eat?"}}, "Sam likes to eat cake."},
      {{{"user", "Zoe has a green hat. Max is at the beach. Where is Max?"}}, "Max is at the beach."},
      {{{"user", "Hello!"}}, "Hello! How can I help you today?"},
  };
  const TaskEvalResult r = evaluate_task(d.model, *d.tok, d.tmpl, ex);
  std::string all;
  for (const auto& a : r.answers) all += a.prompt + " -> " + a.output + "\n";
  for (const auto& a : r.answers) {
    ASSERT_GE(a.output.size(), 4u) << all;
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(a.output[0]))) << all;
    EXPECT_NE(std::string(".!?").find(a.output.back()), std::string::npos) << all;
    EXPECT_EQ(a.output.find("Answer:"), std::string::npos) << all;
    EXPECT_LE(words_of(a.output).size(), 12u) << all;  // one sentence, then <|im_end|>
  }
  EXPECT_TRUE(r.answers[4].exact) << all;
}

// The quick-start format is new to the base model: exact match starts (near) zero.
TEST(DemoModelTrained, DoesNotKnowTheQuickstartFormatsYet) {
  Demo d;
  for (const char* name : {"sharegpt", "alpaca"}) {
    const auto ex =
        load_task_examples(test::source_dir() + "/examples/quickstart_" + std::string(name) + "_holdout.jsonl");
    TaskEvalOptions o;
    o.max_examples = 20;
    const TaskEvalResult r = evaluate_task(d.model, *d.tok, d.tmpl, ex, o);
    EXPECT_LE(r.exact_match(), 0.1) << name << ": " << r.answers[0].output;
  }
}

}  // namespace
}  // namespace bp
