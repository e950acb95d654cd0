// Python's str behaviour for the Jinja interpreter, where C's <ctype.h> and plain byte loops differ
// from what transformers' Jinja2 does: whitespace is str.isspace() (Unicode, \x1c-\x1f and \x85
// included), case mapping is Unicode (through ICU), characters are code points, and repr() of a
// string quotes and escapes as Python does. Strings are UTF-8; an invalid byte counts as one
// character of its own value.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace bp::jinja {

// Byte length of the str.isspace() code point starting at s[i], or 0.
size_t py_space_at(const std::string& s, size_t i);
// str.strip() / lstrip() / rstrip() with no argument: Python whitespace.
std::string py_strip(const std::string& s, bool left, bool right);
// str.strip(chars): removes any code point of `chars` (not bytes) from the chosen ends.
std::string py_strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
// str.split() with no separator: runs of Python whitespace; maxsplit < 0 = no limit.
std::vector<std::string> py_split_whitespace(const std::string& s, long long maxsplit);
// str.title(): a cased letter after an uncased character (or at the start) is title-cased, the
// others lower-cased ("they're" -> "They'Re", "aBc1d" -> "Abc1D").
std::string py_title(const std::string& s);
// Jinja2's |title filter: words split at runs of whitespace, '-', '(', '{', '[', '<'; each
// word's first character upper-cased and the rest lower-cased ("they're" -> "They're").
std::string jinja_title(const std::string& s);
// str.capitalize(): the first character title-cased, the rest lower-cased.
std::string py_capitalize(const std::string& s);
// repr(str): single quotes unless the text has ' and no ", backslash escapes for the quote,
// backslash, \n \r \t, other control and non-printable characters as \xNN / \uNNNN / \UNNNNNNNN.
std::string py_repr(const std::string& s);
// markupsafe.escape: & < > ' " as &amp; &lt; &gt; &#39; &#34;.
std::string html_escape(const std::string& s);

}  // namespace bp::jinja
