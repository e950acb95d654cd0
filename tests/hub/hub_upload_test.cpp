// hub::upload_to_hub against the fake hub's upload routes (fake_hub.h): the repository is made,
// regular files go base64 in the NDJSON commit and LFS files through the batch API (basic and
// multipart), what the hub has is not sent again, an interrupted multipart upload resumes from its
// acknowledged parts, 429 and 5xx answers are retried, 401/403/404 become their catalog codes, the
// token goes to the hub's origin only, and a pushed model downloads back with the same bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "hub/fake_hub.h"
#include "hub/hf_download.h"
#include "hub/hf_upload.h"
#include "io/sha256.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kToken = "hf_UploadTestToken0123456789abcdefABCDEF";

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

struct HubUpload : ::testing::Test {
  test::FakeHub hub;
  test::TempDir tmp;
  hub::HubOptions opts;
  hub::UploadRequest rq;
  void SetUp() override {
    hub.write_token = kToken;
    opts.endpoint = hub.endpoint();
    opts.cache_dir = tmp.path + "/cache";
    opts.token = kToken;
    opts.timeout_s = 10;
    rq.repo_id = "alice/tiny-lora";
    rq.commit_message = "Upload from the test";
    rq.state_dir = tmp.path + "/state";
    rq.retry_wait_s = 0;
    rq.max_retries = 2;
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = tmp.path + "/" + name;
    fs::create_directories(fs::path(p).parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  void add(const std::string& name, const std::string& bytes) {
    rq.files.push_back({name, write("src/" + name, bytes)});
  }
  ErrorCode push_error(std::string* message = nullptr, std::string* suggestion = nullptr) {
    try {
      hub::upload_to_hub(rq, opts);
    } catch (const Error& e) {
      if (message) *message = e.what();
      if (suggestion) *suggestion = e.suggestion();
      return e.code();
    }
    ADD_FAILURE() << "the push succeeded";
    return ErrorCode::RUNTIME_INTERNAL;
  }
  size_t count(const std::string& method, const std::string& path_part) {
    size_t n = 0;
    for (const auto& r : hub.requests()) n += r.method == method && r.path.find(path_part) != std::string::npos;
    return n;
  }
};

TEST(HubBase64, MatchesRfc4648Vectors) {
  EXPECT_EQ(hub::base64_encode(""), "");
  EXPECT_EQ(hub::base64_encode("f"), "Zg==");
  EXPECT_EQ(hub::base64_encode("fo"), "Zm8=");
  EXPECT_EQ(hub::base64_encode("foo"), "Zm9v");
  EXPECT_EQ(hub::base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(hub::base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(hub::base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(hub::base64_encode(std::string("\xff\x00\x80", 3)), "/wCA");
}

TEST_F(HubUpload, CreatesTheRepositoryAndCommitsRegularAndLfsFiles) {
  const std::string weights = random_bytes(3000, 1);
  add("adapter_model.safetensors", weights);
  add("adapter_config.json", "{\"r\": 4}\n");
  add("README.md", "---\nlibrary_name: peft\n---\n# card\n");
  rq.private_repo = true;
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  EXPECT_TRUE(r.created_repo);
  EXPECT_TRUE(hub.is_private("alice/tiny-lora"));
  ASSERT_EQ(hub.commits().size(), 1u);
  const test::FakeCommit c = hub.commits()[0];
  EXPECT_EQ(c.summary, "Upload from the test");
  EXPECT_EQ(c.revision, "main");
  EXPECT_EQ(c.files.at("adapter_model.safetensors"), weights);
  EXPECT_EQ(c.files.at("adapter_config.json"), "{\"r\": 4}\n");
  EXPECT_EQ(c.files.at("README.md"), "---\nlibrary_name: peft\n---\n# card\n");
  EXPECT_EQ(c.lfs_paths, std::vector<std::string>{"adapter_model.safetensors"});
  EXPECT_EQ(r.lfs_files, std::vector<std::string>{"adapter_model.safetensors"});
  EXPECT_EQ(r.bytes_sent, weights.size());
  EXPECT_EQ(r.commit_oid.size(), 40u);
  // The LFS bytes went to the storage origin without the token; every hub API call carried it.
  for (const auto& q : hub.requests()) {
    if (q.path.rfind("/upload/", 0) == 0)
      EXPECT_EQ(q.authorization, "") << q.path;
    else
      EXPECT_EQ(q.authorization, std::string("Bearer ") + kToken) << q.path;
  }
  EXPECT_EQ(count("POST", "/lfs-verify/" + sha256_hex(weights)), 1u);
}

TEST_F(HubUpload, ASecondPushSendsNoBytesTheHubHas) {
  const std::string weights = random_bytes(5000, 2);
  add("model.safetensors", weights);
  hub::upload_to_hub(rq, opts);
  hub.clear_requests();
  const hub::UploadResult again = hub::upload_to_hub(rq, opts);
  EXPECT_FALSE(again.created_repo);  // 409: it exists, the push goes on
  EXPECT_EQ(again.lfs_skipped, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(again.bytes_sent, 0u);
  EXPECT_EQ(count("PUT", "/upload/"), 0u);
  ASSERT_EQ(hub.commits().size(), 2u);
  EXPECT_EQ(hub.commits()[1].files.at("model.safetensors"), weights);
}

TEST_F(HubUpload, AnInterruptedMultipartUploadResumesFromItsAcknowledgedParts) {
  hub.multipart_threshold = 1000;
  hub.chunk_size = 4096;
  const std::string big = random_bytes(5 * 4096 - 100, 3);  // 5 parts, the last one short
  const std::string oid = sha256_hex(big);
  add("model.safetensors", big);
  add("config.json", "{}");
  // Parts 1 and 2 are stored, then part 3 keeps failing past the retries: the push stops.
  hub.fail("/upload/" + oid + "/", 500, 3, "", /*skip=*/2);
  std::string msg;
  EXPECT_EQ(push_error(&msg), ErrorCode::DEP_HUB_UPLOAD_FAILED);
  EXPECT_NE(msg.find("part 3 of 5"), std::string::npos) << msg;
  EXPECT_TRUE(hub.commits().empty());
  EXPECT_FALSE(hub.has_blob(oid));
  ASSERT_TRUE(fs::is_regular_file(rq.state_dir + "/" + oid + ".json"));
  // The part record holds ETags and a hash of the completion URL: no URL, no token.
  const std::string state = test::read_bytes(rq.state_dir + "/" + oid + ".json");
  EXPECT_EQ(state.find("http"), std::string::npos) << state;
  EXPECT_EQ(state.find(kToken), std::string::npos);

  const hub::UploadResult r = hub::upload_to_hub(rq, opts);  // run again: resumes
  EXPECT_EQ(r.parts_resumed, 2);
  EXPECT_EQ(r.parts_sent, 3);
  EXPECT_EQ(r.bytes_sent, big.size() - 2 * 4096);
  for (int part = 1; part <= 5; ++part) {
    const std::string path = "/" + std::to_string(part);
    size_t ok_puts = 0;
    for (const auto& q : hub.requests())
      ok_puts += q.method == "PUT" && q.path.find(oid) != std::string::npos && q.path.size() > path.size() &&
                 q.path.compare(q.path.size() - path.size(), path.size(), path) == 0;
    // Parts 1 and 2 were sent once; part 3 three failed times and once more; 4 and 5 once.
    EXPECT_EQ(ok_puts, part == 3 ? 4u : 1u) << "part " << part;
  }
  ASSERT_EQ(hub.commits().size(), 1u);
  EXPECT_EQ(hub.commits()[0].files.at("model.safetensors"), big);  // the hub checked the sha256 of the parts
  EXPECT_FALSE(fs::exists(rq.state_dir + "/" + oid + ".json"));    // done: the record is gone
}

// Parts recorded for an upload the hub no longer has open (another completion URL) are not
// reused: every part goes again, and the commit holds the right bytes.
TEST_F(HubUpload, PartsOfAnExpiredUploadAreSentAgain) {
  hub.multipart_threshold = 1000;
  hub.chunk_size = 4096;
  const std::string big = random_bytes(3 * 4096, 4);
  const std::string oid = sha256_hex(big);
  add("model.safetensors", big);
  hub.fail("/upload/" + oid + "/", 500, 3, "", /*skip=*/1);
  EXPECT_EQ(push_error(), ErrorCode::DEP_HUB_UPLOAD_FAILED);
  hub.forget_uploads();
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  EXPECT_EQ(r.parts_resumed, 0);
  EXPECT_EQ(r.parts_sent, 3);
  ASSERT_EQ(hub.commits().size(), 1u);
  EXPECT_EQ(hub.commits()[0].files.at("model.safetensors"), big);
}

// A token that may not create repositories in the namespace but may write to an existing one: the
// hub answers 403 to create, the repository is there, the push goes on.
TEST_F(HubUpload, ForbiddenCreateOfAnExistingRepositoryStillPushes) {
  add("config.json", "{}");
  hub::upload_to_hub(rq, opts);
  hub.fail("/api/repos/create", 403, 1);
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  EXPECT_FALSE(r.created_repo);
  EXPECT_EQ(hub.commits().size(), 2u);
}

TEST_F(HubUpload, RateLimitsAndServerErrorsAreRetried) {
  add("config.json", "{}");
  hub.fail("/api/repos/create", 429, 1, "0");
  hub.fail("/preupload/", 502, 1);
  hub.fail("/commit/", 500, 1);
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  EXPECT_EQ(r.retries, 3);
  ASSERT_EQ(hub.commits().size(), 1u);
  EXPECT_EQ(count("POST", "/commit/"), 2u);
}

TEST_F(HubUpload, RetriesSpentGiveUploadFailedWithTheStatus) {
  add("config.json", "{}");
  hub.fail("/commit/", 503, 10);
  std::string msg, suggestion;
  EXPECT_EQ(push_error(&msg, &suggestion), ErrorCode::DEP_HUB_UPLOAD_FAILED);
  EXPECT_NE(msg.find("503"), std::string::npos) << msg;
  EXPECT_NE(suggestion.find("Run the push again"), std::string::npos) << suggestion;
  EXPECT_EQ(count("POST", "/commit/"), 3u);  // the first try and max_retries = 2
  EXPECT_TRUE(hub.commits().empty());
}

TEST_F(HubUpload, UnauthorizedAndForbiddenAreAuthFailures) {
  add("config.json", "{}");
  opts.token = "";
  std::string msg, suggestion;
  EXPECT_EQ(push_error(&msg, &suggestion), ErrorCode::DEP_HUB_AUTH_FAILED);
  EXPECT_NE(msg.find("401"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no token was sent"), std::string::npos) << msg;
  EXPECT_NE(suggestion.find("huggingface-cli login"), std::string::npos) << suggestion;
  opts.token = "hf_SomeoneElsesToken";
  EXPECT_EQ(push_error(&msg, &suggestion), ErrorCode::DEP_HUB_AUTH_FAILED);
  EXPECT_NE(msg.find("403"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("hf_SomeoneElsesToken"), std::string::npos) << msg;
  EXPECT_NE(suggestion.find("write access"), std::string::npos) << suggestion;
  EXPECT_FALSE(hub.has_repo("alice/tiny-lora"));
}

TEST_F(HubUpload, AMissingRevisionIsNotFound) {
  add("config.json", "{}");
  rq.revision = "refs/pr/9";  // pull-request refs are never created by a push
  std::string msg;
  EXPECT_EQ(push_error(&msg), ErrorCode::DEP_HUB_NOT_FOUND);
  EXPECT_NE(msg.find("revision 'refs/pr/9'"), std::string::npos) << msg;
}

TEST_F(HubUpload, AMissingBranchIsMadeAndCommittedTo) {
  add("config.json", "{\"a\": 1}");
  rq.revision = "experiment-1";
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  EXPECT_TRUE(r.created_branch);
  ASSERT_EQ(hub.commits().size(), 1u);
  EXPECT_EQ(hub.commits()[0].revision, "experiment-1");
  EXPECT_EQ(count("POST", "/branch/experiment-1"), 1u);
}

TEST_F(HubUpload, BadRepositoryNamesAreRefusedBeforeAnyRequest) {
  add("config.json", "{}");
  for (const char* bad : {"", "noslash", "a/b/c", "org/name@dev", "org/na me", "org/-x-", "../etc"}) {
    rq.repo_id = bad;
    EXPECT_EQ(push_error(), ErrorCode::INPUT_VALIDATION_FAILED) << bad;
  }
  EXPECT_TRUE(hub.requests().empty());
}

// A model pushed with the upload API downloads again through the download path, byte for byte.
TEST_F(HubUpload, APushedModelDownloadsBackUnchanged) {
  const fs::path d = fs::path(test::shared_dir()) / "models" / "stories260K";
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    rq.files.push_back({f, (d / f).string()});
  rq.repo_id = "alice/stories";
  const hub::UploadResult r = hub::upload_to_hub(rq, opts);
  const std::string snap = hub::download_snapshot({"alice/stories", "main"}, opts);
  EXPECT_NE(snap.find(r.commit_oid), std::string::npos) << snap;
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    EXPECT_EQ(test::read_bytes((fs::path(snap) / f).string()), test::read_bytes((d / f).string())) << f;
}

}  // namespace
}  // namespace bp
