// Python str semantics for the Jinja interpreter (see jinja_strings.h).
#include "text/jinja_strings.h"

#include <fmt/format.h>
#include <unicode/uchar.h>

#include <algorithm>

#include "text/unicode.h"

namespace bp::jinja {

namespace {

// The code point at s[i] and its byte length; an invalid sequence is one character (its byte).
char32_t decode_at(const std::string& s, size_t i, size_t& len) {
  const auto lead = static_cast<unsigned char>(s[i]);
  len = std::min(text::utf8_len(lead), s.size() - i);
  if (len == 1) return lead;
  char32_t cp = lead & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) {
      len = 1;
      return lead;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  return cp;
}

// Start of the code point that ends at s[e - 1].
size_t start_before(const std::string& s, size_t e) {
  size_t b = e - 1;
  while (b > 0 && e - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  size_t len = 0;
  decode_at(s, b, len);
  return b + len == e ? b : e - 1;
}

// str.isspace(): bidirectional class WS, B or S, or category Zs (\x1c-\x1f are B/S).
bool py_is_space(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r') || (cp >= 0x1c && cp <= 0x1f);
  const auto dir = u_charDirection(static_cast<UChar32>(cp));
  return dir == U_WHITE_SPACE_NEUTRAL || dir == U_BLOCK_SEPARATOR || dir == U_SEGMENT_SEPARATOR ||
         u_charType(static_cast<UChar32>(cp)) == U_SPACE_SEPARATOR;
}

std::string utf8_of(char32_t cp) {
  std::string out;
  text::append_utf8(out, cp);
  return out;
}

// Full title-case mapping of one code point (ß -> Ss, ǆ -> ǅ), as Python's str.title().
std::string title_of(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_CHANGES_WHEN_TITLECASED)) {
    const std::string upper = text::uppercase_unicode(utf8_of(cp));
    const auto simple = static_cast<char32_t>(u_totitle(c));
    // Where the full upper mapping is one character, the simple title mapping is the answer; a
    // multi-character one (ß -> SS) becomes its first character then the rest lower-cased.
    size_t first_len = 0;
    decode_at(upper, 0, first_len);
    if (first_len == upper.size()) return utf8_of(simple);
    return upper.substr(0, first_len) + text::lowercase_unicode(upper.substr(first_len));
  }
  return utf8_of(cp);
}

bool is_cased(char32_t cp) {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED);
}

// Python's str.isprintable() for one code point: not Cc, Cf, Cs, Co, Cn, Zl, Zp, or Zs other than ' '.
bool py_printable(char32_t cp) {
  if (cp == ' ') return true;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

}  // namespace

size_t py_space_at(const std::string& s, size_t i) {
  size_t len = 0;
  const char32_t cp = decode_at(s, i, len);
  return py_is_space(cp) ? len : 0;
}

std::string py_strip(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      const size_t n = py_space_at(s, b);
      if (n == 0) break;
      b += n;
    }
  if (right)
    while (e > b) {
      const size_t start = start_before(s, e);
      if (start < b || py_space_at(s, start) != e - start) break;
      e = start;
    }
  return s.substr(b, e - b);
}

std::string py_strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  std::vector<char32_t> set;
  for (size_t k = 0, len = 0; k < chars.size(); k += len) set.push_back(decode_at(chars, k, len));
  auto in_set = [&](size_t i, size_t& len) {
    const char32_t cp = decode_at(s, i, len);
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = s.size(), len = 0;
  if (left)
    while (b < e && in_set(b, len)) b += len;
  if (right)
    while (e > b) {
      const size_t start = start_before(s, e);
      if (start < b || !in_set(start, len) || start + len != e) break;
      e = start;
    }
  return s.substr(b, e - b);
}

std::vector<std::string> py_split_whitespace(const std::string& s, long long maxsplit) {
  std::vector<std::string> parts;
  size_t k = 0;
  while (k < s.size()) {
    for (size_t n; k < s.size() && (n = py_space_at(s, k)) > 0;) k += n;
    if (k >= s.size()) break;
    if (maxsplit >= 0 && static_cast<long long>(parts.size()) >= maxsplit) {
      parts.push_back(s.substr(k));  // the rest as it is: Python keeps its trailing whitespace
      break;
    }
    size_t e = k, len = 0;
    while (e < s.size() && py_space_at(s, e) == 0) {
      decode_at(s, e, len);
      e += len;
    }
    parts.push_back(s.substr(k, e - k));
    k = e;
  }
  return parts;
}

std::string py_title(const std::string& s) {
  std::string out, lower_run;  // characters after a cased one are lower-cased together (final sigma)
  bool previous_cased = false;
  for (size_t k = 0, len = 0; k < s.size(); k += len) {
    const char32_t cp = decode_at(s, k, len);
    if (previous_cased) {
      lower_run += s.substr(k, len);
    } else {
      out += text::lowercase_unicode(lower_run);
      lower_run.clear();
      out += title_of(cp);
    }
    previous_cased = is_cased(cp);
  }
  return out + text::lowercase_unicode(lower_run);
}

std::string jinja_title(const std::string& s) {
  // re.split(r"([-\s\(\{\[\<]+)"): separator runs and words alternate; each piece is
  // piece[0].upper() + piece[1:].lower() (a separator run is unchanged by that).
  auto is_sep = [&](size_t i, size_t& len) {
    const char32_t cp = decode_at(s, i, len);
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_is_space(cp);
  };
  std::string out;
  size_t k = 0, len = 0;
  while (k < s.size()) {
    const bool sep = is_sep(k, len);
    size_t e = k;
    while (e < s.size() && is_sep(e, len) == sep) e += len;
    size_t first = 0;
    decode_at(s, k, first);
    out += text::uppercase_unicode(s.substr(k, first)) + text::lowercase_unicode(s.substr(k + first, e - k - first));
    k = e;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t first = 0;
  const char32_t cp = decode_at(s, 0, first);
  return title_of(cp) + text::lowercase_unicode(s.substr(first));
}

std::string py_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t k = 0, len = 0; k < s.size(); k += len) {
    const char32_t cp = decode_at(s, k, len);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < ' ' || cp == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(cp));
    } else if (cp < 0x7F) {
      out += static_cast<char>(cp);
    } else if (py_printable(cp) && len > 1) {
      out += s.substr(k, len);
    } else {
      out += cp <= 0xFF     ? fmt::format("\\x{:02x}", static_cast<unsigned>(cp))
             : cp <= 0xFFFF ? fmt::format("\\u{:04x}", static_cast<unsigned>(cp))
                            : fmt::format("\\U{:08x}", static_cast<unsigned>(cp));
    }
  }
  return out + quote;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace bp::jinja
