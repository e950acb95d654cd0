// Preference data (issue 38): the pair and KTO forms and their detection, every bad-row kind with
// its line, which methods a format fits (and unpairing for KTO), tokenization through the SFT
// chat-template path with the mask on the final turn only, and packing a pair as two sequences.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "text/data_test_util.h"
#include "text/dataset.h"
#include "text/dataset_pipeline.h"
#include "text/packing.h"

namespace bp::test {
namespace {

// The tokens a mask trains, as text.
std::string trained_text(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  std::string out;
  for (size_t t = 0; t < ids.size(); ++t)
    if (mask[t]) out += tok.id_to_token(ids[t]);
  return out;
}

const char* kPair = R"({"prompt": "Q", "chosen": "good", "rejected": "bad"})";
const char* kSft = R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})";
const char* kKto = R"({"prompt": "Q", "completion": "good", "label": true})";

TEST(PreferenceData, DetectsAndReadsEachForm) {
  struct Case {
    const char* row;
    DatasetFormat format;
    Conversation conv, rejected;
    int label;
  };
  const Conversation sq = {{"user", "Q"}};
  const std::vector<Case> cases = {
      // TRL standard form: strings.
      {kPair,
       DatasetFormat::Preference,
       {{"user", "Q"}, {"assistant", "good"}},
       {{"user", "Q"}, {"assistant", "bad"}},
       -1},
      // Conversational form with an explicit prompt (a system message too).
      {R"({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
           "chosen": [{"role": "assistant", "content": "good"}], "rejected": [{"role": "assistant", "content": "bad"}]})",
       DatasetFormat::Preference,
       {{"system", "S"}, {"user", "Q"}, {"assistant", "good"}},
       {{"system", "S"}, {"user", "Q"}, {"assistant", "bad"}},
       -1},
      // Implicit prompt: whole conversations sharing all but their final message.
      {R"({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "good"}],
           "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "bad"}]})",
       DatasetFormat::Preference,
       {{"user", "Q"}, {"assistant", "a1"}, {"user", "Q2"}, {"assistant", "good"}},
       {{"user", "Q"}, {"assistant", "a1"}, {"user", "Q2"}, {"assistant", "bad"}},
       -1},
      // KTO: bool labels, strings or messages.
      {kKto, DatasetFormat::Unpaired, {{"user", "Q"}, {"assistant", "good"}}, {}, 1},
      {R"({"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "assistant", "content": "meh"}], "label": false})",
       DatasetFormat::Unpaired,
       {{"user", "Q"}, {"assistant", "meh"}},
       {},
       0},
  };
  for (const Case& c : cases) {
    // One row per line: the multi-line literals are joined.
    std::string row = c.row;
    std::erase(row, '\n');
    const LoadedDataset ds = parse_dataset(row + "\n", "d.jsonl");
    ASSERT_EQ(ds.format, c.format) << c.row;
    ASSERT_TRUE(ds.issues.empty()) << ds.issues[0].message;
    ASSERT_EQ(ds.rows.size(), 1u);
    const DatasetRow& r = ds.rows[0];
    auto flat = [](const Conversation& v) {
      std::string s;
      for (const auto& m : v) s += m.role + ":" + m.content + "|";
      return s;
    };
    EXPECT_EQ(flat(r.conv), flat(c.conv)) << c.row;
    EXPECT_EQ(flat(r.rejected_conv), flat(c.rejected)) << c.row;
    EXPECT_EQ(r.label, c.label) << c.row;
    EXPECT_EQ(r.is_pair(), c.format == DatasetFormat::Preference);
  }
  // The names --format takes, and forcing them.
  EXPECT_EQ(parse_dataset_format("preference"), DatasetFormat::Preference);
  EXPECT_EQ(parse_dataset_format("kto"), DatasetFormat::Unpaired);
  EXPECT_STREQ(dataset_format_name(DatasetFormat::Unpaired), "kto");
  const LoadedDataset forced =
      parse_dataset(std::string(kSft) + "\n", "d.jsonl", {.format = DatasetFormat::Preference});
  ASSERT_EQ(forced.issues.size(), 1u);
  EXPECT_EQ(forced.issues[0].problem, RowProblem::MissingField);
}

TEST(PreferenceData, EveryBadRowKindWithItsLineNumber) {
  const std::string pairs =
      std::string(kPair) + "\n" +                                          // 1 good
      R"({"prompt": "Q", "chosen": "good"})" + "\n" +                      // 2
      R"({"prompt": "Q", "chosen": 7, "rejected": "bad"})" + "\n" +        // 3
      R"({"prompt": "Q", "chosen": "same", "rejected": "same"})" + "\n" +  // 4
      R"({"prompt": "Q", "chosen": " ", "rejected": "bad"})" + "\n" +      // 5
      R"({"chosen": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "a"}],)"
      R"( "rejected": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "b"}]})"
      "\n" +  // 6
      R"({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}],)"
      R"( "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "b"}]})"
      "\n" +  // 7
      R"({"prompt": "Q", "chosen": [{"role": "user", "content": "a"}], "rejected": "b"})" +
      "\n" +                                                                  // 8
      R"({"prompt": "", "chosen": "a", "rejected": "b"})" + "\n" +            // 9
      R"({"prompt": "Q", "chosen": "a", "rejected": {"text": "b"}})" + "\n";  // 10
  const LoadedDataset ds = parse_dataset(pairs, "p.jsonl");
  EXPECT_EQ(ds.format, DatasetFormat::Preference);
  EXPECT_EQ(ds.rows.size(), 1u);
  const std::vector<std::pair<int64_t, RowProblem>> want = {
      {2, RowProblem::MissingField},    {3, RowProblem::WrongType},      {4, RowProblem::IdenticalPair},
      {5, RowProblem::EmptyCompletion}, {6, RowProblem::PromptMismatch}, {7, RowProblem::EmptyCompletion},
      {8, RowProblem::WrongRoleOrder},  {9, RowProblem::EmptyTurn},      {10, RowProblem::WrongType}};
  ASSERT_EQ(ds.issues.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(ds.issues[k].line, want[k].first);
    EXPECT_EQ(ds.issues[k].problem, want[k].second) << ds.issues[k].line << ": " << ds.issues[k].message;
  }
  EXPECT_STREQ(row_problem_name(RowProblem::IdenticalPair), "identical_pair");
  EXPECT_STREQ(row_problem_name(RowProblem::EmptyCompletion), "empty_completion");
  EXPECT_STREQ(row_problem_name(RowProblem::PromptMismatch), "prompt_mismatch");

  const std::string kto = std::string(kKto) + "\n" +                                        // 1 good
                          R"({"prompt": "Q", "completion": "a", "label": "yes"})" + "\n" +  // 2
                          R"({"prompt": "Q", "completion": "a", "label": 1})" + "\n" +      // 3
                          R"({"completion": "a", "label": true})" + "\n" +                  // 4
                          R"({"prompt": "Q", "completion": "", "label": false})" + "\n";    // 5
  const LoadedDataset kds = parse_dataset(kto, "k.jsonl");
  EXPECT_EQ(kds.format, DatasetFormat::Unpaired);
  EXPECT_EQ(kds.rows.size(), 1u);
  const std::vector<std::pair<int64_t, RowProblem>> kwant = {{2, RowProblem::WrongType},
                                                             {3, RowProblem::WrongType},
                                                             {4, RowProblem::MissingField},
                                                             {5, RowProblem::EmptyCompletion}};
  ASSERT_EQ(kds.issues.size(), kwant.size());
  for (size_t k = 0; k < kwant.size(); ++k) {
    EXPECT_EQ(kds.issues[k].line, kwant[k].first);
    EXPECT_EQ(kds.issues[k].problem, kwant[k].second) << kds.issues[k].message;
  }
}

TEST(PreferenceData, EachMethodTakesOnlyDataOfItsShape) {
  TempDir dir;
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  const auto write = [&](const char* name, const std::string& rows) {
    std::ofstream(dir.path + "/" + name) << rows;
    return dir.path + "/" + name;
  };
  const std::string pairs = write("p.jsonl", std::string(kPair) + "\n" + kPair + "\n");
  const std::string kto = write("k.jsonl", std::string(kKto) + "\n");
  const std::string sft = write("s.jsonl", std::string(kSft) + "\n");
  const std::vector<std::tuple<std::string, DataShape, const char*>> refused = {
      {kto, DataShape::Pair, "kto data"},             // one completion per row: no pair to compare
      {sft, DataShape::Pair, "openai data"},          // SFT file for dpo
      {sft, DataShape::Labelled, "openai data"},      // SFT file for kto
      {pairs, DataShape::Single, "preference data"},  // pairs for sft
      {kto, DataShape::Single, "kto data"}};
  for (const auto& [path, shape, what] : refused) {
    try {
      prepare_training_data({.path = path, .shape = shape}, tok);
      ADD_FAILURE() << path << " as " << data_shape_name(shape) << " must fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_WRONG_SHAPE) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--method"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(prepare_training_data({.path = pairs, .shape = DataShape::Pair}, tok).tokenized.samples.size(), 2u);
  EXPECT_EQ(prepare_training_data({.path = kto, .shape = DataShape::Labelled}, tok).tokenized.samples.size(), 1u);

  // Pairs for KTO are unpaired as TRL's unpair_preference_dataset: chosen desirable, rejected not.
  const TrainingData un = prepare_training_data({.path = pairs, .shape = DataShape::Labelled}, tok);
  EXPECT_EQ(un.format, DatasetFormat::Preference);
  ASSERT_EQ(un.tokenized.samples.size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    const Sample& s = un.tokenized.samples[k];
    EXPECT_FALSE(s.is_pair());
    EXPECT_EQ(s.label, k % 2 == 0 ? 1 : 0);
    EXPECT_EQ(s.source_line, static_cast<int64_t>(k / 2 + 1));
    EXPECT_EQ(trained_text(tok, s.ids, s.loss_mask), std::string(k % 2 == 0 ? "good" : "bad") + "<|im_end|>\n");
  }
}

TEST(PreferenceTokenize, ChosenAndRejectedShareThePromptAndTrainOnlyTheFinalTurn) {
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  ChatTemplate tmpl("", "", "");  // ChatML
  const std::string row =
      R"({"chosen": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "first"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "good one"}],)"
      R"( "rejected": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "first"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "bad"}]})";
  const LoadedDataset ds = parse_dataset(row + "\n", "p.jsonl");
  const TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, {});
  ASSERT_EQ(td.samples.size(), 1u);
  const Sample& s = td.samples[0];
  ASSERT_TRUE(s.is_pair());
  EXPECT_EQ(s.label, -1);
  EXPECT_EQ(s.prompt_len, s.rejected_prompt_len);
  ASSERT_GT(s.prompt_len, 0);
  EXPECT_EQ(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.prompt_len),
            std::vector<int32_t>(s.rejected_ids.begin(), s.rejected_ids.begin() + s.prompt_len));
  EXPECT_NE(s.ids[static_cast<size_t>(s.prompt_len)], s.rejected_ids[static_cast<size_t>(s.prompt_len)]);
  // The prompt is the generation-prompt render: it ends with the assistant header.
  const Conversation& conv = ds.rows[0].conv;
  EXPECT_EQ(tok.decode(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.prompt_len)),
            tmpl.render(Conversation(conv.begin(), conv.end() - 1), true));
  // Only the final turn is trained; the prompt's earlier assistant turn ("first") is not.
  EXPECT_EQ(trained_text(tok, s.ids, s.loss_mask), "good one<|im_end|>\n");
  EXPECT_EQ(trained_text(tok, s.rejected_ids, s.rejected_loss_mask), "bad<|im_end|>\n");
  for (int64_t t = 0; t < s.prompt_len; ++t) EXPECT_EQ(s.loss_mask[static_cast<size_t>(t)], 0);
  // ...while SFT on the same conversation trains both assistant turns: the final turn's span is the same.
  const TokenizedConversation sft = tokenize_conversation(tmpl, tok, conv);
  EXPECT_EQ(sft.ids, s.ids);
  EXPECT_EQ(trained_text(tok, sft.ids, sft.loss_mask), "first<|im_end|>\ngood one<|im_end|>\n");
  EXPECT_EQ(std::vector<uint8_t>(sft.loss_mask.begin() + s.prompt_len, sft.loss_mask.end()),
            std::vector<uint8_t>(s.loss_mask.begin() + s.prompt_len, s.loss_mask.end()));
}

TEST(PreferenceTokenize, GenerationBlocksMaskTheSameSpan) {
  // A fine-tuning template whose {% generation %} blocks mark the trained text (see chat_template_source_test).
  const char* src =
      "{% for m in messages %}{% if m.role == 'assistant' %}<A>{% generation %}{{ m.content }}</s>{% endgeneration "
      "%}{% else %}<U>{{ m.content }}</s>{% endif %}{% endfor %}{% if add_generation_prompt %}<A>{% endif %}";
  FakeTokenizer tok({"</s>", "<A>", "<U>"});
  ChatTemplate tmpl(src, "", "");
  ASSERT_TRUE(tmpl.uses_generation_blocks());
  const Conversation conv = {{"user", "hi"}, {"assistant", "yo"}, {"user", "x"}, {"assistant", "ok"}};
  const TokenizedPreference p = tokenize_preference_conv(tmpl, tok, conv, 0);
  EXPECT_EQ(trained_text(tok, p.seq.ids, p.seq.loss_mask), "ok</s>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>(p.seq.ids.begin(), p.seq.ids.begin() + p.prompt_len)),
            "<U>hi</s><A>yo</s><U>x</s><A>");
  const TokenizedConversation sft = tokenize_conversation(tmpl, tok, conv);
  EXPECT_EQ(trained_text(tok, sft.ids, sft.loss_mask), "yo</s>ok</s>");
  EXPECT_EQ(
      std::vector<uint8_t>(sft.loss_mask.begin() + static_cast<std::ptrdiff_t>(p.prompt_len), sft.loss_mask.end()),
      std::vector<uint8_t>(p.seq.loss_mask.begin() + static_cast<std::ptrdiff_t>(p.prompt_len), p.seq.loss_mask.end()));
}

TEST(PreferenceTokenize, ATemplateThatRendersThePromptDifferentlyRejectsTheRow) {
  // The message count leads the render: the prompt renders differently once the completion follows.
  FakeTokenizer tok;
  ChatTemplate tmpl(
      "{{ messages|length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if "
      "add_generation_prompt "
      "%}<assistant>{% endif %}",
      "", "");
  const TokenizedDataset td = tokenize_dataset(parse_dataset(std::string(kPair) + "\n", "p.jsonl"), tok, tmpl, {});
  EXPECT_TRUE(td.samples.empty());
  ASSERT_EQ(td.issues.size(), 1u);
  EXPECT_EQ(td.issues[0].line, 1);
  EXPECT_EQ(td.issues[0].problem, RowProblem::RejectedByTemplate);
  EXPECT_NE(td.issues[0].message.find("renders the prompt differently"), std::string::npos) << td.issues[0].message;
}

TEST(PreferenceTokenize, TruncationKeepsThePromptAndReportsRowsWithNoCompletionLeft) {
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  ChatTemplate tmpl("", "", "");
  const Conversation prompt = {{"user", "Q"}};
  const auto prompt_tokens = static_cast<int64_t>(tok.encode(tmpl.render(prompt, true)).size());
  const int64_t max_len = prompt_tokens + 5;
  const std::string rows = std::string(R"({"prompt": "Q", "chosen": "a long chosen answer", "rejected": "no"})") +
                           "\n" +
                           R"({"prompt": "a prompt far longer than the limit", "chosen": "a", "rejected": "b"})" +
                           "\n" + R"({"prompt": "Q", "completion": "a long completion", "label": true})" + "\n";
  LoadedDataset ds = parse_dataset(rows, "p.jsonl", {.format = DatasetFormat::Preference});
  ASSERT_EQ(ds.rows.size(), 2u);  // the KTO row is no pair
  const TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, {.max_seq_length = max_len});
  ASSERT_EQ(td.samples.size(), 1u);
  const Sample& s = td.samples[0];
  EXPECT_EQ(static_cast<int64_t>(s.ids.size()), max_len);
  EXPECT_EQ(s.prompt_len, prompt_tokens);
  EXPECT_EQ(trained_text(tok, s.ids, s.loss_mask), "a lon");  // the completion's end is cut, the prompt kept
  EXPECT_EQ(trained_text(tok, s.rejected_ids, s.rejected_loss_mask), "no<|im_end|>\n");
  EXPECT_EQ(td.truncated, 1);
  EXPECT_EQ(td.tokens_dropped, static_cast<int64_t>(std::string("g chosen answer").size()) + 2);
  ASSERT_EQ(td.issues.size(), 1u);
  EXPECT_EQ(td.issues[0].line, 2);
  EXPECT_EQ(td.issues[0].problem, RowProblem::TooLong);
  EXPECT_NE(td.issues[0].message.find("no token of the chosen completion fits"), std::string::npos)
      << td.issues[0].message;
}

TEST(PreferencePacking, APairIsTwoAdjacentSequencesThatShareTheirId) {
  Sample sft, pair, last;
  sft.ids = {1, 2, 3};
  sft.loss_mask = {0, 1, 1};
  sft.id = 0;
  pair.ids = {10, 11, 12, 13};
  pair.loss_mask = {0, 0, 1, 1};
  pair.rejected_ids = {10, 11, 22};
  pair.rejected_loss_mask = {0, 0, 1};
  pair.prompt_len = pair.rejected_prompt_len = 2;
  pair.id = 1;
  last.ids = {5, 6};
  last.loss_mask = {0, 1};
  last.id = 2;
  const PackedBatch b = pack_samples({&sft, &pair, &last});
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 3, 7, 10, 12}));
  EXPECT_EQ(b.sample_ids, (std::vector<int64_t>{0, 1, 1, 2}));
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{1, 2, 3, 10, 11, 12, 13, 10, 11, 22, 5, 6}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 0, 1}));
  const int32_t x = kIgnoreLabel;
  // No label crosses a sequence boundary: chosen's last token does not predict rejected's first.
  EXPECT_EQ(b.labels, (std::vector<int32_t>{2, 3, x, x, 12, 13, x, x, 22, x, 6, x}));
  EXPECT_EQ(b.num_samples(), 4);
  EXPECT_EQ(b.num_loss_tokens(), 2 + 2 + 1 + 1);
}

}  // namespace
}  // namespace bp::test

namespace bp::test {
namespace {

// The shipped example sets (examples/preference, made by scripts/make_examples.py) are clean and
// fit the demo model: every pair tokenizes with its chat template within the quick start's length.
TEST(PreferenceData, ShippedExamplesAreCleanForTheDemoModel) {
  const std::string dir = source_dir() + "/examples/preference/";
  const LoadedDataset pairs = load_dataset(dir + "pairs.jsonl");
  EXPECT_EQ(pairs.format, DatasetFormat::Preference);
  EXPECT_EQ(pairs.total_rows, 64);
  EXPECT_TRUE(pairs.issues.empty()) << pairs.issues[0].message;
  const LoadedDataset kto = load_dataset(dir + "kto.jsonl");
  EXPECT_EQ(kto.format, DatasetFormat::Unpaired);
  ASSERT_EQ(kto.rows.size(), 2 * pairs.rows.size());
  for (size_t k = 0; k < kto.rows.size(); ++k) {
    EXPECT_EQ(kto.rows[k].label, k % 2 == 0 ? 1 : 0);
    const DatasetRow& p = pairs.rows[k / 2];
    EXPECT_EQ(kto.rows[k].conv.back().content, (k % 2 == 0 ? p.conv : p.rejected_conv).back().content);
  }
  const std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(source_dir() + "/models/tiny-chat");
  const ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  const TokenizedDataset td = tokenize_dataset(pairs, *tok, tmpl, {.max_seq_length = 256});
  EXPECT_TRUE(td.issues.empty()) << td.issues[0].message;
  EXPECT_EQ(td.samples.size(), 64u);
  EXPECT_EQ(td.truncated, 0);
  // The held-out pairs (the README's --eval-data) are clean too and share no prompt with the others.
  const LoadedDataset held = load_dataset(dir + "pairs_holdout.jsonl");
  EXPECT_EQ(held.format, DatasetFormat::Preference);
  EXPECT_EQ(held.total_rows, 32);
  EXPECT_TRUE(held.issues.empty()) << held.issues[0].message;
  std::set<std::string> prompts;
  for (const DatasetRow& r : pairs.rows) prompts.insert(r.conv.front().content);
  for (const DatasetRow& r : held.rows) EXPECT_EQ(prompts.count(r.conv.front().content), 0u) << r.conv.front().content;
  const TokenizedDataset th = tokenize_dataset(held, *tok, tmpl, {.max_seq_length = 256});
  EXPECT_TRUE(th.issues.empty()) << th.issues[0].message;
  EXPECT_EQ(th.truncated, 0);
}

}  // namespace
}  // namespace bp::test
