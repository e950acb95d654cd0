// prepare_training_data: skip vs strict, holdout split, and a resumed cursor reproducing the
// exact packed batches of an uninterrupted run.
#include "text/dataset_pipeline.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "text/data_test_util.h"

namespace bp::test {
namespace {

std::string write_rows(const TempDir& dir, int good, bool with_bad) {
  const std::string path = dir.path + "/d.jsonl";
  std::ofstream f(path);
  for (int i = 0; i < good; ++i) {
    f << R"({"messages": [{"role": "user", "content": "question )" << i
      << R"("}, {"role": "assistant", "content": "answer )" << i << R"("}]})"
      << "\n";
    if (with_bad && i == 3) f << "{broken\n";
  }
  return path;
}

TEST(DatasetPipeline, SkipsBadRowsByDefaultAndFailsWhenStrict) {
  TempDir dir;
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  const std::string path = write_rows(dir, 20, true);
  TrainingData data = prepare_training_data({.path = path}, tok);
  EXPECT_EQ(data.rows_total, 21);
  EXPECT_EQ(data.rows_skipped, 1);
  EXPECT_EQ(data.tokenized.samples.size(), 20u);
  EXPECT_EQ(data.format, DatasetFormat::OpenAI);
  try {
    prepare_training_data({.path = path, .strict = true}, tok);
    FAIL() << "strict must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_INVALID);
    EXPECT_NE(std::string(e.what()).find("line 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(prepare_training_data({.path = path, .holdout = 1.5}, tok), Error);
}

TEST(DatasetPipeline, HoldoutAndResumedCursorGiveTheSameBatches) {
  TempDir dir;
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  const DataSettings settings{.path = write_rows(dir, 50, false), .holdout = 0.1, .seed = 1234};
  const TrainingData data = prepare_training_data(settings, tok);
  EXPECT_EQ(data.eval.size(), 5u);
  EXPECT_EQ(data.train.size(), 45u);
  for (int64_t e : data.eval) EXPECT_EQ(std::count(data.train.begin(), data.train.end(), e), 0);
  for (const Sample* s : data.eval_samples())
    EXPECT_EQ(std::count(data.eval.begin(), data.eval.end(), s->id), 1) << "eval_samples returns the eval split";

  auto run = [&](int steps, CursorState start, CursorState* end_state) {
    DataCursor cursor = data.make_cursor(start);
    std::vector<std::vector<int32_t>> tokens;
    for (int k = 0; k < steps; ++k)
      for (const PackedBatch& b : {pack_samples(data.next_train_samples(cursor, 8))}) {
        tokens.push_back(b.tokens);
        for (int64_t id : b.sample_ids)
          EXPECT_EQ(std::count(data.train.begin(), data.train.end(), id), 1) << "only training samples";
      }
    *end_state = cursor.state();
    return tokens;
  };
  CursorState end;
  const auto straight = run(15, {}, &end);  // crosses two epochs of 45
  CursorState mid;
  auto resumed = run(6, {}, &mid);
  const auto rest = run(9, CursorState::from_json(mid.to_json()), &end);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, straight);
  // Same seed, same data order in a fresh preparation.
  const TrainingData again = prepare_training_data(settings, tok);
  EXPECT_EQ(again.train, data.train);
  DataCursor c1 = data.make_cursor(), c2 = again.make_cursor();
  EXPECT_EQ(c1.next(45), c2.next(45));
}

// Tool-calling settings reach the samples training gets (issue 43): --tools gives rows without tools
// their list, --template-kwargs reach the template, --reasoning drop removes earlier turns'
// reasoning, --tool-arguments string keeps the arguments as text.
TEST(DatasetPipeline, ToolDataSettingsReachTheSamples) {
  TempDir dir;
  const std::string tmpl =
      "{% if tools %}T={{ tools[0].function.name }};{% endif %}K={{ flag }};{% for m in messages %}<|im_start|>"
      "{{ m.role }}:{% if m.reasoning_content %}R({{ m.reasoning_content }}){% endif %}{{ m.content }}"
      "{% for c in m.tool_calls or [] %}C({{ c.function.arguments }}){% endfor %}<|im_end|>{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant:{% endif %}";
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"}, tmpl, -1, 1);
  const std::string path = dir.path + "/tools.jsonl";
  std::ofstream(path)
      << R"({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", )"
         R"("reasoning_content": "r1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "", )"
         R"("reasoning_content": "r2", "tool_calls": [{"type": "function", "function": {"name": "get_weather", )"
         R"("arguments": "{\"city\":\"Oslo\"}"}}]}, {"role": "tool", "content": "3 C"}, )"
         R"({"role": "assistant", "content": "Cold."}]})"
      << "\n";
  const std::string tools = dir.path + "/tools.json";
  std::ofstream(tools) << R"([{"type": "function", "function": {"name": "get_weather"}}])";
  DataSettings s;
  s.path = path;
  s.chat.tools_path = tools;
  s.chat.template_kwargs = nlohmann::ordered_json{{"flag", "on"}};
  s.chat.reasoning = ReasoningMode::Drop;
  s.chat.tool_arguments = ToolArguments::String;
  const TrainingData data = prepare_training_data(s, tok);
  ASSERT_EQ(data.tokenized.samples.size(), 1u);
  const std::string text = tok.decode(data.tokenized.samples[0].ids);
  EXPECT_EQ(text,
            "T=get_weather;K=on;<|im_start|>user:Q1<|im_end|><|im_start|>assistant:A1<|im_end|><|im_start|>user:Q2"
            "<|im_end|><|im_start|>assistant:R(r2)C({\"city\":\"Oslo\"})<|im_end|><|im_start|>tool:3 C<|im_end|>"
            "<|im_start|>assistant:Cold.<|im_end|>");
  // Without the settings: no tools, no variable, both turns' reasoning, the arguments an object.
  DataSettings plain;
  plain.path = path;
  const std::string text2 = tok.decode(prepare_training_data(plain, tok).tokenized.samples[0].ids);
  EXPECT_EQ(text2.substr(0, 3), "K=;") << text2;
  EXPECT_NE(text2.find("R(r1)A1"), std::string::npos) << text2;
  EXPECT_NE(text2.find("C({'city': 'Oslo'})"), std::string::npos) << text2;
}

}  // namespace
}  // namespace bp::test
