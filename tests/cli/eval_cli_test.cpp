// `backprop eval` as a user runs it (the real binary): on a quick-start run its exact match is the
// quick start's own and its loss the run's held-out eval loss; intervals, --vs against the base
// model, --gate's exit codes, the results in the run folder and show-run, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

nlohmann::json json_of(const std::string& out) {
  return nlohmann::json::parse(out.substr(out.find('{')));
}

TEST(EvalCli, QuickStartRunMeasuredTheSameWayAndGated) {
  test::TempDir tmp;
  std::string out;
  // The no-argument quick start (30 steps) in an empty folder: its runs/ lands there.
  ASSERT_EQ(
      test::run_command(
          "cd " + tmp.path + " && " + test::backprop_exe() + " train --device cpu --steps 30 --json 2>/dev/null", &out),
      0)
      << out;
  const auto qs = json_of(out);
  const std::string run = qs["output_dir"];
  const std::string held = test::source_dir() + "/examples/quickstart_sharegpt_holdout.jsonl";
  const std::string eval = "cd " + tmp.path + " && " + test::backprop_exe() + " eval " + run + " --eval-data " + held;
  ASSERT_EQ(test::run_command(eval + " --metric exact_match,token_f1,loss --vs " + test::source_dir() +
                                  "/models/tiny-chat --json 2>/dev/null",
                              &out),
            0)
      << out;
  const auto j = json_of(out);
  EXPECT_EQ(j["examples"], 50);
  EXPECT_DOUBLE_EQ(j["metrics"]["exact_match"]["value"].get<double>(), qs["exact_match_after"].get<double>());
  EXPECT_DOUBLE_EQ(j["vs"]["metrics"]["exact_match"]["value"].get<double>(), qs["exact_match_before"].get<double>());
  const double loss = j["metrics"]["loss"]["value"];
  // eval holds the base as the run did (auto: bf16 on a CPU whose bf16 GEMMs run in oneDNN). Over an
  // f32 base the two losses differ by f32 summation order only; over a bf16 one the GEMMs' other
  // token counts (eval's batches are not the run's) reach activations rounded to bf16, which turns
  // those differences into a few bf16 roundings (measured 2.5e-5 relative on a Zen 5).
  const bool bf16_base = qs["base_dtype"].get<std::string>().find("bf16") != std::string::npos;
  EXPECT_NEAR(loss, qs["final_eval_loss"].get<double>(), (bf16_base ? 2e-4 : 1e-6) * loss)
      << "eval's loss is the run's held-out loss; base " << qs["base_dtype"];
  for (const char* m : {"exact_match", "token_f1", "loss"}) {
    const auto& e = j["metrics"][m];
    EXPECT_LE(e["ci_low"].get<double>(), e["value"].get<double>()) << m;
    EXPECT_GE(e["ci_high"].get<double>(), e["value"].get<double>()) << m;
  }
  // The difference is vs − evaluated, on the same rows.
  EXPECT_NEAR(j["difference"]["loss"]["value"].get<double>(), j["vs"]["metrics"]["loss"]["value"].get<double>() - loss,
              1e-9);
  // The run folder keeps the results; show-run prints them.
  ASSERT_TRUE(fs::exists(fs::path(tmp.path) / run / "eval_results.json"));
  ASSERT_EQ(test::run_command("cd " + tmp.path + " && " + test::backprop_exe() + " show-run " + run, &out), 0) << out;
  EXPECT_NE(out.find("backprop eval on " + held), std::string::npos) << out;
  EXPECT_NE(out.find("  token_f1"), std::string::npos) << out;
  // Gates: one that holds exits 0, one that fails exits 1 and says which.
  const double em = j["metrics"]["exact_match"]["value"];
  EXPECT_EQ(test::run_command(eval + " --resamples 0 --gate 'exact_match>=" + std::to_string(em - 0.01) + "'", &out), 0)
      << out;
  EXPECT_EQ(test::run_command(eval + " --resamples 0 --gate 'exact_match>" + std::to_string(em + 0.01) + "'", &out), 1)
      << out;
  EXPECT_NE(out.find("FAILED"), std::string::npos) << out;
}

TEST(EvalCli, BadInputIsRefusedBeforeAnyWork) {
  std::string out;
  const std::string bp = test::backprop_exe();
  const std::string model = " --model " + test::source_dir() + "/models/tiny-chat";
  const std::string held = " --eval-data " + test::source_dir() + "/examples/quickstart_sharegpt_holdout.jsonl";
  EXPECT_EQ(test::run_command(bp + " eval" + model, &out), 1) << out;  // no --eval-data
  EXPECT_NE(out.find("--eval-data FILE is required"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bp + " eval" + held, &out), 1) << out;  // nothing to evaluate
  EXPECT_NE(out.find("nothing to evaluate"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bp + " eval" + model + held + " --metric accuracy", &out), 1) << out;
  EXPECT_NE(out.find("not a metric"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bp + " eval" + model + held + " --gate 'loss<1'", &out), 1) << out;
  EXPECT_NE(out.find("not one of the --metric values"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bp + " eval" + model + " --eval-data /nonexistent.jsonl", &out), 1) << out;
  EXPECT_NE(out.find("INPUT_DATASET_NOT_FOUND"), std::string::npos) << out;
}

// --eval-metric: training's held-out evaluations carry eval's task metrics, and the run's final values
// are what `backprop eval` measures on the same rows with the same settings.
TEST(EvalCli, TrainingsEvalMetricIsWhatEvalMeasures) {
  test::TempDir tmp;
  const std::string src = test::source_dir();
  const std::string held = src + "/examples/quickstart_sharegpt_holdout.jsonl";
  const std::string train = test::backprop_exe() + " train --device cpu --model " + src + "/models/tiny-chat --data " +
                            src + "/examples/quickstart_sharegpt.jsonl --steps 3 --batch-size 4 --threads 1 --output " +
                            tmp.path + "/runs";
  std::string out;
  ASSERT_EQ(test::run_command(train + " --eval-data " + held +
                                  " --eval-every 2 --eval-metric exact_match,token_f1 --eval-metric-examples 12 "
                                  "--eval-max-new-tokens 12 --json 2>/dev/null",
                              &out),
            0)
      << out;
  const auto run = json_of(out);
  const std::string dir = run["output_dir"];
  // Every evaluation (before training, step 2, the end) logged both metrics beside its loss.
  std::ifstream metrics(fs::path(dir) / "metrics.jsonl");
  std::vector<int64_t> eval_steps;
  for (std::string line; std::getline(metrics, line);) {
    const auto r = nlohmann::json::parse(line);
    if (r["type"] != "eval") continue;
    eval_steps.push_back(r["step"]);
    for (const char* k : {"eval_loss", "eval_exact_match", "eval_token_f1"}) {
      ASSERT_TRUE(r.contains(k)) << line;
      EXPECT_GE(r[k].get<double>(), 0.0) << line;
    }
    EXPECT_LE(r["eval_token_f1"].get<double>(), 1.0) << line;
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{0, 2, 3}));
  std::ifstream summary_file(fs::path(dir) / "summary.json");
  const auto summary = nlohmann::json::parse(summary_file);
  ASSERT_TRUE(summary["initial_eval_metrics"].contains("eval_exact_match")) << summary.dump();
  const auto& final_metrics = summary["final_eval_metrics"];
  ASSERT_TRUE(final_metrics.contains("eval_token_f1")) << summary.dump();
  // The same numbers from `backprop eval` on the trained run: the first 12 held-out rows, 12 new tokens.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " eval " + dir + " --eval-data " + held +
                                  " --metric exact_match,token_f1 --max-examples 12 --max-new-tokens 12 --resamples 0 "
                                  "--json 2>/dev/null",
                              &out),
            0)
      << out;
  const auto ev = json_of(out);
  EXPECT_DOUBLE_EQ(ev["metrics"]["exact_match"]["value"].get<double>(),
                   final_metrics["eval_exact_match"].get<double>());
  EXPECT_DOUBLE_EQ(ev["metrics"]["token_f1"]["value"].get<double>(), final_metrics["eval_token_f1"].get<double>());
  // Refused before any step: a preference method, no held-out rows, plain-text rows, an unknown metric.
  const std::string txt = tmp.path + "/notes.txt";
  std::ofstream(txt) << "One paragraph of text.\n\nAnother paragraph.\n\nA third.\n\nA fourth one.\n";
  const std::pair<std::string, const char*> refused[] = {
      {" --eval-data " + held + " --eval-metric exact_match --method dpo", "CONFIG_INVALID_SETTING"},
      {" --holdout 0 --eval-metric exact_match", "CONFIG_INVALID_SETTING"},
      {" --eval-data " + txt + " --eval-metric token_f1", "CONFIG_INVALID_SETTING"},
      {" --eval-data " + held + " --eval-metric accuracy", "INPUT_VALIDATION_FAILED"},
  };
  for (const auto& [args, code] : refused) {
    SCOPED_TRACE(args);
    EXPECT_EQ(test::run_command(train + args + " 2>&1", &out), 1) << out;
    EXPECT_NE(out.find(code), std::string::npos) << out;
    EXPECT_EQ(out.find("step 1/"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace bp
