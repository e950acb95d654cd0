// UTF-8 helpers for the tokenizer: code point iteration, lossy decoding, GPT-2's byte<->unicode
// table and Unicode normalization forms (through ICU, the reference implementation of NFC/NFKC).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace bp::text {

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for invalid lead bytes).
inline size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

void append_utf8(std::string& out, char32_t cp);
// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);

// True when s is well-formed UTF-8.
bool is_valid_utf8(std::string_view s);
// Well-formed UTF-8 with each ill-formed subsequence replaced by U+FFFD, using the "maximal
// subpart" rule of the Unicode standard (what WHATWG TextDecoder and Rust's from_utf8_lossy do).
std::string utf8_lossy(std::string_view bytes);

// GPT-2 byte-level alphabet: each byte maps to one printable code point (as UTF-8).
const std::array<std::string, 256>& byte_to_unicode();
// Inverse of byte_to_unicode: the byte for a code point, or -1 when it is not in the alphabet.
int unicode_to_byte(char32_t cp);

// White_Space property (Rust's char::is_whitespace, used for lstrip/rstrip of added tokens).
bool is_unicode_whitespace(char32_t cp);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
// Unicode normalization of valid UTF-8 text. Throws bp::Error (RUNTIME_INTERNAL) if ICU fails.
std::string normalize_unicode(std::string_view text, NormalForm form);
// Full Unicode lowercase mapping (String.toLowerCase / str::to_lowercase).
std::string lowercase_unicode(std::string_view text);
// Full Unicode uppercase mapping (String.toUpperCase / str.upper(): "straße" -> "STRASSE").
std::string uppercase_unicode(std::string_view text);

}  // namespace bp::text
