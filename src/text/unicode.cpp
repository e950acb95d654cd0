// UTF-8 helpers, GPT-2's byte alphabet and ICU-backed normalization (see unicode.h).
#include "text/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <vector>

#include "core/error.h"

namespace bp::text {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t n = utf8_len(b0);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return b0;
  }
  char32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {

// Length of the well-formed sequence at s[i], or 0 with *bad_len = bytes of the maximal
// subpart (>= 1) that must become one U+FFFD.
size_t valid_sequence_at(std::string_view s, size_t i, size_t* bad_len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad_len = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *bad_len = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *bad_len = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = valid_sequence_at(s, i, &bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = valid_sequence_at(s, i, &bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 324> to_byte;  // all mapped code points are < 324
  ByteTables() {
    // GPT-2: printable Latin-1 bytes map to themselves, the others to 256 + n in byte order.
    std::array<char32_t, 256> cps{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) cps[b] = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      append_utf8(to_unicode[b], cps[b]);
      to_byte[cps[b]] = b;
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

// Runs an ICU call that writes into a caller-sized buffer: first with room for `guess` units,
// then, when ICU answers U_BUFFER_OVERFLOW_ERROR with the length it needs, once more with exactly
// that room. Normalization can grow text far past any fixed ratio (NFKC turns U+FDFA into 18 code
// points), so the room must come from ICU's answer, never from a guess alone.
template <class Unit, class Call>
std::basic_string<Unit> icu_write(size_t guess, Call&& call, const char* what) {
  std::basic_string<Unit> out(std::min<size_t>(guess, INT32_MAX), Unit{});
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = call(out.data(), static_cast<int32_t>(out.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR && len > static_cast<int32_t>(out.size())) {
    out.assign(static_cast<size_t>(len), Unit{});
    err = U_ZERO_ERROR;
    len = call(out.data(), len, &err);
  }
  if (U_FAILURE(err))
    throw Error(ErrorCode::RUNTIME_INTERNAL, std::string("[tokenizer] ICU ") + what + " failed: " + u_errorName(err) +
                                                 " (" + std::to_string(out.size()) + " units of room)");
  out.resize(static_cast<size_t>(len));
  return out;
}

bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::u16string to_utf16(std::string_view s) {
  if (s.size() > INT32_MAX)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                "[tokenizer] text of " + std::to_string(s.size()) + " bytes is past ICU's 2 GiB limit");
  return icu_write<char16_t>(
      s.size() + 1,
      [&](char16_t* dst, int32_t cap, UErrorCode* e) {
        int32_t len = 0;
        u_strFromUTF8(reinterpret_cast<UChar*>(dst), cap, &len, s.data(), static_cast<int32_t>(s.size()), e);
        return len;
      },
      "UTF-8 decode");
}

std::string to_utf8(const std::u16string& s) {
  return icu_write<char>(
      s.size() * 3 + 1,
      [&](char* dst, int32_t cap, UErrorCode* e) {
        int32_t len = 0;
        u_strToUTF8(dst, cap, &len, reinterpret_cast<const UChar*>(s.data()), static_cast<int32_t>(s.size()), e);
        return len;
      },
      "UTF-8 encode");
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() {
  return byte_tables().to_unicode;
}

int unicode_to_byte(char32_t cp) {
  const auto& t = byte_tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

bool is_unicode_whitespace(char32_t cp) {
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

std::string normalize_unicode(std::string_view text, NormalForm form) {
  if (is_ascii(text)) return std::string(text);  // ASCII is invariant under every normal form
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = nullptr;
  switch (form) {
    case NormalForm::NFC: norm = unorm2_getNFCInstance(&err); break;
    case NormalForm::NFD: norm = unorm2_getNFDInstance(&err); break;
    case NormalForm::NFKC: norm = unorm2_getNFKCInstance(&err); break;
    case NormalForm::NFKD: norm = unorm2_getNFKDInstance(&err); break;
  }
  if (U_FAILURE(err))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                std::string("[tokenizer] ICU normalizer unavailable: ") + u_errorName(err));
  const std::u16string in = to_utf16(text);
  const auto* src = reinterpret_cast<const UChar*>(in.data());
  const auto n = static_cast<int32_t>(in.size());
  return to_utf8(icu_write<char16_t>(
      in.size() + in.size() / 2 + 16,
      [&](char16_t* dst, int32_t cap, UErrorCode* e) {
        return unorm2_normalize(norm, src, n, reinterpret_cast<UChar*>(dst), cap, e);
      },
      "normalize"));
}

namespace {
std::string change_case(std::string_view text, bool upper) {
  if (is_ascii(text)) {
    std::string out(text);
    for (char& c : out)
      c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                  : std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  const std::u16string in = to_utf16(text);
  const auto* src = reinterpret_cast<const UChar*>(in.data());
  const auto n = static_cast<int32_t>(in.size());
  return to_utf8(icu_write<char16_t>(
      in.size() + in.size() / 2 + 16,
      [&](char16_t* d, int32_t cap, UErrorCode* e) {
        auto* dst = reinterpret_cast<UChar*>(d);
        return upper ? u_strToUpper(dst, cap, src, n, "", e) : u_strToLower(dst, cap, src, n, "", e);
      },
      "case mapping"));
}
}  // namespace

std::string lowercase_unicode(std::string_view text) {
  return change_case(text, false);
}

std::string uppercase_unicode(std::string_view text) {
  return change_case(text, true);
}

}  // namespace bp::text
