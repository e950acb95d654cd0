// `backprop train --base-dtype` (model.base_dtype) end to end with the real stories260K model: the
// frozen weights are held quantized (the memory plan's weights group shrinks to the held bytes, the
// loss moves by the quantization error only), the environment variable does the same as the flag,
// full fine-tuning refuses a narrower base, and the run summary says how the base was held.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "support/test_util.h"

namespace bp {
namespace {

std::string run_train(const test::TempDir& tmp, const std::string& extra, int* rc, const std::string& env = "") {
  const std::string data = tmp.path + "/data.jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily saw a bird number " << i << ". It was happy.\"}\n";
  }
  std::string out;
  *rc = test::run_command(env + " " + test::backprop_exe() + " train --device cpu --model " + test::shared_dir() +
                              "/models/stories260K --data " + data +
                              " --batch-size 4 --micro-batch-size 4 --steps 2 --lora-r 4 --lora-dropout 0"
                              " --max-seq-length 64 --threads 1 --save-every 0 --output " +
                              tmp.path + "/runs " + extra + " 2>&1",
                          &out);
  return out;
}

// "weights 123.45 KiB" of the memory plan line.
std::string plan_weights(const std::string& log) {
  std::smatch m;
  static const std::regex re(R"(memory plan[^\n]*?: weights ([0-9.]+ [KMG]?i?B))");
  return std::regex_search(log, m, re) ? m[1].str() : "";
}

TEST(TrainBaseDtype, Q8BaseShrinksThePlannedWeightsAndTrains) {
  test::TempDir a, b, c;
  int rc = 0;
  const std::string f32 = run_train(a, "--base-dtype f32", &rc);
  ASSERT_EQ(rc, 0) << f32;
  const std::string q8 = run_train(b, "--base-dtype q8_0", &rc);
  ASSERT_EQ(rc, 0) << q8;
  ASSERT_FALSE(plan_weights(f32).empty()) << f32;
  ASSERT_FALSE(plan_weights(q8).empty()) << q8;
  EXPECT_NE(plan_weights(f32), plan_weights(q8));
  const std::string env = run_train(c, "", &rc, "BACKPROPAGATE_MODEL__BASE_DTYPE=q8_0");
  ASSERT_EQ(rc, 0) << env;
  EXPECT_EQ(plan_weights(env), plan_weights(q8));
  // The run summary says how the base was held: stories260K's 172-wide down_proj rows are not
  // whole q8_0 blocks (bf16 instead).
  EXPECT_NE(q8.find("frozen base       q8_0 (held as q8_0, bf16)"), std::string::npos) << q8;
  EXPECT_NE(f32.find("frozen base       f32\n"), std::string::npos) << f32;
}

// The default (auto) holds a safetensors base in bf16 where the CPU's bf16 GEMMs run in oneDNN
// (`backprop info` says "bf16-onednn": the CPU has bf16 dot products and the build has oneDNN),
// else in f32; --cpu-gemm openblas keeps f32 on every CPU. The plan's weights follow the held type.
TEST(TrainBaseDtype, AutoHoldsTheBaseInBf16WhereOneDnnRunsTheBf16Gemms) {
  std::string info;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " info --json 2>/dev/null", &info), 0) << info;
  const std::string held = nlohmann::json::parse(info).at("cpu_gemm").at("held_bf16").get<std::string>();
  const bool onednn = held == "bf16-onednn";
  test::TempDir a, b, c;
  int rc = 0;
  const std::string dflt = run_train(a, "", &rc);
  ASSERT_EQ(rc, 0) << dflt;
  EXPECT_NE(dflt.find(onednn ? "frozen base       auto → bf16" : "frozen base       auto → f32"), std::string::npos)
      << held << "\n"
      << dflt;
  const std::string openblas = run_train(b, "--cpu-gemm openblas", &rc);
  ASSERT_EQ(rc, 0) << openblas;
  EXPECT_NE(openblas.find("frozen base       auto → f32"), std::string::npos) << openblas;
  const std::string bf16 = run_train(c, "--base-dtype bf16 --cpu-gemm openblas", &rc);
  ASSERT_EQ(rc, 0) << bf16;
  EXPECT_EQ(plan_weights(dflt), plan_weights(onednn ? bf16 : openblas)) << dflt;
  EXPECT_NE(plan_weights(bf16), plan_weights(openblas));
}

TEST(TrainBaseDtype, FullFineTuningRefusesAQuantizedBase) {
  test::TempDir a;
  int rc = 0;
  const std::string out = run_train(a, "--mode full --base-dtype q4_k", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_NE(out.find("--mode full trains every weight in f32"), std::string::npos) << out;
}

// The training start event says which engine and dtype each GEMM kind runs in on the CPU
// (backend/cpu/gemm_engine.h describe_cpu_gemms): over a bf16 base the GEMMs against it, as
// --cpu-gemm chose them, then every other GEMM; over an f32 base only the f32 line.
TEST(TrainBaseDtype, CpuStartEventNamesTheEngineOfEachGemmKind) {
  test::TempDir a, b, c;
  int rc = 0;
  const std::string f32 = run_train(a, "--base-dtype f32", &rc);
  ASSERT_EQ(rc, 0) << f32;
  EXPECT_NE(f32.find("training on the CPU (every other GEMM"), std::string::npos) << f32;
  const std::string openblas = run_train(b, "--base-dtype bf16 --cpu-gemm openblas", &rc);
  ASSERT_EQ(rc, 0) << openblas;
  EXPECT_NE(openblas.find("training on the CPU (GEMMs against weights held in bf16 (a bf16 base and a head tied to it, "
                          "--matmul-dtype bf16 copies): f32 inputs (weights widened), OpenBLAS sgemm"),
            std::string::npos)
      << openblas;
  const std::string dflt = run_train(c, "--base-dtype bf16", &rc);
  ASSERT_EQ(rc, 0) << dflt;
  EXPECT_NE(dflt.find("held in bf16 (a bf16 base and a head tied to it, --matmul-dtype bf16 copies): bf16 inputs"),
            std::string::npos)
      << dflt;
}

}  // namespace
}  // namespace bp
