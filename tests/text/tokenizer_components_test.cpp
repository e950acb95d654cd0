// Tokenizer building blocks: split behaviours, Metaspace / ByteLevel pre-tokenizers, UTF-8
// repair, normalization, the heap-based BPE against a plain quadratic reference, single_word
// added tokens, tokenizer_config.json / generation_config.json variants.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "support/test_util.h"
#include "text/bpe.h"
#include "text/normalize.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace bp {
namespace {

using nlohmann::json;
using Pieces = std::vector<std::string>;

Pieces pre_tokenize(const json& spec, const std::string& text, bool first = true) {
  auto p = text::make_pre_tokenizer(spec);
  Pieces pieces{text};
  p->split(pieces, first);
  return pieces;
}

json split_spec(const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

// The examples of Hugging Face's SplitDelimiterBehavior documentation.
TEST(PreTokenizer, SplitBehaviours) {
  const std::string s = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split_spec("Removed"), s), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_spec("Isolated"), s), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_spec("MergedWithPrevious"), s), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_spec("MergedWithNext"), s), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split_spec("Contiguous"), s), (Pieces{"the", "-", "final", "--", "countdown"}));
  // invert: the pattern describes the pieces to keep.
  const json words = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pre_tokenize(words, "héllo, wörld!"), (Pieces{"héllo", "wörld"}));
}

TEST(PreTokenizer, RegexIsUnicodeAware) {
  // Llama-3's pattern: letters with one leading non-letter, digits in groups of at most 3.
  const json spec = {{"type", "Split"},
                     {"pattern",
                      {{"Regex",
                        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                     {"behavior", "Isolated"}};
  EXPECT_EQ(pre_tokenize(spec, "I'M 12345 日本語  x\n\n"),
            (Pieces{"I", "'M", " ", "123", "45", " 日本語", " ", " x", "\n\n"}));
  // A run of 100k spaces must not blow the JIT stack.
  EXPECT_EQ(pre_tokenize(spec, std::string(100000, ' ') + "x").size(), 2u);
}

TEST(PreTokenizer, OnigurumaEscapesBecomeUnicodeProperties) {
  // (What \p{L}, \w and \d become depends on ICU: tests/text/unicode_props_test.cpp checks them.)
  EXPECT_EQ(text::onig_to_pcre2(R"([^\s]\s+\S\h[\h]\H)"),
            R"([^\p{White_Space}]\p{White_Space}+\P{White_Space}[0-9A-Fa-f][0-9A-Fa-f][^0-9A-Fa-f])");
  EXPECT_EQ(text::onig_to_pcre2(R"([]\s][[:alpha:]\s]\\s)"), R"([]\p{White_Space}][[:alpha:]\p{White_Space}]\\s)");
  // U+180E is not White_Space (PCRE2's own \s would take it): it stays glued to the letter.
  const json spec = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+|\\S+"}}}, {"behavior", "Isolated"}};
  EXPECT_EQ(pre_tokenize(spec, "a\xE1\xA0\x8E \xC2\x85"), (Pieces{"a\xE1\xA0\x8E", " \xC2\x85"}));
}

TEST(PreTokenizer, ByteLevelWithGpt2Regex) {
  const json spec = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(pre_tokenize(spec, "Hello my friend"), (Pieces{"\xC4\xA0Hello", "\xC4\xA0my",
                                                           "\xC4\xA0"
                                                           "friend"}));
  EXPECT_EQ(pre_tokenize(spec, "\n"), (Pieces{"\xC4\xA0\xC4\x8A"}));  // " \n" -> "ĠĊ"
}

TEST(PreTokenizer, Metaspace) {
  const json always = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(pre_tokenize(always, "Hey friend!"), (Pieces{"\xE2\x96\x81Hey",
                                                         "\xE2\x96\x81"
                                                         "friend!"}));
  const json first = {{"type", "Metaspace"}, {"prepend_scheme", "first"}, {"split", false}};
  EXPECT_EQ(pre_tokenize(first, "a b", true), (Pieces{"\xE2\x96\x81"
                                                      "a\xE2\x96\x81"
                                                      "b"}));
  EXPECT_EQ(pre_tokenize(first, "a b", false), (Pieces{"a\xE2\x96\x81"
                                                       "b"}));
  EXPECT_THROW(text::make_pre_tokenizer(json{{"type", "BertPreTokenizer"}}), std::invalid_argument);
}

TEST(PreTokenizer, DigitsAndWhitespace) {
  // SmolLM's Sequence: Digits(individual) then ByteLevel.
  const json smollm = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]})");
  EXPECT_EQ(pre_tokenize(smollm, "ab 123"), (Pieces{"ab", "\xC4\xA0", "1", "2", "3"}));
  EXPECT_EQ(pre_tokenize(json{{"type", "Digits"}, {"individual_digits", false}}, "a12b3"),
            (Pieces{"a", "12", "b", "3"}));
  EXPECT_EQ(pre_tokenize(json{{"type", "Whitespace"}}, "Hey  man!! ok"), (Pieces{"Hey", "man", "!!", "ok"}));
  EXPECT_EQ(pre_tokenize(json{{"type", "WhitespaceSplit"}}, " Hey  man!! "), (Pieces{"Hey", "man!!"}));
}

TEST(Unicode, LossyUtf8UsesMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(text::utf8_lossy("ok"), "ok");
  EXPECT_EQ(text::utf8_lossy("\xF0\x9F\x98"), fffd);  // truncated 4-byte sequence: one
  EXPECT_EQ(text::utf8_lossy("\xE0\x80"
                             "a"),
            fffd + fffd + "a");                                     // E0 80 is never valid: two
  EXPECT_EQ(text::utf8_lossy("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(text::utf8_lossy("\xFF\xC3\xA9"), fffd + "\xC3\xA9");
  EXPECT_TRUE(text::is_valid_utf8("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(text::is_valid_utf8("\xC0\x80"));  // overlong
}

TEST(Unicode, ByteAlphabetRoundTrips) {
  const auto& table = text::byte_to_unicode();
  EXPECT_EQ(table[' '], "\xC4\xA0");  // Ġ
  EXPECT_EQ(table['A'], "A");
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    EXPECT_EQ(text::unicode_to_byte(text::next_code_point(table[b], i)), b);
  }
}

TEST(Normalizer, NfcPrependReplace) {
  auto nfc = text::make_normalizer(json{{"type", "NFC"}});
  EXPECT_EQ(nfc->normalize("cafe\xCC\x81"), "caf\xC3\xA9");
  auto sp = text::make_normalizer(json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})"));
  EXPECT_EQ(sp->normalize("a b"),
            "\xE2\x96\x81"
            "a\xE2\x96\x81"
            "b");
  EXPECT_EQ(sp->normalize(""), "");  // Prepend leaves empty text alone
  auto re = text::make_normalizer(json::parse(R"({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})"));
  EXPECT_EQ(re->normalize("a    b  c d"), "a b c d");
  EXPECT_THROW(text::make_normalizer(json{{"type", "Precompiled"}}), std::invalid_argument);
}

// Plain BPE: repeatedly merge the adjacent pair of lowest rank (leftmost on ties).
std::vector<std::string> reference_bpe(std::vector<std::string> sym,
                                       const std::map<std::pair<std::string, std::string>, int>& ranks) {
  while (sym.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks.find({sym[i], sym[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  return sym;
}

TEST(Bpe, HeapMergeLoopEqualsQuadraticReference) {
  std::ifstream f(test::shared_dir() + "/models/stories260K/tokenizer.json");
  const json j = json::parse(f);
  const json& m = j["model"];
  text::BpeModel model(m, text::BpeModel::vocab_from_json(m), text::BpeModel::merges_from_json(m));
  std::map<std::pair<std::string, std::string>, int> ranks;
  int r = 0;
  for (const auto& mg : m["merges"]) {
    const std::string s =
        mg.is_string() ? mg.get<std::string>() : mg[0].get<std::string>() + " " + mg[1].get<std::string>();
    ranks.emplace(std::make_pair(s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)), r++);
  }
  // Random words over letters the vocab knows, so no byte fallback interferes.
  const std::string alphabet = "abdehilnorstuwy";
  std::mt19937 rng(7);
  size_t merged_words = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t len = 1 + rng() % 40;
    std::string word = "\xE2\x96\x81";
    std::vector<std::string> chars{word};
    for (size_t k = 0; k < len; ++k) {
      chars.emplace_back(1, alphabet[rng() % alphabet.size()]);
      word += chars.back();
    }
    std::vector<int32_t> ids;
    model.encode(word, ids);
    std::vector<int32_t> want;
    for (const auto& t : reference_bpe(chars, ranks)) want.push_back(model.token_to_id(t));
    ASSERT_EQ(ids, want) << word;
    merged_words += ids.size() < chars.size();
  }
  EXPECT_GT(merged_words, 250u);  // the words really exercise the merges
}

struct TokenizerDir {
  test::TempDir dir;
  explicit TokenizerDir(const json& tokenizer, const json& config = json(), const json& gen = json()) {
    std::ofstream(dir.path + "/tokenizer.json") << tokenizer.dump();
    if (!config.is_null()) std::ofstream(dir.path + "/tokenizer_config.json") << config.dump();
    if (!gen.is_null()) std::ofstream(dir.path + "/generation_config.json") << gen.dump();
  }
};

json stories_tokenizer() {
  std::ifstream f(test::shared_dir() + "/models/stories260K/tokenizer.json");
  return json::parse(f);
}

TEST(Tokenizer, SingleWordAddedTokenNeedsWordBoundaries) {
  json t = stories_tokenizer();
  t["added_tokens"].push_back({{"id", 512},
                               {"content", "cat"},
                               {"single_word", true},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", false}});
  TokenizerDir d(t);
  auto tok = Tokenizer::from_dir(d.dir.path);
  auto count = [&](const std::string& s) {
    const auto ids = tok->encode(s);
    return std::count(ids.begin(), ids.end(), 512);
  };
  EXPECT_EQ(count("a cat sat"), 1);
  EXPECT_EQ(count("cat"), 1);
  EXPECT_EQ(count("concatenate"), 0);
  EXPECT_EQ(count("cats"), 0);
  EXPECT_EQ(tok->vocab_size(), 513);
}

TEST(Tokenizer, ConfigVariants) {
  const json config = json::parse(R"({
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": {"content": "</s>"}, "pad_token": "<unk>",
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  TokenizerDir d(stories_tokenizer(), config, json{{"eos_token_id", {2, 5}}});
  auto tok = Tokenizer::from_dir(d.dir.path);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->chat_template(), "D");
  // No config at all: BOS comes from the post-processor template, nothing else is known.
  auto bare = Tokenizer::from_file(d.dir.path + "/tokenizer.json");
  EXPECT_EQ(bare->bos_id(), 1);
  EXPECT_TRUE(bare->eos_ids().empty());
  EXPECT_EQ(bare->chat_template(), "");
}

TEST(Tokenizer, InvalidUtf8InputIsRepairedNotFatal) {
  auto tok = Tokenizer::from_dir(test::shared_dir() + "/models/stories260K");
  const auto ids = tok->encode(
      "a\xFF"
      "b");
  EXPECT_EQ(tok->decode(ids),
            "a\xEF\xBF\xBD"
            "b");
  // A byte-fallback BOM survives decoding, as with Rust's String::from_utf8. (The oracle's
  // TextDecoder drops a BOM at the start of each byte run, so the parity corpus has no BOM.)
  const std::string bom = "x\xEF\xBB\xBFy";
  EXPECT_EQ(tok->decode(tok->encode(bom)), bom);
  // Unknown ids (e.g. padded embedding rows) decode to nothing instead of throwing.
  EXPECT_EQ(tok->decode({403, 100000, -1}), tok->decode({403}));
}

TEST(Tokenizer, BadConfigFileIsALoadError) {
  TokenizerDir d(stories_tokenizer());
  std::ofstream(d.dir.path + "/tokenizer_config.json") << "{not json";
  try {
    Tokenizer::from_dir(d.dir.path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp
