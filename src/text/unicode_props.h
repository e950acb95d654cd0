// Unicode properties for the pre-tokenizer regexes, taken from ICU rather than from PCRE2.
//
// PCRE2 carries its own Unicode tables, and Debian 12's PCRE2 10.42 stops at Unicode 14.0:
// characters added since (U+1D2C0 KAKTOVIK NUMERAL ZERO, Kawi, CJK Extension H, ...) are
// unassigned to it, so \p{N} missed a Kaktovik numeral and " \U0001D2C0" pre-tokenized unlike
// Hugging Face's tokenizers. ICU 72 (Debian 12) is Unicode 15.0; Unicode 15.1 and later need a
// newer ICU. The regexes still run on PCRE2: each \p{..} becomes a class whose members are
// ICU's (see pcre2_property_items).
#pragma once

#include <string>

namespace bp::text {

// PCRE2 class items (text to put inside [...]) matching exactly the code points that ICU puts in
// the property `name` (general category, binary property or script, as \p{name} names it), or in
// its complement when `negated`. Where PCRE2's own \p{name} is right apart from characters it
// lacks, that is "\p{name}" followed by ranges of the missing ones (fast: PCRE2 tests its own
// tables first); otherwise every range is spelled out. "" when ICU or PCRE2 does not know the name.
// Thread-safe; each (name, negated) is computed once per process.
std::string pcre2_property_items(const std::string& name, bool negated);

}  // namespace bp::text
