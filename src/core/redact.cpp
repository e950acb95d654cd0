// Secret redaction: one left-to-right scan with hand-written matchers (no std::regex: it recurses
// per character and can overflow the stack on long lines).
#include "core/redact.h"

#include <atomic>
#include <cctype>
#include <mutex>
#include <vector>

namespace bp {

namespace {

std::mutex g_mu;
std::vector<std::string> g_secrets;
std::atomic<bool> g_enabled{true};

constexpr std::string_view kMask = "***";

bool is_alnum(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}
bool is_space(char c) {
  return c == ' ' || c == '\t';
}
// Characters that end a key=value value.
bool ends_value(char c) {
  return std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\'' || c == '&' || c == ',' || c == ';' ||
         c == '}' || c == ')';
}
bool token_char(char c) {
  return is_alnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '+' || c == '/' || c == '=';
}

bool starts_with_icase(std::string_view s, size_t i, std::string_view word) {
  if (s.size() - i < word.size()) return false;
  for (size_t k = 0; k < word.size(); ++k)
    if (std::tolower(static_cast<unsigned char>(s[i + k])) != word[k]) return false;
  return true;
}

// Each matcher looks at position i (at a word start where relevant). On a match it appends the
// redacted form to out and returns the position after the match; otherwise returns i.

size_t match_bearer(std::string_view s, size_t i, std::string& out) {
  if (!starts_with_icase(s, i, "bearer")) return i;
  size_t j = i + 6;
  if (j >= s.size() || !is_space(s[j])) return i;
  while (j < s.size() && is_space(s[j])) ++j;
  size_t v = j;
  while (j < s.size() && token_char(s[j])) ++j;
  if (j - v < 4) return i;
  out.append(s.substr(i, v - i));
  out.append(kMask);
  return j;
}

size_t match_prefixed_key(std::string_view s, size_t i, std::string_view prefix, bool allow_dash, std::string& out) {
  if (s.compare(i, prefix.size(), prefix) != 0) return i;
  size_t j = i + prefix.size();
  while (j < s.size() && (is_alnum(s[j]) || s[j] == '_' || (allow_dash && s[j] == '-'))) ++j;
  if (j - (i + prefix.size()) < 6) return i;
  out.append(prefix);
  out.append(kMask);
  return j;
}

size_t match_key_value(std::string_view s, size_t i, std::string& out) {
  struct Key {
    std::string_view name;
    bool colon_ok;  // "password: x" (plain colon) counts, not only "password=x" / "password": "x"
  };
  static constexpr Key kKeys[] = {{"password", true}, {"passwd", true},        {"api_key", true}, {"apikey", true},
                                  {"secret", true},   {"access_token", false}, {"token", false}};
  for (const auto& key : kKeys) {
    if (!starts_with_icase(s, i, key.name)) continue;
    size_t j = i + key.name.size();
    bool quoted = j < s.size() && (s[j] == '"' || s[j] == '\'');
    if (quoted) ++j;
    while (j < s.size() && is_space(s[j])) ++j;
    if (j >= s.size()) return i;
    bool eq = s[j] == '=';
    bool colon = s[j] == ':' && (quoted || key.colon_ok);
    if (!eq && !colon) continue;
    ++j;
    while (j < s.size() && is_space(s[j])) ++j;
    if (j < s.size() && (s[j] == '"' || s[j] == '\'')) ++j;
    size_t v = j;
    while (j < s.size() && !ends_value(s[j])) ++j;
    if (j == v) return i;
    out.append(s.substr(i, v - i));
    out.append(kMask);
    return j;
  }
  return i;
}

// --auth user:pass  /  --auth=user:pass
size_t match_auth_flag(std::string_view s, size_t i, std::string& out) {
  if (s.compare(i, 6, "--auth") != 0) return i;
  size_t j = i + 6;
  if (j >= s.size() || !(s[j] == '=' || is_space(s[j]))) return i;
  ++j;
  while (j < s.size() && is_space(s[j])) ++j;
  if (j < s.size() && (s[j] == '"' || s[j] == '\'')) ++j;
  size_t user = j;
  while (j < s.size() && !ends_value(s[j]) && s[j] != ':') ++j;
  if (j >= s.size() || s[j] != ':') return i;
  ++j;
  size_t v = j;
  while (j < s.size() && !ends_value(s[j])) ++j;
  if (j == v || v - 1 == user) return i;
  out.append(s.substr(i, v - i));
  out.append(kMask);
  return j;
}

// scheme://user:pass@host
size_t match_url_password(std::string_view s, size_t i, std::string& out) {
  if (s.compare(i, 3, "://") != 0) return i;
  size_t j = i + 3;
  while (j < s.size() && !ends_value(s[j]) && s[j] != ':' && s[j] != '/' && s[j] != '@') ++j;
  if (j >= s.size() || s[j] != ':') return i;
  size_t v = j + 1;
  size_t k = v;
  while (k < s.size() && !ends_value(s[k]) && s[k] != '@' && s[k] != '/') ++k;
  if (k >= s.size() || s[k] != '@' || k == v) return i;
  out.append(s.substr(i, v - i));
  out.append(kMask);
  return k;
}

std::string redact_patterns(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    bool word_start = i == 0 || !is_alnum(s[i - 1]);
    size_t j = i;
    if (word_start) {
      if (j == i) j = match_bearer(s, i, out);
      if (j == i) j = match_prefixed_key(s, i, "hf_", false, out);
      if (j == i) j = match_prefixed_key(s, i, "sk-", true, out);
      if (j == i) j = match_key_value(s, i, out);
    }
    if (j == i) j = match_auth_flag(s, i, out);
    if (j == i) j = match_url_password(s, i, out);
    if (j == i) {
      out.push_back(s[i]);
      ++i;
    } else {
      i = j;
    }
  }
  return out;
}

}  // namespace

std::string redact(std::string_view text) {
  if (!g_enabled.load()) return std::string(text);
  std::string s(text);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& secret : g_secrets) {
      size_t pos = 0;
      while ((pos = s.find(secret, pos)) != std::string::npos) {
        s.replace(pos, secret.size(), kMask);
        pos += kMask.size();
      }
    }
  }
  return redact_patterns(s);
}

void redact_add_secret(std::string secret) {
  if (secret.size() < 4) return;
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& s : g_secrets)
    if (s == secret) return;
  g_secrets.push_back(std::move(secret));
}

void redact_clear_secrets() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_secrets.clear();
}

void set_redaction_enabled(bool on) {
  g_enabled.store(on);
}
}  // namespace bp
