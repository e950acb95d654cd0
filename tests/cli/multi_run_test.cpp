// `backprop multi-run` as a user runs it (the real binary, stories260K, tiny synthetic data):
// the merge history, SLAO's formula on the files written, each gate made to fire, early stopping,
// replay and lr decay, the pool-size error, and a kill in the middle of a merge resumed to the
// same final adapter as an uninterrupted multi-run.
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

void write_data(const std::string& dir) {
  std::ofstream f(dir + "/data.jsonl");
  const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
  for (int i = 0; i < 20; ++i)
    f << "{\"text\": \"" << who[i % 5] << " saw a bird number " << i % 7 << ". It was happy.\"}\n";
}

std::string multi_cmd(const std::string& dir, const std::string& out, const std::string& extra,
                      const std::string& base = "--runs 3 --samples 5 --lr 5e-3") {
  return test::backprop_exe() + " multi-run --device cpu --model " + test::shared_dir() +
         "/models/stories260K --data " + dir + "/data.jsonl --output " + dir + "/" + out + " " + base +
         " --steps 2 --batch-size 4 --micro-batch-size 4 --warmup-steps 0"
         " --lr-scheduler constant --lora-r 4 --lora-dropout 0 --max-seq-length 64 --threads 1 " +
         extra;
}

nlohmann::json read_json(const std::string& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> tensor(const std::string& adapter_dir, const std::string& name) {
  return SafetensorsReader::open_file(adapter_dir + "/adapter_model.safetensors").read(name).to_vector();
}

const char* kA = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const char* kB = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

TEST(MultiRunCli, SlaoMergesEachRunAndWritesTheHistory) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "mr", "--replay 0.4 --lr-decay 0.5 --eval-tolerance 100"), &out), 0)
      << out;
  const std::string mr = tmp.path + "/mr";
  auto h = read_json(mr + "/history.json");
  ASSERT_EQ(h["history"].size(), 3u) << h.dump(2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(h["history"][i]["decision"], "merged") << h.dump(2);
    EXPECT_NEAR(h["history"][i]["lambda"].get<double>(), i == 0 ? 1.0 : 1.0 / std::sqrt(i + 1.0), 1e-12);
    EXPECT_TRUE(h["history"][i]["heldout_loss"].is_number());
  }
  EXPECT_EQ(h["runs_merged"], 3);
  EXPECT_TRUE(fs::exists(mr + "/holdout.jsonl"));
  // SLAO on the files: A of the merge = A of run 3; B = B_merge2 + (B_run3 - B_merge2)/sqrt(3).
  EXPECT_EQ(tensor(mr + "/adapter", kA), tensor(mr + "/run-3/adapter", kA));
  auto b2 = tensor(mr + "/merged/run-2", kB), b3 = tensor(mr + "/run-3/adapter", kB), bm = tensor(mr + "/adapter", kB);
  ASSERT_EQ(b2.size(), bm.size());
  double max_delta = 0;
  for (size_t e = 0; e < bm.size(); ++e) {
    EXPECT_NEAR(bm[e], b2[e] + (b3[e] - b2[e]) / std::sqrt(3.0), 1e-6);
    max_delta = std::max(max_delta, std::fabs(double(b3[e]) - b2[e]));
  }
  EXPECT_GT(max_delta, 0.0) << "run 3 did not train";
  // Run 2 started from run 1's merge with orthonormal A rows.
  auto a_init = tensor(mr + "/run-2/init", kA);
  const int64_t r = 4, in = static_cast<int64_t>(a_init.size()) / r;
  for (int64_t i = 0; i < r; ++i) {
    double n = 0;
    for (int64_t k = 0; k < in; ++k) n += double(a_init[i * in + k]) * a_init[i * in + k];
    EXPECT_NEAR(n, 1.0, 1e-5);
  }
  // Replay: 5 window rows + round(0.4 * 5) = 2 earlier rows from run 2 on; lr decays by 0.5 per run.
  auto lines = [](const std::string& p) {
    std::ifstream f(p);
    return std::count(std::istreambuf_iterator<char>(f), {}, '\n');
  };
  EXPECT_EQ(lines(mr + "/run-1/train.jsonl"), 5);
  EXPECT_EQ(lines(mr + "/run-2/train.jsonl"), 7);
  std::ifstream metrics(mr + "/run-3/metrics.jsonl");
  std::string line;
  bool saw_step = false;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") {
      EXPECT_NEAR(j["lr"].get<double>(), 5e-3 * 0.25, 1e-12);
      saw_step = true;
    }
  }
  EXPECT_TRUE(saw_step);
}

TEST(MultiRunCli, KilledMidMergeResumesToTheSameFinalAdapter) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "straight", ""), &out), 0) << out;
  EXPECT_EQ(test::run_command(multi_cmd(tmp.path, "crashed", "--fault-inject-multirun crash_merge:2"), &out),
            128 + SIGKILL)
      << out;
  ASSERT_TRUE(fs::exists(tmp.path + "/crashed/merged/run-2"));
  EXPECT_EQ(read_json(tmp.path + "/crashed/multirun_state.json")["completed_runs"], 1);
  // Without --resume the folder is refused; with it the multi-run continues.
  EXPECT_EQ(test::run_command(multi_cmd(tmp.path, "crashed", ""), &out), 1) << out;
  EXPECT_NE(out.find("--resume"), std::string::npos) << out;
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "crashed", "--resume latest"), &out), 0) << out;
  EXPECT_EQ(slurp(tmp.path + "/crashed/adapter/adapter_model.safetensors"),
            slurp(tmp.path + "/straight/adapter/adapter_model.safetensors"));
  EXPECT_EQ(read_json(tmp.path + "/crashed/history.json")["history"].size(), 3u);
}

TEST(MultiRunCli, GatesFireAndEarlyStoppingEnds) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  // Drift gate: no fresh B has cosine 1 with the merge, so runs 2.. stay side branches; patience 1 stops at run 2.
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "drift", "--drift-threshold 1 --patience 1 --json"), &out), 0) << out;
  auto h = read_json(tmp.path + "/drift/history.json");
  ASSERT_EQ(h["history"].size(), 2u) << h.dump(2);
  EXPECT_EQ(h["history"][1]["decision"], "side_branch");
  EXPECT_TRUE(h["stopped_early"].get<bool>());
  EXPECT_FALSE(fs::exists(tmp.path + "/drift/merged/run-2"));
  // Eval gate: a learning rate this high makes every merge worse than the base model.
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "eval", "--max-grad-norm 0", "--lr 3 --runs 2 --samples 5"), &out), 0)
      << out;
  h = read_json(tmp.path + "/eval/history.json");
  EXPECT_EQ(h["history"][0]["decision"], "undone") << h.dump(2);
  EXPECT_EQ(h["history"][0]["code"], "RUNTIME_EVAL_GATE_REGRESSED");
  EXPECT_NE(out.find("RUNTIME_EVAL_GATE_REGRESSED"), std::string::npos) << out;
  EXPECT_EQ(h["final_adapter"], "");
}

TEST(MultiRunCli, NonFiniteMergeStopsWithTheCodeAndKeepsTheMergeBefore) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  EXPECT_EQ(test::run_command(multi_cmd(tmp.path, "nan", "--fault-inject-multirun nan_merge:2"), &out), 2) << out;
  EXPECT_NE(out.find("RUNTIME_SLAO_MERGE_DIVERGED"), std::string::npos) << out;
  auto st = read_json(tmp.path + "/nan/multirun_state.json");
  EXPECT_EQ(st["merged_dir"], tmp.path + "/nan/merged/run-1");
  EXPECT_EQ(st["history"].back()["decision"], "diverged");
  EXPECT_TRUE(fs::exists(tmp.path + "/nan/merged/run-1/adapter_model.safetensors"));
}

TEST(MultiRunCli, SamplesBeyondThePoolAreRefusedWithTheSize) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  EXPECT_EQ(test::run_command(multi_cmd(tmp.path, "big", "", "--samples 100"), &out), 1) << out;
  EXPECT_NE(out.find("CONFIG_INVALID"), std::string::npos) << out;
  EXPECT_NE(out.find("at most 18"), std::string::npos) << out;  // 20 rows - 2 held out
  EXPECT_NE(out.find("--validation-split 0"), std::string::npos) << out;
}

// A preference method (DPO) in multi-run: every run and every merge's held-out check measure
// against one reference, the base model. Runs 2.. start from the merge so far; were that start
// their reference (as a single run's --init-adapter is), the gate's held-out losses would all be
// log 2 and no gate could ever fire.
TEST(MultiRunCli, APreferenceMethodMeasuresEveryRunAgainstTheBase) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/data.jsonl");
    const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
    for (int i = 0; i < 20; ++i)
      f << nlohmann::json{{"prompt", std::string(who[i % 5]) + " saw a bird number " + std::to_string(i % 7) + "."},
                          {"chosen", "It was happy and sang."},
                          {"rejected", "It was sad and fell."}}
               .dump()
        << "\n";
  }
  std::string out;
  ASSERT_EQ(
      test::run_command(
          multi_cmd(tmp.path, "dpo", "--method dpo --eval-tolerance 100", "--runs 3 --samples 5 --lr 5e-4"), &out),
      0)
      << out;
  const std::string mr = tmp.path + "/dpo";
  const auto h = read_json(mr + "/history.json");
  ASSERT_EQ(h["history"].size(), 3u) << h.dump(2);
  const double log2 = std::log(2.0);
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i + 1);
    const auto run = read_json(mr + "/run-" + std::to_string(i + 1) + "/summary.json");
    // Each run starts measured against the base: the untrained base (run 1) ties, so log 2; a run
    // starting from a merge is already better than the base.
    if (i == 0)
      EXPECT_NEAR(run["initial_eval_loss"].get<double>(), log2, 1e-9);
    else
      EXPECT_LT(run["initial_eval_loss"].get<double>(), log2 - 0.05) << run.dump(2);
    EXPECT_LT(h["history"][i]["heldout_loss"].get<double>(), log2 - 0.05) << h.dump(2);
    EXPECT_TRUE(run["final_eval_metrics"].contains("eval_rewards/accuracies")) << run.dump(2);
  }
  // Run 1's merge is its adapter (lambda 1): the gate's held-out loss is the run's own final one.
  EXPECT_NEAR(h["history"][0]["heldout_loss"].get<double>(),
              read_json(mr + "/run-1/summary.json")["final_eval_loss"].get<double>(), 1e-9);
}

// Run 1 starts from the base and later runs from the merge: an adapter of the user's would be
// dropped, so it is refused.
TEST(MultiRunCli, AnInitAdapterIsRefusedNotDropped) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(multi_cmd(tmp.path, "first", "", "--runs 1 --samples 5"), &out), 0) << out;
  EXPECT_EQ(test::run_command(multi_cmd(tmp.path, "second", "--init-adapter " + tmp.path + "/first/adapter"), &out), 1)
      << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_NE(out.find("--format merged"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(tmp.path + "/second/run-1")) << "refused after it started";
}

}  // namespace
}  // namespace bp
