// The fixture of the hub download tests: the fake hub (fake_hub.h) serving stories260K's real
// files as org/tiny at commit kSha, a temporary cache, and resolve_error() to catch the code.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "hub/fake_hub.h"
#include "hub/model_source.h"
#include "support/test_util.h"

namespace bp::test {

inline const std::string kSha = "0123456789abcdef0123456789abcdef01234567";

// stories260K's real files, served as repository org/tiny.
inline std::map<std::string, std::string> tiny_files() {
  const std::filesystem::path d = std::filesystem::path(shared_dir()) / "models" / "stories260K";
  std::map<std::string, std::string> files;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    files[f] = read_bytes(d / f);
  return files;
}

struct HubFixture : ::testing::Test {
  FakeHub hub;
  TempDir cache;
  hub::HubOptions opts;
  void SetUp() override {
    hub.add_repo("org/tiny", kSha, tiny_files());
    opts.endpoint = hub.endpoint();
    opts.cache_dir = cache.path;
    opts.max_attempts = 1;
  }
  std::filesystem::path repo_dir() const { return std::filesystem::path(cache.path) / "models--org--tiny"; }
  ErrorCode resolve_error(const std::string& ref, std::string* message = nullptr, std::string* suggestion = nullptr) {
    try {
      hub::resolve_model_source(ref, opts);
    } catch (const Error& e) {
      if (message) *message = e.what();
      if (suggestion) *suggestion = e.suggestion();
      return e.code();
    }
    ADD_FAILURE() << ref << " resolved without an error";
    return ErrorCode::RUNTIME_INTERNAL;
  }
};

}  // namespace bp::test
