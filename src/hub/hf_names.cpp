// Checks of names and text from model sources (see hf_names.h).
#include "hub/hf_names.h"

#include <fmt/format.h>

#include "core/error.h"

namespace bp::hub {

namespace {
bool is_control(unsigned char c) {
  return c < 0x20 || c == 0x7f;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}
}  // namespace

std::string revision_problem(std::string_view rev) {
  if (rev.empty()) return "it is empty";
  if (rev.size() > 255) return fmt::format("it is {} bytes long (at most 255)", rev.size());
  for (unsigned char c : rev) {
    if (is_control(c) || c == ' ') return "it contains a space or a control character";
    if (std::string_view("\\~^:?*[").find(static_cast<char>(c)) != std::string_view::npos)
      return fmt::format("it contains '{}'", static_cast<char>(c));
  }
  if (rev.find("..") != std::string_view::npos) return "it contains '..'";
  if (rev.find("@{") != std::string_view::npos) return "it contains '@{'";
  if (rev == "@") return "it is '@'";
  if (rev.find("//") != std::string_view::npos) return "it contains '//'";
  if (rev.front() == '/' || rev.front() == '-') return fmt::format("it starts with '{}'", rev.front());
  if (rev.back() == '/' || rev.back() == '.') return fmt::format("it ends with '{}'", rev.back());
  for (size_t start = 0; start <= rev.size();) {
    const size_t end = std::min(rev.find('/', start), rev.size());
    const std::string_view part = rev.substr(start, end - start);
    if (!part.empty() && part.front() == '.') return "a part of it starts with '.'";
    if (ends_with(part, ".lock")) return "a part of it ends with '.lock'";
    start = end + 1;
  }
  return "";
}

void check_revision(const std::string& repo_id, const std::string& revision) {
  const std::string problem = revision_problem(revision);
  if (problem.empty()) return;
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[hub] '{}@{}': the revision is not a branch, tag or commit name: {}", repo_id,
                          sanitize_server_text(revision), problem),
              {{"repo", repo_id}, {"revision", sanitize_server_text(revision)}})
      .with_suggestion(
          "Write the revision as the hub shows it: a branch or tag (main, v1.0, refs/pr/3) or a 40-hex commit sha "
          "(org/name@<sha>); leave @REVISION out for main.");
}

std::string remote_file_problem(std::string_view name) {
  if (name.empty()) return "it is empty";
  if (name.size() > 1024) return fmt::format("it is {} bytes long (at most 1024)", name.size());
  if (name.front() == '/') return "it is an absolute path";
  for (unsigned char c : name) {
    if (c == '\\') return "it contains a backslash";
    if (is_control(c)) return "it contains a control character";
  }
  for (size_t start = 0; start <= name.size();) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string_view part = name.substr(start, end - start);
    if (part.empty()) return "it has an empty path component ('//' or a trailing '/')";
    if (part == "." || part == "..") return fmt::format("it has a '{}' component", part);
    if (part.size() > 255) return "a component is longer than 255 bytes";
    start = end + 1;
  }
  return "";
}

void check_remote_file_name(std::string_view name, const std::string& source, const std::string& repo_id) {
  const std::string problem = remote_file_problem(name);
  if (problem.empty()) return;
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
              fmt::format("[hub] {} names the file '{}' for {}, which backprop refuses: {}; a file name must stay "
                          "inside the model's folder",
                          sanitize_server_text(source), sanitize_server_text(name), repo_id, problem),
              {{"repo", repo_id}, {"file", sanitize_server_text(name)}, {"source", sanitize_server_text(source)}})
      .with_suggestion(
          "The repository (or HF_ENDPOINT's server) is damaged or hostile; nothing was written for this file. Use "
          "another repository or a local folder.");
}

bool is_safe_blob_name(std::string_view etag) {
  if (etag.empty() || etag.size() > 128) return false;
  for (unsigned char c : etag)
    if (!std::isalnum(c) && c != '_' && c != '-') return false;
  return true;
}

std::optional<uint64_t> parse_size_header(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

std::string sanitize_server_text(std::string_view text, size_t max_bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace bp::hub
