// Unicode normalization and case mapping on the text that grows the most. ICU writes into a
// buffer the caller sizes; a buffer sized from the input's length (3x + 16 units) made NFKC of
// "\uFDFA\uFDFA" fail with U_BUFFER_OVERFLOW_ERROR, so these cases check both that legal text
// never throws and that the result is the expansion the Unicode data gives.
#include "text/unicode.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "text/normalize.h"

namespace bp {
namespace {

using text::NormalForm;

std::string utf8(std::initializer_list<char32_t> cps) {
  std::string s;
  for (char32_t c : cps) text::append_utf8(s, c);
  return s;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

// U+FDFA ARABIC LIGATURE SALLALLAHOU ALAYHE WASALLAM: NFKC/NFKD give "صلى الله عليه وسلم",
// 18 code points from one (the largest expansion in Unicode).
const std::string kFdfa = utf8({0xFDFA});
const std::string kFdfaExpanded = utf8({0x0635, 0x0644, 0x0649, 0x0020, 0x0627, 0x0644, 0x0644, 0x0647, 0x0020, 0x0639,
                                        0x0644, 0x064A, 0x0647, 0x0020, 0x0648, 0x0633, 0x0644, 0x0645});

TEST(UnicodeNormalize, LargestCompatibilityExpansionDoesNotOverflow) {
  EXPECT_EQ(text::normalize_unicode(kFdfa + kFdfa, NormalForm::NFKC), kFdfaExpanded + kFdfaExpanded);
  EXPECT_EQ(text::normalize_unicode(kFdfa, NormalForm::NFKD), kFdfaExpanded);
  // Canonical forms leave it alone (it has only a compatibility decomposition).
  EXPECT_EQ(text::normalize_unicode(kFdfa + kFdfa, NormalForm::NFC), kFdfa + kFdfa);
  // A long run, and the same run behind ASCII and after other text.
  EXPECT_EQ(text::normalize_unicode(repeat(kFdfa, 5000), NormalForm::NFKC), repeat(kFdfaExpanded, 5000));
  EXPECT_EQ(text::normalize_unicode("x" + repeat(kFdfa, 300) + "y", NormalForm::NFKD),
            "x" + repeat(kFdfaExpanded, 300) + "y");
}

TEST(UnicodeNormalize, OtherLargeExpansions) {
  // U+3300 SQUARE APAATO: NFKC "アパート" (4 code points); NFKD also splits パ into ハ + U+309A (5).
  const std::string apaato = utf8({0x3300});
  EXPECT_EQ(text::normalize_unicode(repeat(apaato, 4000), NormalForm::NFKC),
            repeat(utf8({0x30A2, 0x30D1, 0x30FC, 0x30C8}), 4000));
  EXPECT_EQ(text::normalize_unicode(repeat(apaato, 4000), NormalForm::NFKD),
            repeat(utf8({0x30A2, 0x30CF, 0x309A, 0x30FC, 0x30C8}), 4000));
  // U+FB2C HEBREW LETTER SHIN WITH DAGESH AND SHIN DOT: composition-excluded, so NFC and NFD both
  // give three code points.
  const std::string shin = utf8({0xFB2C});
  EXPECT_EQ(text::normalize_unicode(repeat(shin, 4000), NormalForm::NFD), repeat(utf8({0x05E9, 0x05BC, 0x05C1}), 4000));
  EXPECT_EQ(text::normalize_unicode(repeat(shin, 4000), NormalForm::NFC), repeat(utf8({0x05E9, 0x05BC, 0x05C1}), 4000));
  // U+FB03 LATIN SMALL LIGATURE FFI and U+2474 PARENTHESIZED DIGIT ONE: "ffi", "(1)".
  EXPECT_EQ(text::normalize_unicode(repeat(utf8({0xFB03, 0x2474}), 3000), NormalForm::NFKC), repeat("ffi(1)", 3000));
  // U+1D160 MUSICAL SYMBOL EIGHTH NOTE (a supplementary code point): three code points in NFC.
  EXPECT_EQ(text::normalize_unicode(repeat(utf8({0x1D160}), 3000), NormalForm::NFC),
            repeat(utf8({0x1D158, 0x1D165, 0x1D16E}), 3000));
}

TEST(UnicodeNormalize, NormalizerOfATokenizerTakesTheExpansion) {
  for (const char* form : {"NFKC", "NFKD"}) {
    auto norm = text::make_normalizer(nlohmann::json{{"type", form}});
    EXPECT_EQ(norm->normalize("a" + kFdfa + kFdfa + "b"), "a" + kFdfaExpanded + kFdfaExpanded + "b") << form;
  }
  auto seq = text::make_normalizer(
      nlohmann::json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})"));
  EXPECT_EQ(seq->normalize(repeat(utf8({0x3300}), 1000)), repeat(utf8({0x30A2, 0x30D1, 0x30FC, 0x30C8}), 1000));
}

TEST(UnicodeCase, FullMappingsThatGrow) {
  // U+0390 uppercases to three code points, U+FB03 to "FFI", U+00DF to "SS"; U+0130 lowercases
  // to "i" + U+0307.
  EXPECT_EQ(text::uppercase_unicode(repeat(utf8({0x0390}), 5000)), repeat(utf8({0x0399, 0x0308, 0x0301}), 5000));
  EXPECT_EQ(text::uppercase_unicode(repeat(utf8({0xFB03, 0x00DF}), 3000)), repeat("FFISS", 3000));
  EXPECT_EQ(text::lowercase_unicode(repeat(utf8({0x0130}), 3000)), repeat(utf8({0x69, 0x0307}), 3000));
  EXPECT_EQ(text::lowercase_unicode("ABC"), "abc");
}

}  // namespace
}  // namespace bp
