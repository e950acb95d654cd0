// GGUF writer/reader tests: round trip of every metadata and tensor type, the header bytes the spec
// prescribes, agreement with an independent parser (@huggingface/gguf via tests/oracles/gguf_read.mjs),
// all-or-nothing writes under injected I/O failures and a full disk, and rejection of damaged files.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"

namespace bp {

namespace {

namespace fs = std::filesystem;

struct Sample {
  std::string name;
  std::vector<int64_t> shape;
  GGMLType type;
};

const std::vector<Sample>& samples() {
  static const std::vector<Sample> s = {
      {"a.f32", {257}, GGMLType::F32},        {"b.f16", {3, 33}, GGMLType::F16},
      {"c.bf16", {2, 5}, GGMLType::BF16},     {"d.q8_0", {4, 64}, GGMLType::Q8_0},
      {"e.q4_0", {2, 32}, GGMLType::Q4_0},    {"f.q5_0", {3, 96}, GGMLType::Q5_0},
      {"g.q5_1", {1, 32}, GGMLType::Q5_1},    {"h.q4_K", {3, 512}, GGMLType::Q4_K},
      {"i.q5_K", {2, 256}, GGMLType::Q5_K},   {"j.q6_K", {2, 256}, GGMLType::Q6_K},
      {"k.f32_3d", {2, 3, 4}, GGMLType::F32},
  };
  return s;
}

GGUFWriter sample_writer(std::vector<Tensor>* keep) {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("llama"));
  w.set("test.u8", GGUFValue::u8(200));
  w.set("test.i8", {GGUFValueType::INT8, GGUFValueType::UINT8, -5});
  w.set("test.u16", {GGUFValueType::UINT16, GGUFValueType::UINT8, 60000});
  w.set("test.i16", {GGUFValueType::INT16, GGUFValueType::UINT8, -30000});
  w.set("test.u32", GGUFValue::u32(4000000000u));
  w.set("test.i32", GGUFValue::i32(-123456));
  w.set("test.f32", GGUFValue::f32(1e-5f));
  w.set("test.bool", GGUFValue::boolean(true));
  w.set("test.str", GGUFValue::str("héllo ▁world\n"));
  w.set("test.u64", GGUFValue::u64(1234567890123ull));
  w.set("test.i64", {GGUFValueType::INT64, GGUFValueType::UINT8, -9876543210ll});
  w.set("test.f64", GGUFValue::f64(3.141592653589793));
  w.set("test.strs", GGUFValue::strings({"<s>", "", "▁the", "{{ x }}"}));
  w.set("test.f32s", GGUFValue::f32s({0.0f, -1000.0f, 0.25f}));
  w.set("test.i32s", GGUFValue::i32s({1, -2, 3}));
  w.set("test.empty", GGUFValue::strings({}));
  uint64_t seed = 1;
  for (const auto& s : samples()) {
    Shape shape(s.shape);
    keep->push_back(test::random_tensor(shape, seed++, -2.0f, 2.0f));
    w.add_tensor(gguf_tensor_from(s.name, keep->back(), s.type));
  }
  return w;
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GGUF, RoundTripEveryValueAndTensorType) {
  test::TempDir dir;
  std::vector<Tensor> src;
  const GGUFWriter w = sample_writer(&src);
  const std::string path = dir.path + "/m.gguf";
  w.write(path);
  EXPECT_EQ(fs::file_size(path), w.expected_file_bytes());
  EXPECT_EQ(dir_entries(dir.path), std::vector<std::string>{"m.gguf"});  // no temporary left

  GGUFReader r(path);
  EXPECT_EQ(r.version(), 3u);
  EXPECT_EQ(r.alignment(), 32u);
  EXPECT_EQ(r.data_offset() % 32, 0u);
  ASSERT_EQ(r.metadata().size(), w.metadata().size());
  for (size_t i = 0; i < w.metadata().size(); ++i) {
    EXPECT_EQ(r.metadata()[i].first, w.metadata()[i].first);
    const GGUFValue& a = r.metadata()[i].second;
    GGUFValue b = w.metadata()[i].second;
    if (b.type == GGUFValueType::FLOAT32) b.value = static_cast<double>(static_cast<float>(b.value.get<double>()));
    EXPECT_TRUE(a == b) << r.metadata()[i].first << ": " << a.value.dump() << " vs " << b.value.dump();
  }
  ASSERT_EQ(r.tensors().size(), samples().size());
  for (size_t i = 0; i < samples().size(); ++i) {
    const auto& t = r.tensors()[i];
    const auto& s = samples()[i];
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.shape, s.shape);
    EXPECT_EQ(t.type, s.type);
    EXPECT_EQ(t.offset % 32, 0u);
    // Bytes are exactly the quantizer's output, and dequantize to it.
    const int64_t n = s.shape.back();
    std::vector<uint8_t> expect(ggml_row_bytes(s.type, n) * static_cast<size_t>(src[i].numel() / n));
    quantize_rows(s.type, src[i].data<float>(), expect.data(), src[i].numel() / n, n);
    ASSERT_EQ(t.nbytes, expect.size());
    EXPECT_EQ(std::memcmp(t.data, expect.data(), expect.size()), 0) << s.name;
    std::vector<float> deq(static_cast<size_t>(src[i].numel()));
    dequantize_rows(s.type, expect.data(), deq.data(), src[i].numel() / n, n);
    EXPECT_EQ(r.dequantize(t), deq) << s.name;
  }
  EXPECT_NE(r.find_tensor("h.q4_K"), nullptr);
  EXPECT_EQ(r.find("nope"), nullptr);
}

TEST(GGUF, HeaderBytesFollowTheSpec) {
  test::TempDir dir;
  GGUFWriter w;
  auto t = Tensor::from_vector(std::vector<float>(64, 0.5f), Shape{2, 32});
  w.add_tensor(gguf_tensor_from("t", t, GGMLType::Q8_0));
  const std::string path = dir.path + "/h.gguf";
  w.write(path);
  std::ifstream f(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto u32 = [&](size_t o) {
    return uint32_t(b[o]) | uint32_t(b[o + 1]) << 8 | uint32_t(b[o + 2]) << 16 | uint32_t(b[o + 3]) << 24;
  };
  auto u64 = [&](size_t o) { return uint64_t(u32(o)) | uint64_t(u32(o + 4)) << 32; };
  ASSERT_GE(b.size(), 24u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 4), "GGUF");
  EXPECT_EQ(u32(4), 3u);   // version
  EXPECT_EQ(u64(8), 1u);   // tensor count
  EXPECT_EQ(u64(16), 1u);  // kv count: general.alignment
  EXPECT_EQ(u64(24), 17u);
  EXPECT_EQ(std::string(b.begin() + 32, b.begin() + 49), "general.alignment");
  EXPECT_EQ(u32(49), 4u);   // UINT32
  EXPECT_EQ(u32(53), 32u);  // value
  // tensor info: name "t", 2 dims, ne = {32, 2}, type 8, offset 0
  EXPECT_EQ(u64(57), 1u);
  EXPECT_EQ(b[65], 't');
  EXPECT_EQ(u32(66), 2u);
  EXPECT_EQ(u64(70), 32u);
  EXPECT_EQ(u64(78), 2u);
  EXPECT_EQ(u32(86), 8u);
  EXPECT_EQ(u64(90), 0u);
  // data starts at the next multiple of 32 (98 -> 128): 2 blocks of 34 bytes; d = 0.5/127 rounded up.
  EXPECT_EQ(b.size(), 128u + 68u);
  for (size_t i = 98; i < 128; ++i) EXPECT_EQ(b[i], 0) << "padding byte " << i;
  EXPECT_EQ(static_cast<int8_t>(b[130]), 127);
}

TEST(GGUF, IndependentParserAgrees) {
  test::TempDir dir;
  std::vector<Tensor> src;
  const GGUFWriter w = sample_writer(&src);
  const std::string path = dir.path + "/o.gguf";
  w.write(path);
  const nlohmann::json o = gguf_testing::oracle_read(path);
  GGUFReader r(path);
  EXPECT_EQ(o["version"], 3);
  EXPECT_EQ(o["tensor_count"], r.tensors().size());
  EXPECT_EQ(o["kv_count"], r.metadata().size());
  EXPECT_EQ(o["tensor_data_offset"], r.data_offset());
  gguf_testing::expect_oracle_matches(o, r);
}

TEST(GGUF, InjectedWriteFailureLeavesNothingHalfWritten) {
  test::TempDir dir;
  std::vector<Tensor> src;
  const GGUFWriter w = sample_writer(&src);
  const std::string path = dir.path + "/m.gguf";
  {
    std::ofstream old(path);
    old << "previous export";
  }
  const int64_t total = static_cast<int64_t>(w.expected_file_bytes());
  for (int64_t after : {int64_t{0}, int64_t{10}, int64_t{700}, total / 2, total - 1}) {
    for (int err : {EIO, ENOSPC}) {
      gguf_set_write_fault_for_testing(after, err);
      try {
        w.write(path);
        ADD_FAILURE() << "write survived a fault after " << after << " bytes";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), err == ENOSPC ? ErrorCode::STATE_DISK_FULL : ErrorCode::RUNTIME_GGUF_EXPORT_FAILED)
            << e.what();
      }
      gguf_set_write_fault_for_testing(-1, 0);
      EXPECT_EQ(dir_entries(dir.path), std::vector<std::string>{"m.gguf"}) << "after " << after;
      std::ifstream f(path);
      std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      EXPECT_EQ(content, "previous export");
    }
  }
  w.write(path);  // and without the fault it replaces the old file
  EXPECT_EQ(GGUFReader(path).tensors().size(), samples().size());
}

TEST(GGUF, NotEnoughFreeSpaceFailsBeforeWriting) {
  test::TempDir dir;
  std::vector<Tensor> src;
  const GGUFWriter w = sample_writer(&src);
  const uint64_t need = w.expected_file_bytes();
  gguf_set_free_space_for_testing(static_cast<int64_t>(need) - 1);
  try {
    w.write(dir.path + "/m.gguf");
    ADD_FAILURE() << "expected STATE_DISK_FULL";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::STATE_DISK_FULL);
    EXPECT_EQ(e.details()["bytes_needed"], need);
    EXPECT_EQ(e.details()["bytes_free"], need - 1);
  }
  gguf_set_free_space_for_testing(static_cast<int64_t>(need));
  w.write(dir.path + "/m.gguf");  // exactly enough is enough
  gguf_set_free_space_for_testing(-1);
  EXPECT_TRUE(fs::exists(dir.path + "/m.gguf"));
}

TEST(GGUF, ReaderRejectsDamagedFiles) {
  test::TempDir dir;
  std::vector<Tensor> src;
  const std::string path = dir.path + "/m.gguf";
  sample_writer(&src).write(path);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto expect_rejected = [&](const std::string& content, const char* what) {
    const std::string p = dir.path + "/bad.gguf";
    std::ofstream(p, std::ios::binary) << content;
    try {
      GGUFReader r(p);
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << what;
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos);
    }
  };
  for (size_t cut : {size_t{0}, size_t{3}, size_t{20}, size_t{100}, bytes.size() / 2, bytes.size() - 1})
    expect_rejected(bytes.substr(0, cut), "a truncated file");
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  expect_rejected(bad_magic, "bad magic");
  std::string bad_version = bytes;
  bad_version[4] = 9;
  expect_rejected(bad_version, "version 9");
}

TEST(GGUF, WriterRejectsBadTensors) {
  GGUFWriter w;
  auto t = test::random_tensor(Shape{2, 300}, 1);
  EXPECT_THROW(w.add_tensor(gguf_tensor_from("x", t, GGMLType::Q4_K)), Error);  // 300 % 256 != 0
  w.add_tensor(gguf_tensor_from("x", t, GGMLType::F16));
  EXPECT_THROW(w.add_tensor(gguf_tensor_from("x", t, GGMLType::F32)), Error);  // duplicate name
  EXPECT_THROW(GGUFWriter(30), Error);
}

}  // namespace
}  // namespace bp
