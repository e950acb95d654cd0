// Hub tests: `--model org/name[@revision]` resolved from and downloaded into the Hugging Face
// cache, against the fake hub of fake_hub.h (127.0.0.1): the cache layout huggingface_hub writes,
// redirects (CDN and a renamed repository), the token sent to the hub only, gated and missing
// repositories, a connection broken mid-file then resumed with Range, a wrong LFS sha256, offline
// mode, and the HF_* environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "hub/hub_fixture.h"
#include "hub/model_source.h"
#include "model/loader.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

using test::HubFixture;
using test::kSha;
using test::tiny_files;

TEST(HubRef, ParsesNamesAndRevisions) {
  auto r = hub::parse_hub_ref("Qwen/Qwen2.5-0.5B-Instruct@v1.0");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->repo_id, "Qwen/Qwen2.5-0.5B-Instruct");
  EXPECT_EQ(r->revision, "v1.0");
  EXPECT_EQ(hub::parse_hub_ref("org/name")->revision, "main");
  EXPECT_FALSE(hub::parse_hub_ref("./org/name"));
  EXPECT_FALSE(hub::parse_hub_ref("/abs/path"));
  EXPECT_FALSE(hub::parse_hub_ref("a/b/c"));
  EXPECT_FALSE(hub::parse_hub_ref("model.gguf"));
}

TEST_F(HubFixture, DownloadsIntoTheCacheLayoutAndLoads) {
  opts.token = "hf_testtoken123";
  hub::ModelSource s = hub::resolve_model_source("org/tiny", opts);
  EXPECT_TRUE(s.from_hub);
  EXPECT_TRUE(s.downloaded);
  EXPECT_EQ(s.commit, kSha);
  EXPECT_EQ(fs::path(s.path), repo_dir() / "snapshots" / kSha);
  EXPECT_EQ(test::read_bytes(repo_dir() / "refs" / "main"), kSha);
  // Snapshot files are relative links into blobs/<etag>; the LFS blob is named by its sha256.
  const fs::path weights = fs::path(s.path) / "model.safetensors";
  ASSERT_TRUE(fs::is_symlink(weights));
  const std::string digest = sha256_hex(tiny_files()["model.safetensors"]);
  EXPECT_EQ(fs::read_symlink(weights), fs::path("../../blobs") / digest);
  EXPECT_EQ(test::read_bytes(weights), tiny_files()["model.safetensors"]);
  EXPECT_FALSE(fs::exists(fs::path(s.path) / "pytorch_model.bin"));  // listed, not needed
  // The token went to the hub's own paths, never to the CDN the LFS file redirected to.
  for (const auto& r : hub.requests()) {
    if (r.path.rfind("/cdn/", 0) == 0)
      EXPECT_EQ(r.authorization, "") << r.path;
    else
      EXPECT_EQ(r.authorization, "Bearer hf_testtoken123") << r.path;
  }
  EXPECT_EQ(hub.count_requests("/cdn/"), 1u);
  // The snapshot is a model folder the loader reads: same weights as the original folder.
  ModelWeights a = load_model(s.path);
  ModelWeights b = load_model((fs::path(test::shared_dir()) / "models" / "stories260K").string());
  ASSERT_EQ(a.embed.numel(), b.embed.numel());
  EXPECT_EQ(0, std::memcmp(a.embed.data<float>(), b.embed.data<float>(), a.embed.nbytes()));

  // Second time: from the cache, no request at all.
  hub.clear_requests();
  hub::ModelSource again = hub::resolve_model_source("org/tiny", opts);
  EXPECT_FALSE(again.downloaded);
  EXPECT_EQ(again.path, s.path);
  EXPECT_TRUE(hub.requests().empty());
}

TEST_F(HubFixture, FollowsARenamedRepositorysRelativeRedirects) {
  hub::ModelSource s = hub::resolve_model_source("old-org/tiny", opts);
  EXPECT_EQ(test::read_bytes(fs::path(s.path) / "config.json"), tiny_files()["config.json"]);
  EXPECT_GT(hub.count_requests("/old-org/tiny/resolve/"), 0u);
  EXPECT_GT(hub.count_requests("/org/tiny/resolve/"), 0u);
}

TEST_F(HubFixture, RevisionByCommitAndUnknownRevision) {
  hub::ModelSource s = hub::resolve_model_source("org/tiny@" + kSha, opts);
  EXPECT_EQ(s.commit, kSha);
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / kSha));  // a commit needs no ref
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("org/tiny@no-such-branch", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("revision 'no-such-branch'"), std::string::npos) << msg;
}

TEST_F(HubFixture, GatedAndMissingRepositoriesSayHowToFixThem) {
  hub.gated.push_back("meta/llama");
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("meta/llama", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("401"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no token was sent"), std::string::npos) << msg;
  EXPECT_NE(sugg.find("accept the licence"), std::string::npos) << sugg;
  EXPECT_NE(sugg.find("huggingface-cli login"), std::string::npos) << sugg;
  EXPECT_NE(sugg.find(hub.endpoint() + "/meta/llama"), std::string::npos) << sugg;
  opts.token = "hf_nolicence";
  EXPECT_EQ(resolve_error("meta/llama", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("403"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has no access"), std::string::npos) << msg;

  EXPECT_EQ(resolve_error("org/tyni", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("404"), std::string::npos) << msg;
  EXPECT_NE(sugg.find("exact name"), std::string::npos) << sugg;
  EXPECT_FALSE(fs::exists(fs::path(cache.path) / "models--org--tyni" / "snapshots"));
}

TEST_F(HubFixture, ABrokenConnectionResumesWithRange) {
  const std::string weights = tiny_files()["model.safetensors"];
  const std::string digest = sha256_hex(weights);
  hub.cut_after_bytes = weights.size() / 3;
  hub.cuts_left = 1;
  std::string msg;
  EXPECT_EQ(resolve_error("org/tiny", &msg), ErrorCode::DEP_MODEL_DOWNLOAD_FAILED);
  EXPECT_NE(msg.find("resumes"), std::string::npos) << msg;
  const fs::path part = repo_dir() / "blobs" / (digest + ".incomplete");
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(fs::file_size(part), hub.cut_after_bytes);
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));  // not complete, not referenced

  // The next run asks only for the rest of the file.
  hub.clear_requests();
  hub::ModelSource s = hub::resolve_model_source("org/tiny", opts);
  std::vector<std::string> ranges;
  for (const auto& r : hub.requests())
    if (r.path.rfind("/cdn/", 0) == 0) ranges.push_back(r.range);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], "bytes=" + std::to_string(hub.cut_after_bytes) + "-");
  EXPECT_EQ(test::read_bytes(fs::path(s.path) / "model.safetensors"), weights);
  EXPECT_FALSE(fs::exists(part));
}

TEST_F(HubFixture, RetriesWithinOneRunResumeToo) {
  const std::string weights = tiny_files()["model.safetensors"];
  hub.cut_after_bytes = weights.size() / 2;
  hub.cuts_left = 2;  // two broken answers (the second breaks at once: its range starts past the cut)
  opts.max_attempts = 3;
  std::vector<uint64_t> seen;
  opts.progress = [&](const hub::DownloadProgress& p) {
    if (p.file == "model.safetensors") seen.push_back(p.bytes_done);
    EXPECT_EQ(p.bytes_total, p.file == "model.safetensors" ? weights.size() : p.bytes_total);
  };
  hub::ModelSource s = hub::resolve_model_source("org/tiny", opts);
  EXPECT_EQ(test::read_bytes(fs::path(s.path) / "model.safetensors"), weights);
  EXPECT_EQ(hub.count_requests("/cdn/"), 3u);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back(), weights.size());
}

TEST_F(HubFixture, AWrongChecksumIsRejectedAndNothingIsKept) {
  hub.wrong_sha256_repo = "org/tiny";
  std::string msg;
  EXPECT_EQ(resolve_error("org/tiny", &msg), ErrorCode::DEP_MODEL_DOWNLOAD_FAILED);
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
  for (const auto& e : fs::directory_iterator(repo_dir() / "blobs"))
    EXPECT_EQ(fs::file_size(e.path()) == tiny_files()["model.safetensors"].size(), false) << e.path();
  EXPECT_FALSE(fs::exists(repo_dir() / "snapshots" / kSha / "model.safetensors"));
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
}

TEST_F(HubFixture, OfflineNeverTouchesTheNetwork) {
  opts.offline = true;
  std::string msg, sugg;
  EXPECT_EQ(resolve_error("org/tiny", &msg, &sugg), ErrorCode::DEP_MODEL_LOAD_FAILED);
  EXPECT_NE(msg.find("offline"), std::string::npos) << msg;
  EXPECT_TRUE(hub.requests().empty());
  opts.offline = false;
  const std::string path = hub::resolve_model_source("org/tiny", opts).path;
  hub.clear_requests();
  opts.offline = true;
  EXPECT_EQ(hub::resolve_model_source("org/tiny", opts).path, path);
  EXPECT_TRUE(hub.requests().empty());
}

TEST_F(HubFixture, ConfigOnlyFetchesNoWeightsAndALocalFolderWins) {
  opts.need = hub::ModelFiles::Config;
  hub::ModelSource s = hub::resolve_model_source("org/tiny", opts);
  EXPECT_TRUE(fs::exists(fs::path(s.path) / "config.json"));
  EXPECT_FALSE(fs::exists(fs::path(s.path) / "model.safetensors"));
  EXPECT_EQ(hub.count_requests("/cdn/"), 0u);
  // A later full resolve completes the same snapshot.
  opts.need = hub::ModelFiles::All;
  EXPECT_TRUE(fs::exists(fs::path(hub::resolve_model_source("org/tiny", opts).path) / "model.safetensors"));

  test::TempDir work;
  fs::create_directories(fs::path(work.path) / "org" / "tiny");
  const fs::path cwd = fs::current_path();
  fs::current_path(work.path);
  hub.clear_requests();
  hub::ModelSource local = hub::resolve_model_source("org/tiny", opts);
  fs::current_path(cwd);
  EXPECT_FALSE(local.from_hub);
  EXPECT_EQ(local.path, "org/tiny");
  EXPECT_TRUE(hub.requests().empty());
}

// Sets environment variables for one test and restores them.
struct ScopedEnv {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  void set(const std::string& k, const std::optional<std::string>& v) {
    const char* old = std::getenv(k.c_str());
    saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    if (v)
      setenv(k.c_str(), v->c_str(), 1);
    else
      unsetenv(k.c_str());
  }
  ~ScopedEnv() {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it)
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
  }
};

TEST(HubEnvironment, ReadsTheVariablesHuggingFaceHubReads) {
  test::TempDir home;
  ScopedEnv env;
  for (const char* k : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
                        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "XDG_CACHE_HOME"})
    env.set(k, std::nullopt);
  env.set("HF_HOME", home.path);
  std::ofstream(fs::path(home.path) / "token") << "hf_fromloginfile\n";  // what huggingface-cli login writes
  hub::HubOptions o = hub::HubOptions::from_environment(false);
  EXPECT_EQ(o.cache_dir, (fs::path(home.path) / "hub").string());
  EXPECT_EQ(o.token, "hf_fromloginfile");
  EXPECT_EQ(o.endpoint, "https://huggingface.co");
  EXPECT_FALSE(o.offline);
  EXPECT_TRUE(hub::HubOptions::from_environment(true).offline);

  env.set("HF_HUB_CACHE", "/elsewhere/hub");
  env.set("HF_TOKEN", "hf_fromenv");
  env.set("HF_ENDPOINT", "http://127.0.0.1:9/");
  env.set("HF_HUB_OFFLINE", "1");
  o = hub::HubOptions::from_environment(false);
  EXPECT_EQ(o.cache_dir, "/elsewhere/hub");
  EXPECT_EQ(o.token, "hf_fromenv");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9");
  EXPECT_TRUE(o.offline);
  EXPECT_EQ(hub::repo_cache_dir(o, "Qwen/Qwen2.5-0.5B"), "/elsewhere/hub/models--Qwen--Qwen2.5-0.5B");
}

}  // namespace
}  // namespace bp
