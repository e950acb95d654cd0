// Jinja lexer: preprocessing (trim/lstrip blocks), text/tag split, whitespace control, tag tokens.
#include "text/jinja_lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "text/jinja_value.h"
#include "text/unicode.h"

namespace bp::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

[[noreturn]] void syntax_error(int line, const std::string& msg) {
  throw JinjaError(JinjaError::Kind::Syntax, fmt::format("template line {}: {}", line, msg));
}

// A string literal starting at src[pos] (its quote): the unescaped value into `val`; returns the
// position after the closing quote. \xXX, \uXXXX and \UXXXXXXXX escapes are code points (UTF-8).
size_t read_string_literal(const std::string& src, size_t pos, int& line, std::string& val) {
  const char c = src[pos];
  size_t e = pos + 1;
  for (;;) {
    if (e >= src.size()) syntax_error(line, "unterminated string literal");
    char d = src[e];
    if (d == c) break;
    if (d == '\\' && e + 1 < src.size()) {
      char n = src[++e];
      switch (n) {
        case 'n': val += '\n'; break;
        case 't': val += '\t'; break;
        case 'r': val += '\r'; break;
        case 'b': val += '\b'; break;
        case 'f': val += '\f'; break;
        case 'v': val += '\v'; break;
        case '0': val += '\0'; break;
        case '\\': val += '\\'; break;
        case '\'': val += '\''; break;
        case '"': val += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {  // \xXX, \uXXXX, \UXXXXXXXX: a code point, written as UTF-8
          const size_t digits = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          if (e + digits >= src.size() ||
              !std::all_of(src.begin() + static_cast<std::ptrdiff_t>(e + 1),
                           src.begin() + static_cast<std::ptrdiff_t>(e + 1 + digits),
                           [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; }))
            syntax_error(line, fmt::format("truncated \\{} escape in a string literal", n));
          const auto cp = static_cast<char32_t>(std::stoul(src.substr(e + 1, digits), nullptr, 16));
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            syntax_error(line, fmt::format("escape \\{}{} is not a valid code point", n, src.substr(e + 1, digits)));
          text::append_utf8(val, cp);
          e += digits;
          break;
        }
        default: val += '\\'; val += n;
      }
      ++e;
      continue;
    }
    if (d == '\n') ++line;
    val += d;
    ++e;
  }
  return e + 1;
}

}  // namespace

std::string preprocess_template(const std::string& source) {
  // Jinja2 (newline_sequence '\n') turns every "\r\n" and lone "\r" of the source into "\n" before
  // anything else, string literals included: a template saved with CRLF renders as the LF one.
  std::string t;
  t.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] != '\r') {
      t += source[k];
    } else {
      t += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    }
  }
  if (!t.empty() && t.back() == '\n') t.pop_back();
  // lstrip_blocks: spaces/tabs at the start of a line before "{%", "{#" (or "{-") are removed.
  std::string out;
  out.reserve(t.size());
  size_t i = 0;
  while (i < t.size()) {
    const bool line_start = i == 0 || t[i - 1] == '\n';
    if (line_start) {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' && (t[j + 1] == '%' || t[j + 1] == '#' || t[j + 1] == '-')) i = j;
    }
    // Copy up to and including the next newline.
    while (i < t.size()) {
      out += t[i];
      if (t[i++] == '\n') break;
    }
  }
  // trim_blocks (the first newline after a block or comment tag) is applied by tokenize(), which
  // counts that newline, so error line numbers stay those of the source.
  return out;
}

std::vector<Token> tokenize(const std::string& source) {
  const std::string src = preprocess_template(source);
  std::vector<Token> toks;
  size_t pos = 0;
  int line = 1;
  bool strip_next_text = false;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < src.size(); ++k)
      if (src[k] == '\n') ++line;
  };
  while (pos < src.size()) {
    // Next tag opening.
    size_t open = pos;
    while (open + 1 < src.size() &&
           !(src[open] == '{' && (src[open + 1] == '{' || src[open + 1] == '%' || src[open + 1] == '#')))
      ++open;
    if (open + 1 >= src.size()) open = src.size();
    std::string text = src.substr(pos, open - pos);
    const bool rstrip = open + 2 < src.size() && src[open + 2] == '-';
    if (strip_next_text) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    }
    if (rstrip)
      while (!text.empty() && is_space(text.back())) text.pop_back();
    if (!text.empty()) toks.push_back({TokType::Text, text, line});
    count_lines(pos, open);
    strip_next_text = false;
    if (open >= src.size()) break;
    const char kind = src[open + 1];
    pos = open + 2 + (rstrip ? 1 : 0);
    if (kind == '#') {
      size_t close = src.find("#}", pos);
      if (close == std::string::npos) syntax_error(line, "unterminated comment");
      strip_next_text = close > 0 && src[close - 1] == '-';
      count_lines(pos, close);
      pos = close + 2;
      if (pos < src.size() && src[pos] == '\n') {  // trim_blocks
        ++line;
        ++pos;
      }
      continue;
    }
    const std::string closer = kind == '{' ? "}}" : "%}";
    toks.push_back({kind == '{' ? TokType::VarOpen : TokType::BlockOpen, "", line});
    int depth = 0;  // brackets opened inside the tag, so "}}" of a dict literal does not close it
    for (;;) {
      while (pos < src.size() && is_space(src[pos])) {
        if (src[pos] == '\n') ++line;
        ++pos;
      }
      if (pos >= src.size()) syntax_error(line, "unterminated tag (missing '" + closer + "')");
      if (depth == 0) {
        if (src[pos] == '-' && src.compare(pos + 1, 2, closer) == 0) {
          strip_next_text = true;
          pos += 3;
          break;
        }
        if (src.compare(pos, 2, closer) == 0) {
          pos += 2;
          if (kind == '%' && pos < src.size() && src[pos] == '\n') {  // trim_blocks
            ++line;
            ++pos;
          }
          break;
        }
      }
      const char c = src[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        toks.push_back({TokType::Name, src.substr(pos, e - pos), line});
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        bool is_float = false;
        if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
        toks.push_back({is_float ? TokType::Float : TokType::Int, src.substr(pos, e - pos), line});
        pos = e;
      } else if (c == '\'' || c == '"') {
        std::string val;
        pos = read_string_literal(src, pos, line, val);
        toks.push_back({TokType::String, val, line});
      } else {
        static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        bool matched = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (src.compare(pos, n, op) == 0) {
            std::string s(op);
            if (s == "(" || s == "[" || s == "{") ++depth;
            if (s == ")" || s == "]" || s == "}") --depth;
            toks.push_back({TokType::Op, s, line});
            pos += n;
            matched = true;
            break;
          }
        }
        if (!matched) syntax_error(line, fmt::format("unexpected character '{}' inside a tag", c));
      }
    }
    toks.push_back({kind == '{' ? TokType::VarClose : TokType::BlockClose, "", line});
  }
  toks.push_back({TokType::End, "", line});
  return toks;
}

}  // namespace bp::jinja
