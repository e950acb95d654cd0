// Deterministic fuzzing of the safetensors header parser: thousands of mutations of a valid file
// go through the libFuzzer target (tests/fuzz/safetensors_header_fuzz.cpp, included here so CI
// runs it without libFuzzer) and a sample through the mmap'd reader. Nothing may crash; every
// rejection is DEP_MODEL_LOAD_FAILED.
#include <filesystem>
#include <fstream>
#include <random>

#include "fuzz/safetensors_header_fuzz.cpp"  // NOLINT: the fuzz target itself
#include "io/safetensors.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string valid_file(const std::string& dir) {
  const std::string path = dir + "/seed.safetensors";
  write_safetensors(path, {{"model.embed_tokens.weight", test::random_tensor({6, 4}, 1)},
                           {"model.norm.weight", test::random_tensor({4}, 2).to(DType::BF16)},
                           {"lm_head.weight", test::random_tensor({3, 4}, 3).to(DType::F16)},
                           {"ids", Tensor::from_vector(std::vector<int32_t>{1, 2}, {2})}});
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// One random edit of the kinds that break parsers: byte flips, JSON punctuation, long digit
// runs, deletions, duplications, truncation, and lies in the 8-byte length prefix.
void mutate(std::string& s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  static const std::string interesting = "{}[],:\"-0123456789eE.\\ \x00\xff";
  switch (rng() % 9) {
    case 0:
      if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:
      if (!s.empty()) s[pick(s.size())] = interesting[pick(interesting.size())];
      break;
    case 2: s.insert(pick(s.size() + 1), std::string(1 + pick(25), static_cast<char>('0' + pick(10)))); break;
    case 3: {
      const size_t at = pick(s.size() + 1);
      s.erase(at, pick(16));
      break;
    }
    case 4: {
      const size_t at = pick(s.size() + 1), n = pick(32);
      s.insert(pick(s.size() + 1), s.substr(at, n));
      break;
    }
    case 5: s.resize(pick(s.size() + 1)); break;
    case 6:
      if (s.size() >= 8) {  // the header length prefix: small lies and wild values
        uint64_t n = 0;
        std::memcpy(&n, s.data(), 8);
        n = (rng() % 2) ? n + static_cast<uint64_t>(static_cast<int64_t>(pick(17)) - 8) : rng() >> pick(64);
        std::memcpy(s.data(), &n, 8);
      }
      break;
    case 7: {  // replace a number in the JSON by an extreme one
      const size_t at = s.find_first_of("0123456789", 8 + pick(s.size() > 8 ? s.size() - 8 : 1));
      if (at != std::string::npos) {
        static const char* big[] = {"18446744073709551615", "-1", "9223372036854775807", "1e300", "4294967296"};
        s.replace(at, 1, big[pick(5)]);
      }
      break;
    }
    default: s.insert(pick(s.size() + 1), 1, static_cast<char>(rng())); break;
  }
}

}  // namespace

TEST(SafetensorsFuzz, MutatedHeadersNeverCrash) {
  test::TempDir dir;
  const std::string seed = valid_file(dir.path);
  ASSERT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(seed.data()), seed.size()), 0);
  std::mt19937_64 rng(20261121);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s = seed;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) mutate(s, rng);
    // An exact-size heap copy, so a sanitizer build catches any read past the end.
    std::vector<uint8_t> buf(s.begin(), s.end());
    try {
      parse_safetensors_header(buf.data(), buf.size(), "mutant");
      ++accepted;
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
      ++rejected;
    }
    ASSERT_EQ(LLVMFuzzerTestOneInput(buf.data(), buf.size()), 0);
    // Every 20th mutant also goes through the mmap'd reader and a read of each tensor.
    if (iter % 20 == 0) {
      const std::string path = dir.path + "/m.safetensors";
      std::ofstream(path, std::ios::binary).write(s.data(), static_cast<std::streamsize>(s.size()));
      try {
        SafetensorsReader r = SafetensorsReader::open_file(path);
        for (const std::string& n : r.names())
          if (r.entry(n).dtype && *r.entry(n).dtype != DType::I32 && r.entry(n).shape.size() <= 4) r.read(n);
      } catch (const Error& e) {
        ASSERT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
      }
    }
  }
  // Both outcomes must occur, or the mutations are not exercising the parser.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(rejected, 1000);
}

}  // namespace bp
