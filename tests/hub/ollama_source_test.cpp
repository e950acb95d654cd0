// Ollama's store read as a hostile one (issue 37), from files generated here: names that are
// paths, blobs whose bytes differ from their sha256 digest, and manifests with fields of the wrong
// JSON type. Each ends in its catalog code (never RUNTIME_INTERNAL), nothing outside the store read.
#include "hub/ollama_source.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/sha256.h"
#include "support/fake_ollama.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

ErrorCode find_error(const std::string& ref, const std::string& store, std::string* msg = nullptr,
                     const std::string& verified = "") {
  try {
    hub::find_ollama_model(ref, store, verified);
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  ADD_FAILURE() << ref << " was read without an error";
  return ErrorCode::RUNTIME_INTERNAL;
}

void write_manifest(const fs::path& path, const json& manifest) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << manifest.dump();
}

TEST(OllamaHostile, NamesThatArePathsAreRefused) {
  test::FakeOllamaStore store;
  store.add_model("library/tiny", "latest", "GGUF model bytes");
  // A manifest outside the store, naming the store's real blobs: reading it must not be possible.
  test::TempDir outside;
  const json good = json::parse(slurp(store.root.path + "/manifests/registry.ollama.ai/library/tiny/latest"));
  write_manifest(fs::path(outside.path) / "m" / "latest", good);
  std::string msg;
  for (const std::string& ref :
       {"ollama:" + outside.path + "/m", "ollama:" + outside.path + "/m:latest",
        "ollama:../../../../" + outside.path + "/m", std::string("ollama:library/../../x"),
        std::string("ollama:a/b/c/d"), std::string("ollama:tiny:../x"), std::string("ollama:tiny:a/b"),
        std::string("ollama:"), std::string("ollama:.hidden"), std::string("ollama:ti\x1bny")}) {
    EXPECT_EQ(find_error(ref, store.root.path, &msg), ErrorCode::INPUT_VALIDATION_FAILED) << ref;
    EXPECT_NE(msg.find("not a model name"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  }
  // The name forms Ollama has: model, namespace/model, host/namespace/model.
  EXPECT_EQ(hub::find_ollama_model("ollama:tiny", store.root.path).tag, "latest");
  store.add_model("someone/tiny", "v2", "other bytes");
  EXPECT_EQ(hub::find_ollama_model("ollama:someone/tiny:v2", store.root.path).tag, "v2");
  write_manifest(fs::path(store.root.path) / "manifests" / "example.com" / "ns" / "tiny" / "q4", good);
  EXPECT_EQ(hub::find_ollama_model("ollama:example.com/ns/tiny:q4", store.root.path).name, "example.com/ns/tiny");
}

TEST(OllamaHostile, BlobsMustMatchTheirDigests) {
  test::FakeOllamaStore store;
  store.add_model("library/tiny", "latest", "GGUF model bytes", "{{ .Prompt }}", "Be brief.");
  test::TempDir verified;
  const hub::OllamaModel m = hub::find_ollama_model("ollama:tiny", store.root.path, verified.path);
  EXPECT_EQ(m.system_prompt, "Be brief.");
  const fs::path blob = m.gguf_path;
  EXPECT_TRUE(fs::exists(fs::path(verified.path) / blob.filename()));  // remembered as verified
  // Same size, other bytes, a later mtime: hashed again and refused (with or without the memory).
  std::ofstream(blob, std::ios::binary | std::ios::trunc) << "GGUF MODEL BYTES";
  fs::last_write_time(blob, fs::last_write_time(blob) + std::chrono::seconds(10));
  std::string msg;
  for (const std::string& v : {verified.path, std::string()}) {
    EXPECT_EQ(find_error("ollama:tiny", store.root.path, &msg, v), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(msg.find("sha256 " + sha256_hex("GGUF MODEL BYTES")), std::string::npos) << msg;
    EXPECT_NE(msg.find(blob.string()), std::string::npos) << msg;
  }
  // A template blob changed the same way.
  std::ofstream(blob, std::ios::binary | std::ios::trunc) << "GGUF model bytes";
  EXPECT_EQ(hub::find_ollama_model("ollama:tiny", store.root.path).gguf_path, blob.string());
  const fs::path tmpl = fs::path(store.root.path) / "blobs" / ("sha256-" + sha256_hex("{{ .Prompt }}"));
  std::ofstream(tmpl, std::ios::binary | std::ios::trunc) << "{{ .Evil!! }}";
  EXPECT_EQ(find_error("ollama:tiny", store.root.path, &msg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("template"), std::string::npos) << msg;
}

TEST(OllamaHostile, ManifestFieldsOfTheWrongTypeAreModelErrors) {
  test::FakeOllamaStore store;
  const std::string digest = store.add_blob("GGUF model bytes");
  const json model_layer = {{"mediaType", "application/vnd.ollama.image.model"}, {"digest", digest}, {"size", 16}};
  const fs::path path = fs::path(store.root.path) / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest";
  write_manifest(path, {{"schemaVersion", 2}, {"layers", {model_layer}}});
  EXPECT_EQ(hub::find_ollama_model("ollama:tiny", store.root.path).gguf_path,
            store.root.path + "/blobs/sha256-" + sha256_hex("GGUF model bytes"));
  auto with = [&](const char* key, const json& value) {
    json l = model_layer;
    l[key] = value;
    return json{{"layers", {l}}};
  };
  const std::vector<json> bad = {
      {{"layers", json::object()}},
      {{"layers", "x"}},
      json::array(),
      {{"layers", {1}}},
      with("mediaType", 7),
      with("digest", 12),
      with("digest", "sha256:../../etc/passwd"),
      with("digest", "md5:" + std::string(64, 'a')),
      with("size", "16"),
      with("size", -1),
      with("size", 1.5),
      with("size", 17),  // the blob has 16 bytes
  };
  std::string msg;
  for (const json& manifest : bad) {
    write_manifest(path, manifest);
    EXPECT_EQ(find_error("ollama:tiny", store.root.path, &msg), ErrorCode::DEP_MODEL_LOAD_FAILED) << manifest.dump();
    EXPECT_NE(msg.find("[ollama]"), std::string::npos) << msg;
  }
  std::ofstream(path, std::ios::trunc) << "{\"layers\": [";
  EXPECT_EQ(find_error("ollama:tiny", store.root.path, &msg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("not JSON"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bp
