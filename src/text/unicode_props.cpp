// ICU-defined property classes for PCRE2 (see unicode_props.h).
//
// For \p{X}, with T = ICU's set and P = PCRE2's own \p{X}: A = T - P (characters PCRE2 lacks) and
// R = P - T (characters PCRE2 puts in X that ICU does not). Both come from running PCRE2 itself
// over the code points, so nothing assumes which Unicode version either library has. When R is
// empty the class is "\p{X}" plus A (with Unicode 14 vs 15.0 that holds for every general
// category); otherwise it is T spelled out as ranges.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/unicode_props.h"

#include <pcre2.h>
#include <unicode/uset.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "text/unicode.h"

namespace bp::text {

namespace {

using CodeRanges = std::vector<std::pair<char32_t, char32_t>>;

struct SetCloser {
  void operator()(USet* s) const { uset_close(s); }
};
using SetPtr = std::unique_ptr<USet, SetCloser>;

struct CodeCloser {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeCloser>;

bool plain_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '=' || c == '-' || c == '.' || c == ' ';
    if (!ok) return false;
  }
  return true;
}

// ICU's \p{name} (or \P{name}) without the surrogates, which UTF-8 text never holds.
SetPtr icu_set(const std::string& name, bool negated) {
  std::u16string pattern = negated ? u"\\P{" : u"\\p{";
  for (char c : name) pattern.push_back(static_cast<char16_t>(c));
  pattern.push_back(u'}');
  UErrorCode err = U_ZERO_ERROR;
  SetPtr set(
      uset_openPattern(reinterpret_cast<const UChar*>(pattern.data()), static_cast<int32_t>(pattern.size()), &err));
  if (U_FAILURE(err)) return nullptr;
  uset_removeRange(set.get(), 0xD800, 0xDFFF);
  return set;
}

CodeRanges ranges_of(const USet* set) {
  CodeRanges out;
  const int32_t n = uset_getItemCount(set);
  for (int32_t k = 0; k < n; ++k) {
    UChar32 a = 0, b = 0;
    UErrorCode err = U_ZERO_ERROR;
    if (uset_getItem(set, k, &a, &b, nullptr, 0, &err) == 0 && U_SUCCESS(err))
      out.emplace_back(static_cast<char32_t>(a), static_cast<char32_t>(b));
  }
  return out;
}

CodePtr compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  CodePtr code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                             &off, nullptr));
  if (code) pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  return code;
}

// Every code point but the surrogates, as UTF-8 (built once, 4.3 MB).
const std::string& all_code_points() {
  static const std::string text = [] {
    std::string t;
    t.reserve(4400000);
    for (char32_t c = 0; c <= 0x10FFFF; ++c)
      if (c < 0xD800 || c > 0xDFFF) append_utf8(t, c);
    return t;
  }();
  return text;
}

// The set of code points that `code` (a "[...]+" class: one match per run) matches.
SetPtr pcre2_set(pcre2_code* code) {
  const std::string& text = all_code_points();
  SetPtr out(uset_openEmpty());
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size() && pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr) >= 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t i = ov[0];
    const char32_t first = next_code_point(text, i);
    char32_t last = first;
    for (i = ov[0]; i < ov[1];) last = next_code_point(text, i);
    uset_addRange(out.get(), static_cast<UChar32>(first), static_cast<UChar32>(last));
    pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
  }
  pcre2_match_data_free(md);
  uset_removeRange(out.get(), 0xD800, 0xDFFF);  // a run may span the surrogates, which the text skips
  return out;
}

std::string spelled(const CodeRanges& ranges) {
  std::string out;
  char buf[32];
  for (const auto& [a, b] : ranges) {
    if (a == b) {
      std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(a));
    } else {
      std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", static_cast<unsigned>(a), static_cast<unsigned>(b));
    }
    out += buf;
  }
  return out;
}

std::string compute_items(const std::string& name, bool negated) {
  if (!plain_name(name)) return "";
  const SetPtr target = icu_set(name, negated);
  if (!target || uset_isEmpty(target.get())) return "";
  const std::string base = (negated ? "\\P{" : "\\p{") + name + "}";
  const CodePtr code = compile("[" + base + "]+");
  if (!code) return "";  // a name PCRE2 does not know
  const SetPtr pcre2 = pcre2_set(code.get());
  SetPtr extra(uset_cloneAsThawed(pcre2.get()));  // R = P - T
  uset_removeAll(extra.get(), target.get());
  if (!uset_isEmpty(extra.get())) return spelled(ranges_of(target.get()));
  SetPtr missing(uset_cloneAsThawed(target.get()));  // A = T - P
  uset_removeAll(missing.get(), pcre2.get());
  return base + spelled(ranges_of(missing.get()));
}

}  // namespace

std::string pcre2_property_items(const std::string& name, bool negated) {
  static std::mutex mu;
  static std::map<std::pair<std::string, bool>, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({name, negated});
  if (it == cache.end()) it = cache.emplace(std::make_pair(name, negated), compute_items(name, negated)).first;
  return it->second;
}

}  // namespace bp::text
