// Hub tests against a hostile or broken hub (issue 37), with the fake hub of fake_hub.h: a
// revision that would name a path outside the cache, file names that lead out of the snapshot
// (the listing, an index's weight_map), unparsable headers, escape sequences in the hub's text,
// and a disk that fills up. Each ends in its catalog code with nothing written outside the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "hub/hf_answers.h"
#include "hub/hf_download.h"
#include "hub/hf_names.h"
#include "hub/hub_fixture.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

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

namespace bp {
namespace {

TEST_F(HubFixture, UnparsableSizeAndEtagHeadersNameTheHeader) {
  struct Case {
    std::string file, header, value, expect;
  };
  const std::vector<Case> cases = {
      {"model.safetensors", "X-Linked-Size", "abc", "X-Linked-Size 'abc' for model.safetensors: not a byte count"},
      {"model.safetensors", "X-Linked-Size", "-1", "X-Linked-Size '-1'"},
      {"model.safetensors", "X-Linked-Size", "99999999999999999999999", "not a byte count"},
      {"model.safetensors", "X-Linked-Size", "12 34", "not a byte count"},
      {"config.json", "ETag", "\"..\"", "ETag '..' for config.json: not a blob name"},
      {"config.json", "ETag", "\".\"", "ETag '.'"},
      {"config.json", "ETag", "\"a b\"", "not a blob name"},
      {"model.safetensors", "X-Linked-Etag", "\"../../../x\"", "X-Linked-Etag '../../../x'"},
  };
  std::string msg;
  for (const Case& k : cases) {
    fs::remove_all(repo_dir());  // each case from an empty cache, so the file is looked up again
    hub.header_overrides = {{k.file, {{k.header, k.value}}}};
    EXPECT_EQ(resolve_error("org/tiny", &msg), ErrorCode::DEP_MODEL_DOWNLOAD_FAILED) << k.value;
    EXPECT_NE(msg.find(k.expect), std::string::npos) << msg;
    // Nothing was made of those names: only good blobs (the files before the refused one) exist.
    if (fs::exists(repo_dir() / "blobs")) {
      for (const auto& e : fs::directory_iterator(repo_dir() / "blobs"))
        EXPECT_TRUE(hub::is_safe_blob_name(e.path().filename().string())) << e.path();
    }
    EXPECT_FALSE(fs::exists(fs::path(cache.path) / "x"));
    EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
  }
  hub.header_overrides.clear();
  EXPECT_EQ(hub::resolve_model_source("org/tiny", opts).commit, kSha);
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

TEST_F(HubFixture, TheHubsTextReachesMessagesEscapedAndCut) {
  hub.gated.push_back("meta/llama");
  hub.error_message =
      "\x1b]0;pwned\x07\x1b[2J\x1b[31mAccess denied\x7f" + std::string(5000, 'A');  // no CR LF: httplib drops those
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("meta/llama", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  for (const char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << static_cast<int>(c) << " in " << msg;
  EXPECT_NE(msg.find("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mAccess denied\\x7f"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 1000u) << msg;
  EXPECT_NE(msg.find("..."), std::string::npos) << msg;
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

TEST_F(HubFixture, TooLittleFreeSpaceIsADiskFullErrorBeforeTheDownload) {
  const uint64_t weights = test::tiny_files()["model.safetensors"].size();
  std::vector<std::string> asked;
  hub::hub_free_disk_bytes_for_tests() = [&](const std::string& dir) {
    asked.push_back(dir);
    return weights - 1;  // room for every small file, one byte short for the weights
  };
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("org/tiny", &msg, &sugg), ErrorCode::STATE_DISK_FULL);
  hub::hub_free_disk_bytes_for_tests() = nullptr;
  EXPECT_NE(msg.find(fmt::format("needs {} bytes", weights)), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("{} bytes are free", weights - 1)), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(sugg.find("HF_HUB_CACHE"), std::string::npos) << sugg;
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(fs::path(asked.back()), repo_dir() / "blobs");
  EXPECT_EQ(hub.count_requests("/cdn/"), 0u);  // refused before a byte was asked for
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
}

// Writes fail with ENOSPC after `bytes` (io_faults(), the disk-full hook of every writer); undone on exit.
struct ScopedEnospc {
  explicit ScopedEnospc(int64_t bytes) { io_faults().enospc_after_bytes = bytes; }
  ~ScopedEnospc() { io_faults().enospc_after_bytes = -1; }
};

TEST_F(HubFixture, ADiskThatFillsUpMidDownloadIsADiskFullErrorAndResumes) {
  const auto files = test::tiny_files();
  const std::string& weights = files.at("model.safetensors");
  int64_t small = 0;
  for (const auto& [name, bytes] : files)
    if (name != "model.safetensors") small += static_cast<int64_t>(bytes.size());
  const int64_t written = static_cast<int64_t>(weights.size() / 2);
  std::string msg, sugg;
  {
    ScopedEnospc full(small + written);
    EXPECT_EQ(resolve_error("org/tiny", &msg, &sugg), ErrorCode::STATE_DISK_FULL);
  }
  EXPECT_NE(msg.find("disk"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("connection"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("{} of {} bytes", written, weights.size())), std::string::npos) << msg;
  EXPECT_NE(sugg.find("resumes"), std::string::npos) << sugg;
  const fs::path part = repo_dir() / "blobs" / (sha256_hex(weights) + ".incomplete");
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(fs::file_size(part), static_cast<uint64_t>(written));
  // With room again, the next run asks only for the rest.
  hub.clear_requests();
  hub::ModelSource s = hub::resolve_model_source("org/tiny", opts);
  EXPECT_EQ(test::read_bytes(fs::path(s.path) / "model.safetensors"), weights);
  for (const auto& r : hub.requests()) {
    if (r.path.rfind("/cdn/", 0) == 0) {
      EXPECT_EQ(r.range, fmt::format("bytes={}-", written));
    }
  }
}

}  // namespace
}  // namespace bp
