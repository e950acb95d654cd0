// Hub tests against a hostile or broken hub (issue 37), with the fake hub of fake_hub.h: a
// revision that would name a path outside the cache, file names that lead out of the snapshot
// (the listing, an index's weight_map), unparsable headers, escape sequences in the hub's text,
// and a disk that fills up. Each ends in its catalog code with nothing written outside the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "hub/hf_answers.h"
#include "hub/hf_names.h"
#include "hub/hub_fixture.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using test::HubFixture;
using test::kSha;

TEST(HubNames, RevisionsFollowGitRefRules) {
  for (const char* ok :
       {"main", "v1.0", "refs/pr/3", "release-2024_01", "0123456789abcdef0123456789abcdef01234567", "feature/x.y"})
    EXPECT_EQ(hub::revision_problem(ok), "") << ok;
  for (const char* bad :
       {"",  "../../x", "a/../b", "..",  "/abs", "-x",  "a//b", "a/", "a.", "x.lock",    "a/.hidden", "a@{1}",
        "@", "a b",     "a\\b",   "a~1", "a^",   "a:b", "a?",   "a*", "a[", "a\x1b[31m", "a\tb"})
    EXPECT_NE(hub::revision_problem(bad), "") << bad;
  EXPECT_NE(hub::revision_problem(std::string(256, 'a')), "");
  EXPECT_EQ(hub::revision_problem(std::string(255, 'a')), "");
}

TEST_F(HubFixture, ARevisionThatIsAPathIsRefusedBeforeAnyFileIsWritten) {
  hub.any_revision = true;  // a hub that answers every revision: only our check stands in the way
  const fs::path victim = fs::path(cache.path) / "victim";
  std::ofstream(victim) << "precious";
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("org/tiny@../../victim", &msg, &sugg), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_NE(msg.find("'..'"), std::string::npos) << msg;
  EXPECT_NE(sugg.find("40-hex commit"), std::string::npos) << sugg;
  EXPECT_EQ(test::read_bytes(victim), "precious");
  EXPECT_FALSE(fs::exists(repo_dir()));
  EXPECT_TRUE(hub.requests().empty());
  EXPECT_EQ(resolve_error("org/tiny@-rf", &msg), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(resolve_error("org/tiny@a\x1b]0;x\x07", &msg), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;  // the refused name is printed escaped
  // A branch with a '/' is still a branch: refs/pr/3 lands under refs/.
  hub::ModelSource s = hub::resolve_model_source("org/tiny@refs/pr/3", opts);
  EXPECT_EQ(s.commit, kSha);
  EXPECT_EQ(test::read_bytes(repo_dir() / "refs" / "refs" / "pr" / "3"), kSha);
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

TEST(HubNames, RemoteFileNamesStayInsideTheSnapshot) {
  for (const char* ok : {"config.json", "model-00001-of-00002.safetensors", "onnx/model.onnx", "a b/c..d.json"})
    EXPECT_EQ(hub::remote_file_problem(ok), "") << ok;
  for (const char* bad :
       {"", "../x", "a/../../x", "/etc/passwd", "a\\b", "a//b", "a/", "./a", "..", "a/.", "a\x1b[2J", "a\nb"})
    EXPECT_NE(hub::remote_file_problem(bad), "") << bad;
  EXPECT_NE(hub::remote_file_problem(std::string(1, '\0')), "");
  EXPECT_NE(hub::remote_file_problem(std::string(256, 'a')), "");
  EXPECT_NE(hub::remote_file_problem(std::string(600, 'a') + "/" + std::string(600, 'b')), "");
}

// A sharded repository whose index names a shard outside the cache; the cache is <tmp>/hub, so
// "../../../../outside/evil.safetensors" from snapshots/<sha>/ is <tmp>/outside/evil.safetensors.
struct HostileIndexFixture : HubFixture {
  test::TempDir root;
  fs::path victim;
  void SetUp() override {
    HubFixture::SetUp();
    opts.cache_dir = root.path + "/hub";
    victim = fs::path(root.path) / "outside" / "evil.safetensors";
    fs::create_directories(victim.parent_path());
    std::ofstream(victim) << "precious";
  }
  void add_sharded(const std::string& shard_name) {
    auto files = test::tiny_files();
    const std::string weights = files["model.safetensors"];
    files.erase("model.safetensors");
    files["model.safetensors.index.json"] = nlohmann::json{{"metadata", nlohmann::json::object()},
                                                           {"weight_map", {{"model.embed_tokens.weight", shard_name}}}}
                                                .dump();
    files[shard_name] = weights;
    hub.add_repo("org/sharded", kSha, files);
  }
  void expect_nothing_outside() {
    EXPECT_EQ(test::read_bytes(victim), "precious");
    EXPECT_FALSE(fs::is_symlink(victim));
    EXPECT_EQ(std::distance(fs::directory_iterator(victim.parent_path()), fs::directory_iterator()), 1);
    EXPECT_EQ(hub.count_requests("evil"), 0u);
  }
};

TEST_F(HostileIndexFixture, AShardNameLeadingOutOfTheCacheIsRefusedBeforeAnyFileCall) {
  const std::string evil = "../../../../outside/evil.safetensors";
  add_sharded(evil);
  hub.unlisted.push_back(evil);  // listed names are checked too (below): here only the index names it
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("org/sharded", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("'..' component"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(sugg.find("damaged or hostile"), std::string::npos) << sugg;
  expect_nothing_outside();
}

TEST_F(HostileIndexFixture, AListedNameLeadingOutIsRefusedBeforeAnyFileIsFetched) {
  add_sharded("../../../../outside/evil.safetensors");  // listed and named by the index
  std::string msg;
  EXPECT_EQ(resolve_error("org/sharded", &msg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("/api/models/org/sharded"), std::string::npos) << msg;
  expect_nothing_outside();
  EXPECT_EQ(hub.count_requests("/resolve/"), 0u);
  EXPECT_FALSE(fs::exists(fs::path(opts.cache_dir) / "models--org--sharded" / "snapshots"));
  // Absolute names and backslashes in the listing too.
  for (const char* bad : {"/etc/evil.json", "sub\\..\\..\\evil.json", "a\x1b[2Jb.json"}) {
    hub.extra_siblings = {bad};
    EXPECT_EQ(resolve_error("org/tiny", &msg), ErrorCode::DEP_MODEL_LOAD_FAILED) << bad;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  }
}

TEST(HubAnswers, IndexesAndListingsAreCheckedWhereTheyAreParsed) {
  EXPECT_EQ(hub::parse_index_shards(R"({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors",
                                        "c": "m-1.safetensors"}})",
                                    "index.json", "org/x"),
            (std::vector<std::string>{"m-1.safetensors", "m-2.safetensors"}));
  for (const char* bad : {R"({"weight_map": {"a": "../m.safetensors"}})", R"({"weight_map": {"a": 3}})",
                          R"({"weight_map": []})", R"([1])", "not json"}) {
    try {
      hub::parse_index_shards(bad, "index.json", "org/x");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << bad;
    }
  }
  const auto info = hub::parse_model_info(
      R"({"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [{"rfilename": "config.json"}, 5, {}]})", "u",
      "org/x");
  EXPECT_EQ(info.files, (std::set<std::string>{"config.json"}));
  for (const char* bad : {R"({"sha": "../x"})", R"({"sha": 1})", R"([])", "<html>"}) {
    try {
      hub::parse_model_info(bad, "u", "org/x");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_DOWNLOAD_FAILED) << bad;
    }
  }
}

}  // namespace
}  // namespace bp
