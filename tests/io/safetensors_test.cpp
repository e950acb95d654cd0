// safetensors: bit-exact round trips, the real stories260K file, sharding, and every kind of
// damaged file failing with DEP_MODEL_LOAD_FAILED naming the file and the tensor.
#include "io/safetensors.h"

#include <filesystem>
#include <fstream>

#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

std::string raw_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return s + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs f, expects DEP_MODEL_LOAD_FAILED, returns the message.
template <class F>
std::string load_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED";
  return "";
}

bool bits_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

NamedTensors sample_tensors() {
  return {{"a.weight", test::random_tensor({33, 7}, 1)},
          {"b.bias", test::random_tensor({31}, 2).to(DType::BF16)},
          {"c", test::random_tensor({2, 3, 5}, 3).to(DType::F16)},
          {"d.ids", Tensor::from_vector(std::vector<int32_t>{1, -2, 3}, {3})},
          {"e.scalarish", test::random_tensor({1}, 4)},
          {"f.empty", Tensor::zeros({0, 4})}};
}

}  // namespace

TEST(Safetensors, WriteReadRoundTripIsBitExact) {
  test::TempDir dir;
  const std::string path = dir.path + "/x.safetensors";
  NamedTensors ts = sample_tensors();
  write_safetensors(path, ts);
  EXPECT_FALSE(fs::exists(path + ".tmp"));  // io/atomic_file's temporary is gone
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename(), "x.safetensors") << "stray file " << e.path();
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);  // data section aligned
  SafetensorsReader r = SafetensorsReader::open_file(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.names().size(), ts.size());
  for (const auto& [name, t] : ts) {
    EXPECT_TRUE(bits_equal(r.read(name, t.shape(), t.dtype()), t)) << name;
    EXPECT_TRUE(bits_equal(r.borrow(name), t)) << name;
  }
  EXPECT_EQ(r.entry("b.bias").dtype_str, "BF16");
  // f32 reads of half types convert exactly (every bf16/f16 value is an f32).
  EXPECT_EQ(r.read("b.bias").to_vector(), ts[1].second.to_vector());
  EXPECT_EQ(r.read("c").to_vector(), ts[2].second.to_vector());
}

TEST(Safetensors, WriteConvertsDtype) {
  test::TempDir dir;
  const std::string path = dir.path + "/x.safetensors";
  Tensor t = test::random_tensor({300000}, 9);  // more than one conversion chunk
  SafetensorsWriteOptions o;
  o.dtype = DType::BF16;
  write_safetensors(path, {{"w", t}, {"ids", Tensor::from_vector(std::vector<int32_t>{7}, {1})}}, o);
  SafetensorsReader r = SafetensorsReader::open_file(path);
  EXPECT_EQ(r.entry("w").dtype_str, "BF16");
  EXPECT_EQ(r.entry("ids").dtype_str, "I32");  // integers are never converted
  EXPECT_TRUE(bits_equal(r.read("w", std::nullopt, DType::BF16), t.to(DType::BF16)));
}

TEST(Safetensors, ReadsStories260K) {
  const std::string path = test::shared_dir() + "/models/stories260K/model.safetensors";
  SafetensorsReader r = SafetensorsReader::open_file(path);
  EXPECT_EQ(r.names().size(), 47u);  // README: 47 F32 tensors
  const SafetensorsEntry& e = r.entry("model.embed_tokens.weight");
  EXPECT_EQ(e.dtype_str, "F32");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{512, 64}));
  Tensor emb = r.read("model.embed_tokens.weight", Shape{512, 64});
  // Compare with the bytes of the file itself at the header's offsets.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  float expect[3];
  std::memcpy(expect, bytes.data() + 8 + n + e.begin + 4 * 1000, sizeof(expect));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(emb.data<float>()[1000 + i], expect[i]);
}

TEST(Safetensors, UnalignedDataSectionReadsCorrectly) {
  test::TempDir dir;
  const std::string path = dir.path + "/u.safetensors";
  const std::vector<float> v = {1.5f, -2.25f, 3.0f};
  std::string data(reinterpret_cast<const char*>(v.data()), 12);
  write_bytes(path, raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", data));  // 8+55: odd
  SafetensorsReader r = SafetensorsReader::open_file(path);
  EXPECT_EQ(r.read("w").to_vector(), v);
  EXPECT_EQ(r.borrow("w").to_vector(), v);
}

TEST(Safetensors, DamagedFilesNameFileAndTensor) {
  test::TempDir dir;
  const std::string path = dir.path + "/bad.safetensors";
  const std::string data(24, '\x01');
  auto check = [&](const std::string& bytes, const std::string& must_contain) {
    write_bytes(path, bytes);
    const std::string msg = load_error([&] { SafetensorsReader::open_file(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(must_contain), std::string::npos) << "'" << must_contain << "' not in: " << msg;
  };
  check("", "too small");
  check("abc", "too small");
  check(raw_file("{}", "").substr(0, 7), "too small");
  check(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header length");
  check(raw_file("{}", "").substr(0, 9), "past the end of the file");  // header cut short
  check(raw_file("not json", ""), "not a valid JSON object");
  check(raw_file("[1,2]", ""), "not a valid JSON object");
  check(raw_file(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data), "'w': unknown dtype 'Q4'");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data), "'w': bad dimension");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", data),
        "'w': data_offsets [0, 80] go past");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data), "'w': shape [3] of F32 needs 12");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data), "'w': data_offsets [8, 0] end");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data), "'w': 'data_offsets'");
  check(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data), "'w': missing or non-string 'dtype'");
  check(raw_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", data),
        "'w': shape overflows");
  check(raw_file(R"({"v":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                 data),
        "overlap");
  check(raw_file(R"({"__metadata__":{"format":1}})", ""), "__metadata__");
}

TEST(Safetensors, TruncatedFileNamesTheTensor) {
  test::TempDir dir;
  const std::string good = dir.path + "/good.safetensors", cut = dir.path + "/cut.safetensors";
  write_safetensors(good, {{"first", test::random_tensor({16}, 1)}, {"second", test::random_tensor({16}, 2)}});
  const std::string bytes = read_bytes(good);
  write_bytes(cut, bytes.substr(0, bytes.size() - 10));
  const std::string msg = load_error([&] { SafetensorsReader::open_file(cut); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  EXPECT_NE(msg.find("'second'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // Every possible truncation point fails cleanly (never a crash or an out-of-range read).
  for (size_t n = 0; n < bytes.size(); n += 7) {
    write_bytes(cut, bytes.substr(0, n));
    EXPECT_THROW(SafetensorsReader::open_file(cut), Error) << n;
  }
}

TEST(Safetensors, MissingTensorAndWrongShape) {
  test::TempDir dir;
  const std::string path = dir.path + "/m.safetensors";
  write_safetensors(
      path, {{"w", test::random_tensor({4, 6}, 1)}, {"ids", Tensor::from_vector(std::vector<int32_t>{1}, {1})}});
  SafetensorsReader r = SafetensorsReader::open_file(path);
  std::string msg = load_error([&] { r.read("model.norm.weight"); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.norm.weight' is missing"), std::string::npos) << msg;
  msg = load_error([&] { r.read("w", Shape{6, 4}); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w' has shape [4, 6] but the model config needs [6, 4]"), std::string::npos) << msg;
  msg = load_error([&] { r.read("ids"); });
  EXPECT_NE(msg.find("cannot read dtype I32 as f32"), std::string::npos) << msg;
  EXPECT_FALSE(r.contains("nope"));
}

TEST(Safetensors, ShardedWriteAndRead) {
  test::TempDir dir;
  NamedTensors ts;
  for (int i = 0; i < 6; ++i) ts.emplace_back(fmt::format("layer.{}.w", i), test::random_tensor({10, 10}, 10 + i));
  // Unsharded first, then sharded into the same folder: the old model.safetensors must go.
  auto files = write_safetensors_model(dir.path, ts);
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  files = write_safetensors_model(dir.path, ts, 850);  // 400 bytes per tensor -> 2 per shard
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(files[3], "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(dir.path + "/model.safetensors"));
  nlohmann::json index = nlohmann::json::parse(read_bytes(dir.path + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 2400);
  EXPECT_EQ(index["weight_map"]["layer.5.w"], "model-00003-of-00003.safetensors");
  SafetensorsReader r = SafetensorsReader::open_model(dir.path);
  for (const auto& [name, t] : ts) EXPECT_TRUE(bits_equal(r.read(name), t)) << name;
  EXPECT_NE(r.file_of("layer.2.w").find("model-00002-of-00003"), std::string::npos);

  // A shard listed in the index but gone, and a tensor the index promises but its shard lacks.
  nlohmann::json broken = index;
  broken["weight_map"]["extra.w"] = "model-00002-of-00003.safetensors";
  write_bytes(dir.path + "/model.safetensors.index.json", broken.dump());
  std::string msg = load_error([&] { SafetensorsReader::open_model(dir.path); });
  EXPECT_NE(msg.find("model-00002-of-00003.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'extra.w'"), std::string::npos) << msg;
  broken = index;
  broken["weight_map"]["layer.0.w"] = "model-00009-of-00009.safetensors";
  write_bytes(dir.path + "/model.safetensors.index.json", broken.dump());
  msg = load_error([&] { SafetensorsReader::open_model(dir.path); });
  EXPECT_NE(msg.find("model-00009-of-00009.safetensors does not exist"), std::string::npos) << msg;
  broken["weight_map"]["layer.0.w"] = "../escape.safetensors";
  write_bytes(dir.path + "/model.safetensors.index.json", broken.dump());
  EXPECT_THROW(SafetensorsReader::open_model(dir.path), Error);

  // Back to one file: the shards and the index are removed.
  write_safetensors_model(dir.path, ts);
  EXPECT_FALSE(fs::exists(dir.path + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir.path + "/model-00001-of-00003.safetensors"));
  EXPECT_TRUE(bits_equal(SafetensorsReader::open_model(dir.path).read("layer.3.w"), ts[3].second));
}

TEST(Safetensors, NoWeightsInFolder) {
  test::TempDir dir;
  const std::string msg = load_error([&] { SafetensorsReader::open_model(dir.path); });
  EXPECT_NE(msg.find("no model.safetensors"), std::string::npos) << msg;
}

TEST(Safetensors, WriteFailureIsAnExportError) {
  try {
    write_safetensors("/nonexistent-dir/x.safetensors", sample_tensors());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_EXPORT_FAILED);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.safetensors"), std::string::npos);
  }
}

}  // namespace bp
