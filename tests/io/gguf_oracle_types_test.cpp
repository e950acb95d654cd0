// Our GGUF reader against two independent readers, for every tensor type a model file may hold
// (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K), on a file made with our writer and quantizers:
//   - @huggingface/gguf (tests/oracles/gguf_read.mjs): every metadata value and tensor-table entry;
//   - tests/oracles/gguf_dequant.py (NumPy, from ggml's block layouts): every value our reader
//     dequantizes. A corrupted block makes both sides differ from the original values (so the
//     comparison is not vacuous): checked by flipping a byte of the q4_K tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/gguf_reader.h"
#include "io/gguf_writer.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

const std::vector<std::pair<std::string, GGMLType>> kTypes = {
    {"t.f32", GGMLType::F32},   {"t.f16", GGMLType::F16},   {"t.bf16", GGMLType::BF16}, {"t.q8_0", GGMLType::Q8_0},
    {"t.q4_0", GGMLType::Q4_0}, {"t.q4_K", GGMLType::Q4_K}, {"t.q5_K", GGMLType::Q5_K}, {"t.q6_K", GGMLType::Q6_K}};

std::vector<float> read_f32(const std::string& path) {
  const std::string b = read_file(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Runs the NumPy decoder on `path` into `out_dir`.
nlohmann::json numpy_decode(const std::string& path, const std::string& out_dir) {
  std::string out;
  const int rc = test::run_command(
      fmt::format("/usr/bin/python3 {}/tests/oracles/gguf_dequant.py {} {} 2>&1", test::source_dir(), path, out_dir),
      &out);
  EXPECT_EQ(rc, 0) << out;
  return nlohmann::json::parse(read_file(out_dir + "/index.json"));
}

TEST(GGUFOracle, EveryTypeWeReadAgreesWithTwoIndependentReaders) {
  test::TempDir d;
  std::vector<Tensor> keep;
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("llama"));
  w.set("llama.rope.freq_base", GGUFValue::f32(500000.0f));
  w.set("tokenizer.ggml.tokens", GGUFValue::strings({"<s>", "▁a", "b"}));
  uint64_t seed = 40;
  for (const auto& [name, type] : kTypes) {
    keep.push_back(test::random_tensor(Shape{3, 512}, ++seed, -3.0f, 2.0f));
    w.add_tensor(gguf_tensor_from(name, keep.back(), type));
  }
  const std::string path = d.path + "/types.gguf";
  w.write(path);
  GGUFReader r(path);
  gguf_testing::expect_oracle_matches(gguf_testing::oracle_read(path), r);

  const nlohmann::json index = numpy_decode(path, d.path + "/np");
  ASSERT_EQ(index.size(), kTypes.size()) << index.dump();
  for (size_t i = 0; i < kTypes.size(); ++i) {
    const auto& [name, type] = kTypes[i];
    EXPECT_EQ(index.at(name), static_cast<uint32_t>(type));
    const std::vector<float> ours = r.dequantize(*r.find_tensor(name));
    const std::vector<float> theirs = read_f32(d.path + "/np/" + name + ".f32");
    EXPECT_TRUE(test::all_close(ours, theirs, {1e-6, 1e-6})) << name;
    // And both are the original values within the type's error (a decoder that reads nothing fails here).
    const double tol = type == GGMLType::F32 ? 0 : type == GGMLType::Q4_0 || type == GGMLType::Q4_K ? 0.5 : 0.15;
    EXPECT_TRUE(test::all_close(theirs, keep[i].to_vector(), {tol, 0})) << name;
  }

  // A flipped byte inside the q4_K data: both decoders see the same changed values.
  const GGUFTensorInfo* q4k = r.find_tensor("t.q4_K");
  const uint64_t at = r.data_offset() + q4k->offset + 100;  // inside qs of the first block
  std::string bytes = read_file(path);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5A);
  const std::string bad = d.path + "/flipped.gguf";
  std::ofstream(bad, std::ios::binary) << bytes;
  GGUFReader rb(bad);
  numpy_decode(bad, d.path + "/np2");
  const std::vector<float> ours = rb.dequantize(*rb.find_tensor("t.q4_K"));
  EXPECT_TRUE(test::all_close(ours, read_f32(d.path + "/np2/t.q4_K.f32"), {1e-6, 1e-6}));
  EXPECT_NE(ours, r.dequantize(*q4k));
}

}  // namespace
}  // namespace bp
