// Internals shared by dataset_reader.cpp, dataset_formats.cpp and dataset.cpp (not a public API).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "text/dataset.h"

namespace bp::data {

inline constexpr int kMaxJsonDepth = 64;

struct RawRecord {
  int64_t line;
  std::string_view text;
  bool plain_text;  // a .txt paragraph, not JSON
};

bool valid_utf8(std::string_view s, size_t* bad_offset);
// Splits a file into records; *json_array tells whether it was a JSON array. Text after the
// closing ']' of a JSON array sets *array_problem (the file is not JSON).
std::vector<RawRecord> split_records(std::string_view content, bool plain_text, bool* json_array,
                                     std::string* array_problem);
// UTF-8 check + JSON parse; a plain-text record becomes {"text": ...}. nullopt when fine.
std::optional<RowIssue> parse_record(const RawRecord& rec, nlohmann::ordered_json* out);

// The format a row's keys indicate; Auto when none matches.
DatasetFormat detect_format(const nlohmann::ordered_json& obj);
// Converts one parsed object in format `fmt` into row (line/index already set); returns the
// problem when the row is bad.
std::optional<RowIssue> convert_row(const nlohmann::ordered_json& obj, DatasetFormat fmt, DatasetRow& row);

}  // namespace bp::data
