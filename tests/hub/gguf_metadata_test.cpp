// GGUF files from outside with hostile metadata (issue 37): `--model FILE.gguf` turns the file's
// metadata into config.json and tokenizer files (hub/gguf_source.h). Every case starts from
// stories260K exported by our own writer (whose metadata loads, checked first) and changes one key;
// each must end in DEP_MODEL_LOAD_FAILED naming the key and what is wrong with it, never in a
// division by zero, an empty-vector dereference or a JSON conversion error (RUNTIME_INTERNAL).
// A file that is no GGUF file is reported as such, not read as a model folder.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "export/gguf_export.h"
#include "hub/gguf_source.h"
#include "hub/model_source.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "model/loader.h"
#include "support/expect_error.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

std::string stories() {
  return test::shared_dir() + "/models/stories260K";
}

// stories260K's GGUF metadata (hidden 64, 8 heads, 4 kv heads, head_dim 8 without key_length,
// vocabulary of 512 SentencePiece tokens), read back from one export for the whole suite.
const GGUFMetadata& base_metadata() {
  static const GGUFMetadata meta = [] {
    test::TempDir dir;
    const std::string path = dir.path + "/base.gguf";
    export_gguf(load_model(stories()), stories(), GGUFQuant::F32, path);
    return GGUFReader(path).metadata();
  }();
  return meta;
}

struct Edit {
  std::string key;
  std::optional<GGUFValue> value;  // nullopt removes the key
};

// A GGUF file with the base metadata after `edits`, token_embd.weight of shape `embd` and `extra` tensors.
std::string write_variant(const test::TempDir& d, const std::vector<Edit>& edits, Shape embd = Shape{512, 64},
                          const std::vector<GGUFTensorSpec>& extra = {}) {
  GGUFWriter w;
  for (const auto& [k, v] : base_metadata()) {
    bool removed = false;
    for (const Edit& e : edits) removed |= e.key == k && !e.value;
    if (!removed) w.set(k, v);
  }
  for (const Edit& e : edits)
    if (e.value) w.set(e.key, *e.value);
  w.add_tensor(gguf_tensor_from("token_embd.weight", test::random_tensor(embd, 5), GGMLType::F32));
  for (const GGUFTensorSpec& t : extra) w.add_tensor(t);
  static int n = 0;
  const std::string path = fmt::format("{}/variant{}.gguf", d.path, n++);
  w.write(path);
  return path;
}

// The folder for a variant, or the error it raises.
std::string folder(const std::string& path, const test::TempDir& d) {
  return hub::gguf_model_folder(path, d.path + "/derived");
}

void expect_refused(const std::vector<Edit>& edits, std::initializer_list<std::string> needles,
                    Shape embd = Shape{512, 64}, const std::vector<GGUFTensorSpec>& extra = {}) {
  test::TempDir d;
  const std::string path = write_variant(d, edits, embd, extra);
  test::expect_error([&] { folder(path, d); }, ErrorCode::DEP_MODEL_LOAD_FAILED, needles);
}

TEST(GGUFMetadata, TheUnchangedMetadataLoads) {
  test::TempDir d;
  const ModelConfig c = load_model_config(folder(write_variant(d, {}), d));
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.bos_token_id, 1);
}

// A head count of 0 divided by zero (SIGFPE) before it was checked; every size is checked first.
TEST(GGUFMetadata, ZeroAndNegativeSizesAreRefusedNamingTheKey) {
  for (const char* key : {"block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                          "attention.head_count_kv", "attention.key_length", "context_length"}) {
    SCOPED_TRACE(key);
    const std::string full = std::string("llama.") + key;
    expect_refused({{full, GGUFValue::u32(0)}}, {full, "is 0", "at least 1"});
    expect_refused({{full, GGUFValue::i32(-3)}}, {full, "is -3"});
  }
  expect_refused({{"llama.attention.layer_norm_rms_epsilon", GGUFValue::f32(0)}},
                 {"llama.attention.layer_norm_rms_epsilon", "greater than 0"});
  expect_refused({{"llama.rope.freq_base", GGUFValue::f32(-1)}}, {"llama.rope.freq_base", "greater than 0"});
  expect_refused({{"llama.block_count", std::nullopt}}, {"llama.block_count is missing"});
}

TEST(GGUFMetadata, SizesThatDoNotFitTogetherAreRefused) {
  expect_refused({{"llama.attention.head_count_kv", GGUFValue::u32(3)}},
                 {"llama.attention.head_count (8) is not a multiple of llama.attention.head_count_kv (3)"});
  expect_refused({{"llama.embedding_length", GGUFValue::u32(60)}},
                 {"llama.embedding_length (60) is not divisible by llama.attention.head_count (8)"}, Shape{512, 60});
  expect_refused({{"llama.attention.key_length", GGUFValue::u32(1)}}, {"key_length", "is 1", "even"});
  expect_refused({{"llama.attention.key_length", GGUFValue::u32(7)}}, {"key_length", "is 7", "even"});
  // The embedding must be [vocabulary, embedding_length], with at least one row.
  expect_refused({}, {"token_embd.weight has shape [512, 32]"}, Shape{512, 32});
  expect_refused({}, {"token_embd.weight has shape [0, 64]"}, Shape{0, 64});
  expect_refused({}, {"token_embd.weight has shape [32768]"}, Shape{32768});
}

// An empty rope_freqs.weight with a key length of 1 reached max_element of an empty vector.
TEST(GGUFMetadata, EmptyRopeFreqsWithATinyKeyLengthIsRefused) {
  const GGUFTensorSpec empty = gguf_tensor_from("rope_freqs.weight", Tensor::zeros(Shape{0}), GGMLType::F32);
  expect_refused({{"llama.attention.key_length", GGUFValue::u32(1)}}, {"llama.attention.key_length", "is 1"},
                 Shape{512, 64}, {empty});
  expect_refused({}, {"rope_freqs.weight has 0 values for head_dim 8 (needs 4"}, Shape{512, 64}, {empty});
}

// Metadata of the wrong type ended in a JSON conversion error (RUNTIME_INTERNAL, "this is a bug");
// every typed read now names the key, the type expected and the GGUF type stored.
TEST(GGUFMetadata, ValuesOfTheWrongTypeAreRefusedNamingKeyAndTypes) {
  struct Case {
    std::string key;
    GGUFValue value;
    std::string expected, stored;
  };
  const std::vector<Case> cases = {
      {"llama.block_count", GGUFValue::str("5"), "an integer", "string"},
      {"llama.embedding_length", GGUFValue::f32(64), "an integer", "float32"},
      {"llama.attention.head_count", GGUFValue::i32s({8, 8, 8, 8, 8}), "an integer", "array of int32"},
      {"llama.attention.layer_norm_rms_epsilon", GGUFValue::str("1e-5"), "a number", "string"},
      {"llama.rope.freq_base", GGUFValue::boolean(true), "a number", "bool"},
      {"general.architecture", GGUFValue::u32(1), "a string", "uint32"},
      {"tokenizer.ggml.model", GGUFValue::strings({"llama"}), "a string", "array of string"},
      {"tokenizer.ggml.tokens", GGUFValue::i32s({1, 2, 3}), "an array of strings", "array of int32"},
      {"tokenizer.ggml.tokens", GGUFValue::str("<unk>"), "an array of strings", "string"},
      {"tokenizer.ggml.scores", GGUFValue::strings({"0.5"}), "an array of numbers", "array of string"},
      {"tokenizer.ggml.token_type", GGUFValue::f32s({1.0f}), "an array of integers", "array of float32"},
      {"tokenizer.ggml.merges", GGUFValue::i32s({1, 2}), "an array of strings", "array of int32"},
      {"tokenizer.ggml.bos_token_id", GGUFValue::str("<s>"), "an integer", "string"},
      {"tokenizer.ggml.eos_token_id", GGUFValue::f64(2.0), "an integer", "float64"},
      {"tokenizer.ggml.add_bos_token", GGUFValue::u8(1), "a bool", "uint8"},
      {"tokenizer.chat_template", GGUFValue::i32s({1}), "a string", "array of int32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    expect_refused({{c.key, c.value}},
                   {"'" + c.key + "' must be " + c.expected + ", but its GGUF type is " + c.stored});
  }
}

TEST(GGUFMetadata, BadTokensAndTokenIdsAreRefusedNamingTheKey) {
  std::vector<std::string> tokens;
  for (const auto& [k, v] : base_metadata())
    if (k == "tokenizer.ggml.tokens") tokens = v.value.get<std::vector<std::string>>();
  ASSERT_EQ(tokens.size(), 512u);
  std::vector<std::string> broken = tokens;
  broken[300] = "ab\xff\xfe";  // no UTF-8: the tokenizer.json written from it failed to serialize
  expect_refused({{"tokenizer.ggml.tokens", GGUFValue::strings(broken)}},
                 {"'tokenizer.ggml.tokens' element 300 is not valid UTF-8"});
  broken[300] = "\xed\xa0\x80";  // a UTF-16 surrogate
  expect_refused({{"tokenizer.ggml.tokens", GGUFValue::strings(broken)}}, {"element 300 is not valid UTF-8"});
  expect_refused({{"tokenizer.chat_template", GGUFValue::str("{{ bos_token }}\xc3")}},
                 {"'tokenizer.chat_template' is not valid UTF-8"});
  expect_refused({{"tokenizer.ggml.tokens", GGUFValue::strings({})}}, {"no tokenizer.ggml.tokens"});
  for (const char* key :
       {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id"}) {
    SCOPED_TRACE(key);
    expect_refused({{key, GGUFValue::u32(512)}}, {key, "is 512, but the vocabulary has 512 tokens"});
    expect_refused({{key, GGUFValue::i32(-1)}}, {key, "is -1"});
    expect_refused({{key, GGUFValue::u64(uint64_t{1} << 63)}}, {key, "past the largest 64-bit signed integer"});
  }
  expect_refused({{"tokenizer.ggml.scores", GGUFValue::f32s({0.5f, 1.0f})}},
                 {"'tokenizer.ggml.scores' has 2 values for 512 tokens"});
  expect_refused({{"tokenizer.ggml.scores", GGUFValue::array(GGUFValueType::FLOAT64, std::vector<double>(512, 1e300))}},
                 {"'tokenizer.ggml.scores' element 0 is 1e+300, past a float's range"});
  expect_refused({{"tokenizer.ggml.token_type", GGUFValue::i32s(std::vector<int32_t>(512, 9))}},
                 {"'tokenizer.ggml.token_type' element 0 is 9"});
  expect_refused({{"tokenizer.ggml.scores", GGUFValue::f32s(std::vector<float>(512, NAN))}},
                 {"'tokenizer.ggml.scores' element 0 is nan; it must be a finite number"});
}

// A .gguf file with another magic number was taken for a folder ("x.gguf/tokenizer.json: cannot
// open file"); so was any other regular file. A JSON file (estimate-vram's config.json) still passes.
// Sliding windows through GGUF: export writes llama.cpp's {arch}.attention.sliding_window (and,
// when only some layers have it, {arch}.attention.sliding_window_pattern, one bool per layer);
// import reads them back into the same per-layer windows (a llama file with a window is Mistral).
TEST(GGUFMetadata, SlidingWindowRoundTrips) {
  ModelWeights mw = load_model(stories());
  mw.config.arch = Arch::Mistral;
  mw.config.architecture_name = "MistralForCausalLM";
  mw.config.model_type = "mistral";
  mw.config.sliding_window = 16;
  const int64_t L = mw.config.num_layers;
  ASSERT_GE(L, 2);
  std::vector<int64_t> mixed(static_cast<size_t>(L), 16);
  mixed[0] = 0;
  for (const std::vector<int64_t>& windows : {std::vector<int64_t>{}, mixed}) {
    mw.config.layer_windows = windows;
    test::TempDir d;
    const std::string path = d.path + "/window.gguf";
    export_gguf(mw, stories(), GGUFQuant::F32, path);
    const GGUFReader r(path);
    EXPECT_EQ(r.get_int("llama.attention.sliding_window"), 16);
    EXPECT_EQ(r.find("llama.attention.sliding_window_pattern") != nullptr, !windows.empty());
    const ModelConfig c = load_model_config(folder(path, d));
    EXPECT_EQ(c.arch, Arch::Mistral);
    for (int64_t l = 0; l < L; ++l) EXPECT_EQ(c.attention_window(l), l == 0 && !windows.empty() ? 0 : 16) << l;
  }
  // Without a window neither key is written.
  test::TempDir d;
  export_gguf(load_model(stories()), stories(), GGUFQuant::F32, d.path + "/plain.gguf");
  EXPECT_EQ(GGUFReader(d.path + "/plain.gguf").find("llama.attention.sliding_window"), nullptr);
  // A pattern that does not list every layer is refused naming the key.
  expect_refused({{"llama.attention.sliding_window", GGUFValue::u32(8)},
                  {"llama.attention.sliding_window_pattern", GGUFValue::array(GGUFValueType::BOOL, {true})}},
                 {"llama.attention.sliding_window_pattern", "bools"});
}

TEST(GGUFMetadata, AFileThatIsNoGGUFFileIsReportedAsSuch) {
  test::TempDir d;
  hub::HubOptions o;
  o.derived_dir = d.path + "/derived";
  o.offline = true;
  const std::string bad = d.path + "/model.gguf", bin = d.path + "/model.bin", empty = d.path + "/empty.gguf";
  write_file_atomic(bad, "GGML\x03\0\0\0 not a gguf file");
  write_file_atomic(bin, "PK\x03\x04 a zip file");
  write_file_atomic(empty, "");
  test::expect_error([&] { hub::resolve_model_source(bad, o); }, ErrorCode::DEP_MODEL_LOAD_FAILED,
                     {bad, "not a GGUF file (magic 47 47 4d 4c"});
  test::expect_error([&] { hub::resolve_model_source(bin, o); }, ErrorCode::DEP_MODEL_LOAD_FAILED,
                     {bin, "not a GGUF file (magic 50 4b 03 04"});
  test::expect_error([&] { hub::resolve_model_source(empty, o); }, ErrorCode::DEP_MODEL_LOAD_FAILED,
                     {"not a GGUF file (magic missing: the file is empty"});
  const std::string config = stories() + "/config.json";
  EXPECT_EQ(hub::resolve_model_source(config, o).path, config);
  // A JSON file named .gguf is still no GGUF file.
  const std::string json_named_gguf = d.path + "/config.gguf";
  write_file_atomic(json_named_gguf, "{\"model_type\": \"llama\"}");
  test::expect_error([&] { hub::resolve_model_source(json_named_gguf, o); }, ErrorCode::DEP_MODEL_LOAD_FAILED,
                     {"not a GGUF file (magic 7b 22 6d 6f"});
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// Mixture-of-Experts GGUF files are read (tests/export/gguf_moe_test.cpp); expert metadata that is
// incomplete is refused naming the key, never loaded as a dense model without experts.
TEST(GGUFMetadata, IncompleteExpertMetadataIsRefusedNamingTheKey) {
  expect_refused({{"llama.expert_count", GGUFValue::u32(8)}},
                 {"metadata llama.expert_used_count is missing", "llama.expert_count = 8"});
  expect_refused({{"llama.expert_count", GGUFValue::u32(8)}, {"llama.expert_used_count", GGUFValue::u32(9)}},
                 {"llama.expert_used_count is 9", "[1, llama.expert_count = 8]"});
}

}  // namespace
}  // namespace bp
