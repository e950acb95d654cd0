// Character classes of the pre-tokenizer regexes come from ICU (Unicode 15.0 on Debian 12), not
// from PCRE2's own tables (Unicode 14.0 in PCRE2 10.42): every code point is checked against ICU
// for the classes tokenizer.json patterns use, and characters added in Unicode 15.0 are split as
// Hugging Face's tokenizers split them. (Unicode 15.1 and later need a newer ICU than 72.)
#include <gtest/gtest.h>
#include <unicode/uset.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/pretokenize.h"
#include "text/unicode.h"

namespace bp {
namespace {

using nlohmann::json;
using Pieces = std::vector<std::string>;

struct SetCloser {
  void operator()(USet* s) const { uset_close(s); }
};
using SetPtr = std::unique_ptr<USet, SetCloser>;

// ICU's set for a UnicodeSet pattern, without surrogates (never in UTF-8 text).
SetPtr icu_set(const std::string& pattern) {
  std::u16string p(pattern.begin(), pattern.end());
  UErrorCode err = U_ZERO_ERROR;
  SetPtr s(uset_openPattern(reinterpret_cast<const UChar*>(p.data()), static_cast<int32_t>(p.size()), &err));
  EXPECT_TRUE(U_SUCCESS(err)) << pattern << ": " << u_errorName(err);
  uset_removeRange(s.get(), 0xD800, 0xDFFF);
  return s;
}

const std::string& all_code_points() {
  static const std::string text = [] {
    std::string t;
    for (char32_t c = 0; c <= 0x10FFFF; ++c)
      if (c < 0xD800 || c > 0xDFFF) text::append_utf8(t, c);
    return t;
  }();
  return text;
}

// The code points that `regex` (one character class, Oniguruma syntax) matches.
SetPtr regex_set(const std::string& regex) {
  const text::Regex re("(?:" + regex + ")+");
  std::vector<std::pair<size_t, size_t>> runs;
  re.find_all(all_code_points(), runs);
  SetPtr s(uset_openEmpty());
  const std::string& all = all_code_points();
  for (const auto& [start, end] : runs) {  // a run is consecutive code points (bar the surrogates)
    size_t i = start, last = end - 1;
    while ((static_cast<unsigned char>(all[last]) & 0xC0) == 0x80) --last;
    const char32_t first = text::next_code_point(all, i);
    uset_addRange(s.get(), static_cast<UChar32>(first), static_cast<UChar32>(text::next_code_point(all, last)));
  }
  uset_removeRange(s.get(), 0xD800, 0xDFFF);
  return s;
}

std::string first_differences(const USet* got, const USet* want) {
  std::string out;
  int shown = 0;
  for (UChar32 c = 0; c <= 0x10FFFF && shown < 8; ++c) {
    if (uset_contains(got, c) == uset_contains(want, c)) continue;
    char buf[48];
    std::snprintf(buf, sizeof(buf), " U+%04X(%s)", static_cast<unsigned>(c),
                  uset_contains(got, c) ? "extra" : "missing");
    out += buf;
    ++shown;
  }
  return out;
}

TEST(UnicodeProps, EveryCodePointFollowsIcu) {
  // (pattern as tokenizer.json writes it, the same set as an ICU UnicodeSet)
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\\p{L}", "\\p{L}"},
      {"\\p{N}", "\\p{N}"},
      {"\\p{P}", "\\p{P}"},
      {"\\p{S}", "\\p{S}"},
      {"\\p{M}", "\\p{M}"},
      {"\\p{Lm}", "\\p{Lm}"},
      {"\\p{No}", "\\p{No}"},
      {"\\p{Han}", "\\p{Script=Han}"},
      {"\\P{L}", "\\P{L}"},
      {"\\p{^N}", "\\P{N}"},
      {"[\\P{N}]", "\\P{N}"},
      {"[^\\s\\p{L}\\p{N}]", "[^\\p{White_Space}\\p{L}\\p{N}]"},
      {"[^\\r\\n\\p{L}\\p{N}]", "[^\\u000D\\u000A\\p{L}\\p{N}]"},
      {"\\s", "\\p{White_Space}"},
      {"\\S", "\\P{White_Space}"},
      {"\\d", "\\p{Nd}"},
      {"[\\D]", "\\P{Nd}"},
      {"\\w", "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}]"},
      {"[^\\w\\s]", "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{White_Space}]"},
  };
  for (const auto& [regex, icu] : cases) {
    const SetPtr got = regex_set(regex), want = icu_set(icu);
    EXPECT_TRUE(uset_equals(got.get(), want.get()))
        << regex << " differs from ICU's " << icu << ":" << first_differences(got.get(), want.get());
  }
}

std::string utf8(char32_t c) {
  std::string s;
  text::append_utf8(s, c);
  return s;
}

TEST(UnicodeProps, Unicode15CharactersHaveTheirCategories) {
  const auto matches = [](const std::string& regex, char32_t c) {
    std::vector<std::pair<size_t, size_t>> m;
    text::Regex(regex).find_all(utf8(c), m);
    return m.size() == 1;
  };
  EXPECT_TRUE(matches("\\p{N}", 0x1D2C0));   // KAKTOVIK NUMERAL ZERO (No)
  EXPECT_TRUE(matches("\\p{No}", 0x1D2D3));  // KAKTOVIK NUMERAL NINETEEN
  EXPECT_TRUE(matches("\\p{L}", 0x11F04));   // KAWI LETTER A (Lo)
  EXPECT_TRUE(matches("\\p{M}", 0x11F34));   // KAWI VOWEL SIGN AA (Mc)
  EXPECT_TRUE(matches("\\d", 0x11F50));      // KAWI DIGIT ZERO (Nd)
  EXPECT_TRUE(matches("\\p{Lm}", 0x1E030));  // MODIFIER LETTER CYRILLIC SMALL A
  EXPECT_TRUE(matches("\\p{Lo}", 0x31350));  // CJK UNIFIED IDEOGRAPH-31350 (Extension H)
  EXPECT_TRUE(matches("\\p{Han}", 0x323AF));
  EXPECT_TRUE(matches("\\w", 0x0C04));  // Alphabetic since Unicode 15.0 (a mark since 11.0)
  EXPECT_FALSE(matches("[^\\s\\p{L}\\p{N}]", 0x1D2C0));
  EXPECT_FALSE(matches("\\P{L}", 0x31350));
}

// cl100k's pattern (Split, then ByteLevel without a regex), as in the report: " \U0001D2C0" is
// a space and a numeral for Hugging Face (220, then the numeral's bytes), not one punctuation run.
TEST(UnicodeProps, Cl100kSplitsAKaktovikNumeralFromTheSpace) {
  const json split = {{"type", "Split"},
                      {"pattern",
                       {{"Regex",
                         "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}};
  auto pre = text::make_pre_tokenizer(split);
  Pieces pieces{" " + utf8(0x1D2C0)};
  pre->split(pieces, true);
  EXPECT_EQ(pieces, (Pieces{" ", utf8(0x1D2C0)}));
  pieces = {"x" + utf8(0x31350) + utf8(0x11F04) + " " + utf8(0x11F50) + utf8(0x11F51) + utf8(0x11F52) + utf8(0x11F53)};
  pre->split(pieces, true);
  EXPECT_EQ(pieces, (Pieces{"x" + utf8(0x31350) + utf8(0x11F04), " ", utf8(0x11F50) + utf8(0x11F51) + utf8(0x11F52),
                            utf8(0x11F53)}));
}

}  // namespace
}  // namespace bp
