// Dataset loading: format detection, every format, every bad-row reason with its line number,
// missing / empty / all-bad files, strict mode, tokenization and truncation counts.
#include "text/dataset.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "core/settings.h"
#include "support/expect_error.h"
#include "text/data_test_util.h"

namespace bp::test {
namespace {

TEST(Dataset, DetectsAndReadsEveryFormat) {
  TempDir dir;
  struct Case {
    const char* name;
    std::string content;
    DatasetFormat format;
    Conversation conv;
  };
  const std::vector<Case> cases = {
      {"sg.jsonl",
       R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})"
       "\n",
       DatasetFormat::ShareGPT,
       {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}}},
      {"sg2.jsonl",
       R"({"conversations": [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]})",
       DatasetFormat::ShareGPT,
       {{"user", "Q"}, {"assistant", "A"}}},
      {"oa.jsonl",
       R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})",
       DatasetFormat::OpenAI,
       {{"system", "S"}, {"user", "Q"}, {"assistant", "A"}}},
      {"al.jsonl",
       R"({"instruction": "Do X", "input": "on Y", "output": "Done", "system": "S"})",
       DatasetFormat::Alpaca,
       {{"system", "S"}, {"user", "Do X\n\non Y"}, {"assistant", "Done"}}},
      {"al2.jsonl",
       R"({"instruction": "Do X", "input": "", "output": "Done"})",
       DatasetFormat::Alpaca,
       {{"user", "Do X"}, {"assistant", "Done"}}},
      {"arr.json",
       "[\n  {\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": "
       "\"A\"}]}\n]\n",
       DatasetFormat::OpenAI,
       {{"user", "Q"}, {"assistant", "A"}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    LoadedDataset ds = load_dataset(write_file(dir, c.name, c.content));
    EXPECT_EQ(ds.format, c.format);
    ASSERT_EQ(ds.rows.size(), 1u);
    EXPECT_TRUE(ds.issues.empty()) << ds.issues[0].message;
    ASSERT_EQ(ds.rows[0].conv.size(), c.conv.size());
    for (size_t k = 0; k < c.conv.size(); ++k) {
      EXPECT_EQ(ds.rows[0].conv[k].role, c.conv[k].role);
      EXPECT_EQ(ds.rows[0].conv[k].content, c.conv[k].content);
    }
  }
  LoadedDataset text = load_dataset(write_file(dir, "t.jsonl", "{\"text\": \"hello\"}\n\n{\"text\": \"world\"}\n"));
  EXPECT_EQ(text.format, DatasetFormat::Text);
  ASSERT_EQ(text.rows.size(), 2u);
  EXPECT_TRUE(text.rows[1].is_text);
  EXPECT_EQ(text.rows[1].text, "world");
  EXPECT_EQ(text.rows[1].line, 3);

  LoadedDataset txt = load_dataset(write_file(dir, "plain.txt", "First para\nline two\n\n\n  \nSecond\n"));
  EXPECT_EQ(txt.format, DatasetFormat::Text);
  ASSERT_EQ(txt.rows.size(), 2u);
  EXPECT_EQ(txt.rows[0].text, "First para\nline two");
  EXPECT_EQ(txt.rows[1].text, "Second");
  EXPECT_EQ(txt.rows[1].line, 6);
}

TEST(Dataset, ForcedFormatOverridesDetection) {
  TempDir dir;
  // Detection would pick Alpaca from the first row; forcing openai reports it as missing 'messages'.
  const std::string path = write_file(
      dir, "mixed.jsonl",
      "{\"instruction\": \"i\", \"output\": \"o\"}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}\n");
  LoadedDataset forced = load_dataset(path, {.format = DatasetFormat::OpenAI});
  EXPECT_EQ(forced.format, DatasetFormat::OpenAI);
  ASSERT_EQ(forced.rows.size(), 1u);
  ASSERT_EQ(forced.issues.size(), 1u);
  EXPECT_EQ(forced.issues[0].line, 1);
  EXPECT_EQ(forced.issues[0].problem, RowProblem::MissingField);
  LoadedDataset detected = load_dataset(path);
  EXPECT_EQ(detected.format, DatasetFormat::Alpaca);
  EXPECT_EQ(detected.issues.size(), 1u);
  EXPECT_EQ(parse_dataset_format("sharegpt"), DatasetFormat::ShareGPT);
  EXPECT_EQ(code_of([] { parse_dataset_format("jsonl"); }), ErrorCode::INPUT_VALIDATION_FAILED);
}

// --format's names are one list: the data.format setting's allowed values are what the loader takes
// (QA: the settings offered txt, which the loader refused, and refused messages, which it took).
TEST(Dataset, FormatNamesAreTheSettingsAllowedValues) {
  const std::vector<std::string> names = dataset_format_names();
  EXPECT_EQ(fmt::format("{}", fmt::join(names, "|")), find_setting("data.format")->choices);
  for (const char* name : {"auto", "sharegpt", "openai", "messages", "alpaca", "text", "txt"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  for (const std::string& name : names) {
    Settings s;
    EXPECT_NO_THROW(s.set("data.format", name)) << name;
    EXPECT_NO_THROW(parse_dataset_format(name)) << name << ": allowed by the settings, refused by the loader";
  }
  EXPECT_EQ(parse_dataset_format("messages"), DatasetFormat::OpenAI);
  EXPECT_EQ(parse_dataset_format("txt"), DatasetFormat::PlainText);
  for (const char* refused : {"jsonl", "raw", "TXT", "CSV"}) {
    EXPECT_EQ(code_of([&] { parse_dataset_format(refused); }), ErrorCode::INPUT_VALIDATION_FAILED) << refused;
    Settings s;
    EXPECT_THROW(s.set("data.format", refused), Error) << refused;
  }
}

// txt reads plain text whatever the file is called: paragraphs separated by blank lines, each a
// text sample; text on a .jsonl file still wants {"text": ...} rows.
TEST(Dataset, TxtFormatReadsPlainTextWhateverTheName) {
  TempDir dir;
  const std::string path = write_file(dir, "notes.md", "First paragraph,\nstill first.\n\nSecond one.\n");
  LoadedDataset ds = load_dataset(path, {.format = DatasetFormat::PlainText});
  EXPECT_EQ(ds.format, DatasetFormat::Text);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_TRUE(ds.rows[0].is_text);
  EXPECT_EQ(ds.rows[0].text, "First paragraph,\nstill first.");
  EXPECT_EQ(ds.rows[1].text, "Second one.");
  EXPECT_TRUE(ds.issues.empty());
  LoadedDataset as_json = load_dataset(path, {.format = DatasetFormat::Text});
  EXPECT_TRUE(as_json.rows.empty()) << "text on a non-.txt file reads JSON rows";
}

TEST(Dataset, EveryBadRowReasonWithItsLineNumber) {
  TempDir dir;
  const std::string good = R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})";
  std::string content;
  content += good + "\n";         // 1 ok
  content += "{not json\n";       // 2
  content += "[1, 2]\n";          // 3
  content += "{\"other\": 1}\n";  // 4
  content += R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "  "}]})"
             "\n";  // 5
  content += R"({"messages": [{"role": "user", "content": "Q"}, {"role": "user", "content": "Q2"}]})"
             "\n";  // 6
  content += R"({"messages": [{"role": "robot", "content": "Q"}]})"
             "\n";                                                                            // 7
  content += "{\"messages\": [{\"role\": \"user\", \"content\": \"bad \xC3\x28 byte\"}]}\n";  // 8
  content += "\n";                                                                            // 9 blank: skipped
  content += R"({"messages": [{"role": "user", "content": "Q"}]})"
             "\n";  // 10 no assistant
  content += R"({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "A"}]})"
             "\n";  // 11
  content += R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ")" +
             std::string(400, 'x') + "\"}]}\n";  // 12 too long
  content += R"({"messages": [{"role": "assistant", "content": "A"}, {"role": "user", "content": "Q"}]})"
             "\n";         // 13
  content += good + "\n";  // 14 ok
  LoadedDataset ds = load_dataset(write_file(dir, "bad.jsonl", content), {.max_length = 50});
  EXPECT_EQ(ds.total_rows, 13);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].line, 1);
  EXPECT_EQ(ds.rows[1].line, 14);
  const std::vector<std::pair<int64_t, RowProblem>> expected = {
      {2, RowProblem::NotJson},     {3, RowProblem::NotObject},       {4, RowProblem::MissingField},
      {5, RowProblem::EmptyTurn},   {6, RowProblem::WrongRoleOrder},  {7, RowProblem::UnknownRole},
      {8, RowProblem::InvalidUtf8}, {10, RowProblem::WrongRoleOrder}, {11, RowProblem::WrongType},
      {12, RowProblem::TooLong},    {13, RowProblem::WrongRoleOrder},
  };
  expect_issues(ds, expected);
  if (ds.issues.size() != expected.size()) return;
  EXPECT_NE(ds.issues[5].message.find("robot"), std::string::npos);
  EXPECT_NE(ds.issues[9].message.find("estimated"), std::string::npos) << "char-based estimate says so";
  // Skip by default (and say how many), fail in strict mode.
  EXPECT_EQ(check_dataset(ds, false), 11);
  EXPECT_EQ(code_of([&] { check_dataset(ds, true); }), ErrorCode::INPUT_DATASET_INVALID);
}

TEST(Dataset, TooLongIsExactWithATokenizer) {
  TempDir dir;
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  ChatTemplate tmpl("", "", "");
  // ChatML render of this row: 2 + 4 + 1 + 1 + ... tokens; count it the same way the check does.
  const Conversation conv = {{"user", "Q"}, {"assistant", "A"}};
  const int64_t n = static_cast<int64_t>(tok.encode(tmpl.render(conv, false)).size());
  const std::string path = write_file(
      dir, "r.jsonl", R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})");
  EXPECT_TRUE(load_dataset(path, {.max_length = n, .tokenizer = &tok, .chat_template = &tmpl}).issues.empty());
  LoadedDataset over = load_dataset(path, {.max_length = n - 1, .tokenizer = &tok, .chat_template = &tmpl});
  ASSERT_EQ(over.issues.size(), 1u);
  EXPECT_EQ(over.issues[0].problem, RowProblem::TooLong);
  EXPECT_NE(over.issues[0].message.find(std::to_string(n) + " tokens"), std::string::npos) << over.issues[0].message;
}

TEST(Dataset, RowsTheModelsTemplateRejectsAreReported) {
  TempDir dir;
  // Mistral-v0.1's template raises on a system message (roles must alternate from user); with --model that row is bad.
  FakeTokenizer tok({"<s>", "</s>"});
  ChatTemplate tmpl(read_text_file(template_path("mistral")), "<s>", "</s>");
  const std::string path = write_file(
      dir, "m.jsonl",
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
      "\n"
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
      "\n");
  LoadedDataset ds = load_dataset(path, {.max_length = 1000, .tokenizer = &tok, .chat_template = &tmpl});
  ASSERT_EQ(ds.rows.size(), 1u);
  ASSERT_EQ(ds.issues.size(), 1u);
  EXPECT_EQ(ds.issues[0].line, 2);
  EXPECT_EQ(ds.issues[0].problem, RowProblem::RejectedByTemplate);
  EXPECT_NE(ds.issues[0].message.find("must alternate"), std::string::npos) << ds.issues[0].message;
  // Training reports it too (the template is applied at tokenization).
  TokenizedDataset td = tokenize_dataset(load_dataset(path), tok, tmpl, {});
  EXPECT_EQ(td.samples.size(), 1u);
  ASSERT_EQ(td.issues.size(), 1u);
  EXPECT_EQ(td.issues[0].problem, RowProblem::RejectedByTemplate);
}

TEST(Dataset, JsonArrayElementsKeepTheirLineNumbers) {
  TempDir dir;
  const std::string path = write_file(dir, "a.json",
                                      "[\n"
                                      "  {\"text\": \"one\"},\n"
                                      "  {\"text\": \"two\n"  // raw newline inside a string: bad element
                                      "\"},\n"
                                      "  {\"text\": \"\"},\n"
                                      "  {\"text\": \"four\"}\n"
                                      "]\n");
  LoadedDataset ds = load_dataset(path);
  EXPECT_EQ(ds.format, DatasetFormat::Text);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].line, 2);
  EXPECT_EQ(ds.rows[1].line, 6);
  ASSERT_EQ(ds.issues.size(), 2u);
  EXPECT_EQ(ds.issues[0].line, 3);
  EXPECT_EQ(ds.issues[0].problem, RowProblem::NotJson);
  EXPECT_EQ(ds.issues[1].line, 5);
  EXPECT_EQ(ds.issues[1].problem, RowProblem::EmptyTurn);
}

TEST(Dataset, StrayClosingBracesInAJsonArrayDoNotHang) {
  // Found by tests/fuzz/jsonl_fuzz.cpp: a '}' at the top level of an array made the element
  // scanner stop without progress and loop forever.
  for (const char* content : {"[}", "[{\"text\": \"a\"}}]", "[}}},{\"text\": \"b\"}]", "[\"x\"A}]"}) {
    SCOPED_TRACE(content);
    const LoadedDataset ds = parse_dataset(content, "a.json");
    EXPECT_EQ(static_cast<int64_t>(ds.rows.size() + ds.issues.size()), ds.total_rows);
    EXPECT_LE(ds.total_rows, 2);
  }
}

TEST(Dataset, MissingEmptyAllBadAndUnknownFiles) {
  TempDir dir;
  EXPECT_EQ(code_of([&] { load_dataset(dir.path + "/nope.jsonl"); }), ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_EQ(code_of([&] { load_dataset(dir.path); }), ErrorCode::INPUT_DATASET_NOT_FOUND);
  LoadedDataset empty = load_dataset(write_file(dir, "e.jsonl", "\n  \n"));
  EXPECT_EQ(code_of([&] { check_dataset(empty, false); }), ErrorCode::INPUT_DATASET_INVALID);
  LoadedDataset all_bad = load_dataset(write_file(dir, "b.jsonl", "nope\n{\"text\": \"\"}\n"));
  EXPECT_EQ(all_bad.issues.size(), 2u);
  try {
    check_dataset(all_bad, false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_INVALID);
    EXPECT_NE(std::string(e.what()).find("all 2 rows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(code_of([&] { load_dataset(write_file(dir, "u.jsonl", "{\"prompt\": \"x\", \"completion\": \"y\"}\n")); }),
            ErrorCode::INPUT_DATASET_PARSE_FAILED);
}

TEST(Dataset, TokenizeTruncatesKeepingTheStartAndCounts) {
  TempDir dir;
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>", "<eos>"}, "", -1, 2);
  ChatTemplate tmpl("", "", "");
  const std::string path = write_file(dir, "t.jsonl",
                                      "{\"text\": \"abcdefghij\"}\n"          // 10 bytes + eos = 11 tokens
                                      "{\"text\": \"abc\"}\n"                 // 4 tokens
                                      "{\"text\": \"0123456789012345\"}\n");  // 17 tokens
  LoadedDataset ds = load_dataset(path);
  TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, {.max_seq_length = 8});
  ASSERT_EQ(td.samples.size(), 3u);
  EXPECT_EQ(td.truncated, 2);
  EXPECT_EQ(td.tokens_dropped, (11 - 8) + (17 - 8));
  EXPECT_EQ(tok.decode(td.samples[0].ids), "abcdefgh");  // start kept
  EXPECT_EQ(tok.decode(td.samples[1].ids), "abc<eos>");
  EXPECT_EQ(td.samples[2].id, 2);
  EXPECT_EQ(td.samples[2].source_line, 3);

  // Chat rows: loss only on the assistant turn; a row truncated before any assistant token is skipped.
  const std::string chat = write_file(
      dir, "c.jsonl",
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "a long question"}, {"role": "assistant", "content": "A"}]})"
      "\n");
  TokenizedDataset tc = tokenize_dataset(load_dataset(chat), tok, tmpl, {.max_seq_length = 30});
  ASSERT_EQ(tc.samples.size(), 1u);
  ASSERT_EQ(tc.issues.size(), 1u);
  EXPECT_EQ(tc.issues[0].line, 2);
  std::string masked;
  for (size_t t = 0; t < tc.samples[0].ids.size(); ++t)
    if (tc.samples[0].loss_mask[t]) masked += tok.id_to_token(tc.samples[0].ids[t]);
  EXPECT_EQ(masked, "A<|im_end|>\n");
}

TEST(Dataset, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("Grüße — ✓ 😀"));
  EXPECT_FALSE(is_valid_utf8("\xC3\x28"));          // bad continuation
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("abc\xE2\x82"));       // truncated
}

}  // namespace
}  // namespace bp::test
