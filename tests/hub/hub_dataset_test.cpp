// Dataset files from the hub (issue 43, hub/hf_dataset.h): hf://datasets/ORG/NAME/PATH[@REV] through
// the fake hub of fake_hub.h (as an LFS file behind a CDN, as the hub serves .jsonl data): the
// reference's forms and refusals, the download into datasets--org--name with resume, the cache and
// --offline, the hub's 401/404 as INPUT_DATASET_NOT_FOUND; then the commands that read data (train,
// validate, data report, data split, eval) given an hf:// file; and Parquet refused with the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hub/fake_hub.h"
#include "hub/hf_dataset.h"
#include "support/expect_error.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using test::code_of;

const std::string kSha = "fedcba9876543210fedcba9876543210fedcba98";

std::string rows(int n) {
  std::string s;
  const char* who[] = {"Lily", "Tom", "Ben", "Sue"};
  for (int i = 0; i < n; ++i)
    s += std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"Who saw bird ") + std::to_string(i) +
         "?\"}, {\"role\": \"assistant\", \"content\": \"" + who[i % 4] + " saw it.\"}]}\n";
  return s;
}

struct HubDataset : ::testing::Test {
  test::FakeHub hub;
  test::TempDir cache;
  hub::HubOptions opts;
  std::string train = rows(24), held = rows(6);
  void SetUp() override {
    hub.add_repo("datasets/org/data", kSha, {{"data/train.jsonl", train}, {"held.jsonl", held}, {"README.md", "# d"}});
    hub.add_repo("org/data", kSha, {{"config.json", "{}"}});  // a model of the same name: never read as data
    hub.gated.push_back("datasets/org/private");
    opts.endpoint = hub.endpoint();
    opts.cache_dir = cache.path;
    opts.max_attempts = 3;
  }
};

TEST(HubDatasetRef, ParsesTheThreeFormsAndRefusesTheRest) {
  auto r = hub::parse_dataset_ref("hf://datasets/org/data/data/train.jsonl");
  EXPECT_EQ(r.repo.repo_id, "org/data");
  EXPECT_EQ(r.repo.revision, "main");
  EXPECT_EQ(r.file, "data/train.jsonl");
  EXPECT_EQ(r.repo.type, hub::HubRepoType::Dataset);
  r = hub::parse_dataset_ref("hf://datasets/org/data@v1.0/train.jsonl");
  EXPECT_EQ(r.repo.revision, "v1.0");
  EXPECT_EQ(r.file, "train.jsonl");
  r = hub::parse_dataset_ref("hf://datasets/org/data/sub/train.jsonl@" + kSha);
  EXPECT_EQ(r.repo.revision, kSha);
  EXPECT_EQ(r.file, "sub/train.jsonl");
  EXPECT_FALSE(hub::is_hub_dataset_reference("data/train.jsonl"));
  EXPECT_TRUE(hub::is_hub_dataset_reference("hf://org/model/x.jsonl"));
  for (const char* bad : {"hf://org/data/train.jsonl", "hf://datasets/org", "hf://datasets/org/data",
                          "hf://datasets/org/data/", "hf://datasets/org/data/../../etc/passwd",
                          "hf://datasets/org/data/*.jsonl", "hf://datasets/org/data@v1/train.jsonl@v2",
                          "hf://datasets/org/data/train.jsonl@bad..rev", "hf://datasets/-org/data/train.jsonl"}) {
    std::string msg;
    EXPECT_EQ(code_of([&] { hub::parse_dataset_ref(bad); }, &msg), ErrorCode::INPUT_VALIDATION_FAILED) << bad;
  }
}

TEST_F(HubDataset, DownloadsIntoTheDatasetsCacheOnceAndResumesABrokenTransfer) {
  hub.cut_after_bytes = 100;  // the CDN breaks the first answer after 100 bytes: the next attempt resumes
  hub.cuts_left = 1;
  const std::string ref = "hf://datasets/org/data/data/train.jsonl";
  const std::string path = hub::resolve_dataset_file(ref, opts);
  EXPECT_EQ(path, (fs::path(cache.path) / "datasets--org--data" / "snapshots" / kSha / "data/train.jsonl").string());
  EXPECT_EQ(test::read_bytes(path), train);
  EXPECT_TRUE(fs::is_symlink(path));
  bool resumed = false;
  for (const auto& r : hub.requests()) resumed = resumed || r.range == "bytes=100-";
  EXPECT_TRUE(resumed) << "the second attempt did not resume from byte 100";
  EXPECT_EQ(hub.count_requests("/api/datasets/org/data/revision/main"), 1u);
  EXPECT_EQ(hub.count_requests("/api/models/"), 0u);
  // Cached: no request at all, online or offline; a local path is returned as given.
  hub.clear_requests();
  EXPECT_EQ(hub::resolve_dataset_file(ref, opts), path);
  opts.offline = true;
  EXPECT_EQ(hub::resolve_dataset_file(ref, opts), path);
  EXPECT_TRUE(hub.requests().empty());
  EXPECT_EQ(hub::resolve_dataset_file("local.jsonl", opts), "local.jsonl");
  // Offline without a cached copy: the fix, not a network call.
  std::string msg;
  EXPECT_EQ(code_of([&] { hub::resolve_dataset_file("hf://datasets/org/data/held.jsonl", opts); }, &msg),
            ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_NE(msg.find("not in the local cache"), std::string::npos) << msg;
  EXPECT_TRUE(hub.requests().empty());
}

TEST_F(HubDataset, MissingPrivateAndUnknownAreDatasetNotFound) {
  std::string msg;
  EXPECT_EQ(code_of([&] { hub::resolve_dataset_file("hf://datasets/org/data/nope.jsonl", opts); }, &msg),
            ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_NE(msg.find("has no file 'nope.jsonl'"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { hub::resolve_dataset_file("hf://datasets/org/private/a.jsonl", opts); }, &msg),
            ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_NE(msg.find("gated or private"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { hub::resolve_dataset_file("hf://datasets/org/absent/a.jsonl", opts); }, &msg),
            ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_NE(msg.find("repository 'org/absent' not found"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { hub::resolve_dataset_file("hf://datasets/org/data/held.jsonl@v9", opts); }, &msg),
            ErrorCode::INPUT_DATASET_NOT_FOUND);
  EXPECT_NE(msg.find("revision 'v9'"), std::string::npos) << msg;
}

// The commands, as a user runs them, with the hub's environment.
struct HubDatasetCli : HubDataset {
  test::TempDir tmp;
  int run(const std::string& args, std::string* out) {
    *out = "";
    return test::run_command("(cd " + tmp.path + " && env -u HF_TOKEN -u HF_HUB_OFFLINE -u HF_HOME HF_ENDPOINT=" +
                                 hub.endpoint() + " HF_HUB_CACHE=" + cache.path + " HF_TOKEN_PATH=" + tmp.path +
                                 "/no-token " + test::backprop_exe() + " " + args + ")",
                             out);
  }
};

TEST_F(HubDatasetCli, EveryCommandThatReadsDataTakesAHubFile) {
  const std::string data = "hf://datasets/org/data/data/train.jsonl", eval = "hf://datasets/org/data/held.jsonl";
  const std::string model = test::source_dir() + "/models/tiny-chat";
  std::string out;
  ASSERT_EQ(run("validate " + data + " 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("24"), std::string::npos) << out;
  ASSERT_EQ(run("data report " + data + " --eval-data " + eval + " --json 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["train"]["rows"], 24) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["eval"]["rows"], 6) << out;
  ASSERT_EQ(run("data split " + data + " --eval-fraction 0.25 --seed 1 --json 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(fs::exists(fs::path(tmp.path) / "train.train.jsonl")) << out;  // here, never in the cache
  EXPECT_TRUE(fs::exists(fs::path(tmp.path) / "train.eval.jsonl")) << out;
  ASSERT_EQ(run("train --device cpu --model " + model + " --data " + data + " --eval-data " + eval +
                    " --steps 2 --batch-size 4 --lora-r 4 --threads 1 --save-every 0 --json 2>/dev/null",
                &out),
            0)
      << out;
  const auto summary = nlohmann::json::parse(out);
  const fs::path run_dir = fs::path(tmp.path) / summary["output_dir"].get<std::string>();
  // The run keeps the reference, not the cache path: --resume and show-run name the hub file.
  const auto settings = nlohmann::json::parse(std::ifstream(run_dir / "settings.json"));
  EXPECT_EQ(settings["data"]["path"], data);
  ASSERT_EQ(run("eval " + run_dir.string() + " --eval-data " + eval + " --metric loss --json 2>/dev/null", &out), 0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["examples"], 6) << out;
  EXPECT_EQ(hub.count_requests("/api/datasets/org/data/revision/main"), 2u);  // each file once, then the cache
  // Offline: the cached files; a bad reference: the catalog's code and the form to write.
  ASSERT_EQ(run("validate " + data + " --offline 2>&1", &out), 0) << out;
  EXPECT_EQ(run("validate hf://datasets/org/data/missing.jsonl 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("INPUT_DATASET_NOT_FOUND"), std::string::npos) << out;
  EXPECT_EQ(run("train --device cpu --model " + model + " --data hf://org/data/train.jsonl 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("INPUT_VALIDATION_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("hf://datasets/ORG/NAME/PATH"), std::string::npos) << out;
}

TEST_F(HubDatasetCli, ParquetIsRefusedWithTheConversion) {
  hub.add_repo("datasets/org/pq", kSha, {{"train.parquet", "PAR1\x15\x04PAR1"}});
  const std::string local = tmp.path + "/rows.parquet";
  std::ofstream(local) << "PAR1 not really columns PAR1";
  std::string out;
  for (const std::string& f : {local, std::string("hf://datasets/org/pq/train.parquet")}) {
    EXPECT_EQ(run("validate " + f + " 2>&1", &out), 1) << out;
    EXPECT_NE(out.find("INPUT_DATASET_PARSE_FAILED"), std::string::npos) << out;
    EXPECT_NE(out.find("is a Parquet file"), std::string::npos) << out;
    EXPECT_NE(out.find("read_parquet"), std::string::npos) << out;
  }
  // The magic is enough: a Parquet file under another name is refused the same way.
  std::ofstream(tmp.path + "/rows.jsonl") << "PAR1 columns PAR1";
  EXPECT_EQ(run("validate rows.jsonl 2>&1", &out), 1) << out;
  EXPECT_NE(out.find("is a Parquet file"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp
