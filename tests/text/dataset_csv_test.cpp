// CSV and TSV datasets (issue 43): Python's csv module writes the files (an independent writer of
// RFC 4180: quoting, doubled quotes, line breaks inside fields, CRLF records) and the same rows as
// JSONL; both must load as the same rows. Malformed records are reported with their line and the
// rest kept; header problems stop with the code; a byte-order mark, blank lines and boolean
// columns (KTO's label) behave as pandas reads them; `backprop validate` and `backprop train` take
// a CSV file. `--format csv|tsv` reads a table whatever the file's name, and `--columns` maps a file's
// own column (or JSON key) names onto the formats' keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "support/expect_error.h"
#include "support/test_util.h"
#include "text/data_test_util.h"
#include "text/dataset.h"

namespace bp::test {
namespace {

void expect_same_rows(const LoadedDataset& a, const LoadedDataset& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.issues.size(), b.issues.size());
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t r = 0; r < a.rows.size(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    EXPECT_EQ(a.rows[r].is_text, b.rows[r].is_text);
    EXPECT_EQ(a.rows[r].text, b.rows[r].text);
    EXPECT_EQ(a.rows[r].label, b.rows[r].label);
    ASSERT_EQ(a.rows[r].conv.size(), b.rows[r].conv.size());
    for (size_t k = 0; k < a.rows[r].conv.size(); ++k) {
      EXPECT_EQ(a.rows[r].conv[k].role, b.rows[r].conv[k].role);
      EXPECT_EQ(a.rows[r].conv[k].content, b.rows[r].conv[k].content);
    }
    ASSERT_EQ(a.rows[r].rejected_conv.size(), b.rows[r].rejected_conv.size());
    for (size_t k = 0; k < a.rows[r].rejected_conv.size(); ++k)
      EXPECT_EQ(a.rows[r].rejected_conv[k].content, b.rows[r].rejected_conv[k].content);
  }
}

// Python writes `rows` (a Python literal: a list of dicts) as NAME.csv with csv.DictWriter in
// `dialect`-ish settings and as NAME.jsonl; returns {csv path, jsonl path}.
std::pair<std::string, std::string> python_writes(const TempDir& dir, const std::string& name, const std::string& rows,
                                                  const std::string& writer_args, const std::string& ext = "csv") {
  const std::string script = dir.path + "/" + name + ".py";
  const std::string csv_path = dir.path + "/" + name + "." + ext, jsonl_path = dir.path + "/" + name + ".jsonl";
  std::ofstream(script) << "import csv, json, sys\n"
                        << "rows = " << rows << "\n"
                        << "with open(sys.argv[1], 'w', newline='', encoding='utf-8') as f:\n"
                        << "    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())" << writer_args << ")\n"
                        << "    w.writeheader()\n"
                        << "    for r in rows: w.writerow(r)\n"
                        << "with open(sys.argv[2], 'w', encoding='utf-8') as f:\n"
                        << "    for r in rows: f.write(json.dumps(r) + '\\n')\n";
  std::string out;
  EXPECT_EQ(run_command("/usr/bin/python3 " + script + " " + csv_path + " " + jsonl_path, &out), 0) << out;
  return {csv_path, jsonl_path};
}

TEST(DatasetCsv, PythonsCsvWriterAndTheSameRowsAsJsonlLoadAlike) {
  TempDir dir;
  // Delimiters, quotes, CRLF and LF inside fields, leading/trailing spaces, non-ASCII text, an
  // empty optional column: every quoting rule of the writer is exercised.
  const std::string alpaca = R"PY([
    {"instruction": "Say hi, politely", "input": "", "output": "Hello, \"friend\"."},
    {"instruction": "Two lines", "input": "a\nb", "output": "line one\r\nline two"},
    {"instruction": "  padded  ", "input": "x", "output": "ünïcödé — ✓"},
    {"instruction": "quote \" alone", "input": "", "output": "\"\"\""},
  ])PY";
  for (const std::string& args :
       {std::string(""), std::string(", quoting=csv.QUOTE_ALL"), std::string(", lineterminator='\\n'")}) {
    SCOPED_TRACE(args);
    const auto [csv_path, jsonl_path] = python_writes(dir, "alpaca", alpaca, args);
    const LoadedDataset from_csv = load_dataset(csv_path), from_jsonl = load_dataset(jsonl_path);
    EXPECT_EQ(from_csv.format, DatasetFormat::Alpaca);
    EXPECT_EQ(from_csv.rows.size(), 4u);
    EXPECT_TRUE(from_csv.issues.empty()) << from_csv.issues[0].message;
    expect_same_rows(from_csv, from_jsonl);
    // Line numbers are the records' first lines: row 3 starts after the two line breaks inside row 2.
    ASSERT_EQ(from_csv.rows.size(), 4u);
    EXPECT_EQ(from_csv.rows[0].line, 2);
    EXPECT_EQ(from_csv.rows[2].line, 6);
  }
  // Tab-separated, preference pairs.
  const std::string pairs = R"PY([
    {"prompt": "Colour of the sky?", "chosen": "Blue,\tmostly.", "rejected": "Green"},
    {"prompt": "2+2", "chosen": "4", "rejected": "five\nor so"},
  ])PY";
  const auto [tsv_path, pairs_jsonl] = python_writes(dir, "pairs", pairs, ", delimiter='\\t'", "tsv");
  const LoadedDataset from_tsv = load_dataset(tsv_path), pairs_json = load_dataset(pairs_jsonl);
  EXPECT_EQ(from_tsv.format, DatasetFormat::Preference);
  ASSERT_EQ(from_tsv.rows.size(), 2u);
  EXPECT_TRUE(from_tsv.rows[0].is_pair());
  expect_same_rows(from_tsv, pairs_json);
}

TEST(DatasetCsv, BooleanColumnsByteOrderMarkAndBlankLines) {
  TempDir dir;
  // Excel's "CSV UTF-8": a byte-order mark and CRLF; a blank line between records; KTO's label in
  // any case is a boolean column, as pandas reads it.
  const std::string kto =
      "\xEF\xBB\xBFprompt,completion,label\r\n"
      "Q1,good answer,True\r\n"
      "\r\n"
      "Q2,bad answer,false\r\n"
      "Q3,fine,TRUE\r\n";
  const LoadedDataset ds = load_dataset(write_file(dir, "kto.csv", kto));
  EXPECT_EQ(ds.format, DatasetFormat::Unpaired);
  EXPECT_TRUE(ds.issues.empty()) << ds.issues[0].message;
  ASSERT_EQ(ds.rows.size(), 3u);
  EXPECT_EQ(ds.rows[0].label, 1);
  EXPECT_EQ(ds.rows[1].label, 0);
  EXPECT_EQ(ds.rows[2].label, 1);
  EXPECT_EQ(ds.rows[1].line, 4) << "the blank line 3 is counted, not a record";
  // A column with one non-boolean cell stays text: an answer "True" is an answer, not a flag.
  const LoadedDataset text = load_dataset(write_file(dir, "tf.csv",
                                                     "instruction,output\n"
                                                     "Is the sky blue?,True\n"
                                                     "Spell it,t-r-u-e\n"));
  EXPECT_EQ(text.format, DatasetFormat::Alpaca);
  ASSERT_EQ(text.rows.size(), 2u);
  EXPECT_EQ(text.rows[0].conv.back().content, "True");
}

TEST(DatasetCsv, MalformedRecordsAreReportedWithTheirLinesAndTheRestKept) {
  TempDir dir;
  std::string content = "instruction,output\n";  // line 1
  content += "ok one,fine\n";                    // 2 ok
  content += "three,fields,here\n";              // 3 too many fields
  content += "only one field\n";                 // 4 too few
  content += "\"quoted\"tail,x\n";               // 5 text after a closing quote
  content += "bad \xC3\x28 byte,\xFF\n";         // 6 invalid UTF-8 twice: one issue
  content += "\"multi\nline\",ok\n";             // 7-8 ok
  content += "ok two,fine\n";                    // 9 ok
  content += "\"never closed,x\nmore\n";         // 10 to the end: unterminated
  const LoadedDataset ds = load_dataset(write_file(dir, "bad.csv", content));
  EXPECT_EQ(ds.format, DatasetFormat::Alpaca);
  EXPECT_EQ(ds.total_rows, 8);
  ASSERT_EQ(ds.rows.size(), 3u);
  EXPECT_EQ(ds.rows[0].line, 2);
  EXPECT_EQ(ds.rows[1].line, 7);
  EXPECT_EQ(ds.rows[1].conv[0].content, "multi\nline");
  EXPECT_EQ(ds.rows[2].line, 9);
  const std::vector<std::pair<int64_t, RowProblem>> expected = {
      {3, RowProblem::BadCsvRow},   {4, RowProblem::BadCsvRow},  {5, RowProblem::BadCsvRow},
      {6, RowProblem::InvalidUtf8}, {10, RowProblem::BadCsvRow},
  };
  expect_issues(ds, expected);
  if (ds.issues.size() != expected.size()) return;
  EXPECT_NE(ds.issues[0].message.find("3 fields where the header has 2 columns"), std::string::npos);
  EXPECT_NE(ds.issues[2].message.find("after the closing quote"), std::string::npos);
  EXPECT_NE(ds.issues[3].message.find("column 'instruction'"), std::string::npos);
  EXPECT_NE(ds.issues[4].message.find("never closed"), std::string::npos);
  EXPECT_STREQ(row_problem_name(RowProblem::BadCsvRow), "bad_csv_row");
}

TEST(DatasetCsv, HeaderProblemsStopWithTheCodeAndAnEmptyFileHasNoRows) {
  TempDir dir;
  std::string msg;
  EXPECT_EQ(code_of([&] { load_dataset(write_file(dir, "unnamed.csv", "instruction,,output\na,b,c\n")); }, &msg),
            ErrorCode::INPUT_DATASET_PARSE_FAILED);
  EXPECT_NE(msg.find("column 2"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { load_dataset(write_file(dir, "twice.csv", "output,output\na,b\n")); }, &msg),
            ErrorCode::INPUT_DATASET_PARSE_FAILED);
  EXPECT_NE(msg.find("'output' twice"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { load_dataset(write_file(dir, "open.csv", "\"instruction,output\na,b\n")); }, &msg),
            ErrorCode::INPUT_DATASET_PARSE_FAILED);
  EXPECT_NE(msg.find("header"), std::string::npos) << msg;
  // No row matches a format: the same error as a JSONL file of unknown keys.
  EXPECT_EQ(code_of([&] { load_dataset(write_file(dir, "keys.csv", "question,answer\nq,a\n")); }, &msg),
            ErrorCode::INPUT_DATASET_PARSE_FAILED);
  EXPECT_NE(msg.find("question, answer"), std::string::npos) << msg;
}

TEST(DatasetCsv, ValidateAndTrainTakeACsvFile) {
  TempDir dir;
  std::string csv = "instruction,output\n";
  for (int i = 0; i < 12; ++i)
    csv += "\"What is " + std::to_string(i) + " + 1, exactly?\"," + std::to_string(i + 1) + "\n";
  csv += "broken,row,here\n";  // line 14
  const std::string path = write_file(dir, "data.csv", csv);
  std::string out;
  EXPECT_EQ(run_command(backprop_exe() + " validate " + path + " --json", &out), 1) << out;
  const auto doc = nlohmann::json::parse(out.substr(out.find('{')));
  ASSERT_EQ(doc["issues"].size(), 1u) << out;
  EXPECT_EQ(doc["issues"][0]["line"], 14);
  EXPECT_EQ(doc["issues"][0]["reason"], "bad_csv_row");
  // `data report` names the bad record and a duplicate by their lines.
  const std::string dup_path = write_file(dir, "dup.csv", csv + "\"What is 3 + 1, exactly?\",4\n");  // line 15 = 5
  std::string report;
  EXPECT_EQ(run_command(backprop_exe() + " data report " + dup_path + " --json --fail-on any 2>/dev/null", &report), 1)
      << report;
  std::set<std::pair<std::string, int64_t>> found;
  const auto report_doc = nlohmann::json::parse(report.substr(report.find('{')));
  for (const auto& f : report_doc["findings"]) found.insert({f["kind"].get<std::string>(), f["line"].get<int64_t>()});
  EXPECT_TRUE(found.count({"bad_row", 14})) << report;
  EXPECT_TRUE(found.count({"duplicate", 15})) << report;
  // Training reads it (the bad row skipped, as for JSONL) and trains on the 12 good rows.
  const std::string cmd = backprop_exe() + " train --device cpu --model " + source_dir() + "/models/tiny-chat --data " +
                          path + " --steps 2 --batch-size 4 --max-seq-length 64 --threads 1 --output " + dir.path +
                          "/runs 2>&1";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  std::string run;
  for (const auto& e : std::filesystem::directory_iterator(dir.path + "/runs")) run = e.path().string();
  std::ifstream summary(run + "/summary.json");
  ASSERT_TRUE(summary.good()) << out;
  const auto s = nlohmann::json::parse(summary);
  EXPECT_EQ(s["steps"], 2) << s.dump();
}

TEST(DatasetCsv, FormatCsvOrTsvReadsATableWhateverTheFilesName) {
  TempDir dir;
  const std::string table = "instruction,output\n\"Add 1, 2\",3\nName a colour,blue\n";
  const std::string path = write_file(dir, "export.dat", table);
  const LoadedDataset csv = load_dataset(path, {.format = DatasetFormat::Csv});
  EXPECT_EQ(csv.format, DatasetFormat::Alpaca) << "the rows' format is detected from the header";
  ASSERT_EQ(csv.rows.size(), 2u);
  EXPECT_EQ(csv.rows[0].conv[0].content, "Add 1, 2");
  EXPECT_EQ(csv.rows[1].line, 3);
  // Without --format csv the same bytes are not a table: no row is a JSON object.
  EXPECT_TRUE(load_dataset(path).rows.empty());
  // A .txt name is plain text unless the format says otherwise.
  const std::string tsv_path = write_file(dir, "pairs.txt", "prompt\tchosen\trejected\nsky?\tblue\tgreen\n");
  const LoadedDataset tsv = load_dataset(tsv_path, {.format = DatasetFormat::Tsv});
  EXPECT_EQ(tsv.format, DatasetFormat::Preference);
  ASSERT_EQ(tsv.rows.size(), 1u);
  EXPECT_TRUE(tsv.rows[0].is_pair());
  EXPECT_EQ(load_dataset(tsv_path).format, DatasetFormat::Text);
  EXPECT_EQ(parse_dataset_format("csv"), DatasetFormat::Csv);
  EXPECT_STREQ(dataset_format_name(DatasetFormat::Tsv), "tsv");
}

TEST(DatasetCsv, ColumnsMapTheFilesNamesOntoTheFormatsKeys) {
  TempDir dir;
  // A CSV with its own names reads as the Alpaca rows of a JSONL file with ours.
  const std::string csv_path =
      write_file(dir, "qa.csv", "question,context,answer\nWhat is 2+2?,,4\nCapital?,France,Paris\n");
  const std::string jsonl_path =
      write_file(dir, "qa.jsonl",
                 "{\"instruction\": \"What is 2+2?\", \"input\": \"\", \"output\": \"4\"}\n"
                 "{\"instruction\": \"Capital?\", \"input\": \"France\", \"output\": \"Paris\"}\n");
  DatasetLoadOptions lo;
  lo.columns = parse_column_map("instruction=question, input=context,output=answer");
  const LoadedDataset mapped = load_dataset(csv_path, lo);
  EXPECT_EQ(mapped.format, DatasetFormat::Alpaca);
  EXPECT_TRUE(mapped.issues.empty()) << mapped.issues[0].message;
  expect_same_rows(mapped, load_dataset(jsonl_path));
  // JSON rows too, the map given as a JSON object; a row without a mapped key is a missing_field issue
  // naming it, the others load.
  lo.columns = parse_column_map(R"({"prompt": "q", "chosen": "good", "rejected": "bad"})");
  const LoadedDataset pairs = load_dataset(write_file(dir, "p.jsonl",
                                                      "{\"q\": \"sky?\", \"good\": \"blue\", \"bad\": \"green\"}\n"
                                                      "{\"q\": \"grass?\", \"good\": \"green\"}\n"
                                                      "{\"q\": \"snow?\", \"good\": \"white\", \"bad\": \"black\"}\n"),
                                           lo);
  EXPECT_EQ(pairs.format, DatasetFormat::Preference);
  ASSERT_EQ(pairs.rows.size(), 2u);
  EXPECT_EQ(pairs.rows[1].line, 3);
  EXPECT_EQ(pairs.rows[1].rejected_conv.back().content, "black");
  expect_issues(pairs, {{2, RowProblem::MissingField}});
  if (!pairs.issues.empty()) {
    EXPECT_NE(pairs.issues[0].message.find("'bad'"), std::string::npos);
  }
  // A mapped column wins over a column that already has the key's name.
  lo.columns = parse_column_map("output=better");
  const LoadedDataset both =
      load_dataset(write_file(dir, "both.csv", "instruction,output,better\nSay hi,hey,Hello!\n"), lo);
  ASSERT_EQ(both.rows.size(), 1u);
  EXPECT_EQ(both.rows[0].conv.back().content, "Hello!");
  // A header without a mapped column stops with the code, naming the column and the header's columns.
  lo.columns = parse_column_map("instruction=question,output=reply");
  std::string msg;
  EXPECT_EQ(code_of([&] { load_dataset(csv_path, lo); }, &msg), ErrorCode::INPUT_DATASET_INVALID);
  EXPECT_NE(msg.find("'reply'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("question, context, answer"), std::string::npos) << msg;
  // Bad maps are refused before any file is read.
  for (const char* bad : {"answer=output", "output=", "output=a,output=b", "input=a,output=a", "output",
                          "{\"output\": 3}", "{not json"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(code_of([&] { parse_column_map(bad); }), ErrorCode::CONFIG_INVALID_SETTING);
  }
  EXPECT_TRUE(parse_column_map("  ").empty());
}

TEST(DatasetCsv, TheCommandsTakeFormatCsvAndColumns) {
  TempDir dir;
  std::string table = "question,answer\n";  // not a .csv name: only --format csv reads it as a table
  for (int i = 0; i < 8; ++i) table += "\"What is " + std::to_string(i) + " + 1?\"," + std::to_string(i + 1) + "\n";
  const std::string path = write_file(dir, "sums.data", table);
  const std::string args = " --format csv --columns instruction=question,output=answer";
  std::string out;
  EXPECT_EQ(run_command(backprop_exe() + " validate " + path + args + " --json", &out), 0) << out;
  const auto doc = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(doc["good_rows"], 8) << out;
  // Without the map no row matches a format.
  EXPECT_NE(run_command(backprop_exe() + " validate " + path + " --format csv --json", &out), 0) << out;
  EXPECT_EQ(run_command(backprop_exe() + " data report " + path + args + " --json 2>/dev/null", &out), 0) << out;
  const auto report = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(report["train"]["good_rows"], 8) << out;
  EXPECT_EQ(report["train"]["format"], "alpaca") << out;
  const std::string cmd = backprop_exe() + " train --device cpu --model " + source_dir() + "/models/tiny-chat --data " +
                          path + args + " --steps 1 --batch-size 2 --max-seq-length 64 --threads 1 --output " +
                          dir.path + "/runs 2>&1";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  std::string run;
  for (const auto& e : std::filesystem::directory_iterator(dir.path + "/runs")) run = e.path().string();
  std::ifstream settings(run + "/settings.json");
  ASSERT_TRUE(settings.good()) << out;
  EXPECT_NE(nlohmann::json::parse(settings).dump().find("instruction=question"), std::string::npos)
      << "the map is one of the run's settings (resume keeps it)";
}

}  // namespace
}  // namespace bp::test
