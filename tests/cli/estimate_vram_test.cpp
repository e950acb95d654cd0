// `backprop estimate-vram` end to end: a folder with only config.json (SmolLM-135M's shape),
// the text breakdown with the cross-entropy arithmetic, --json against the library's estimate,
// --base-dtype bf16, the fix for a setup that does not fit, settings from the environment, errors;
// and the prediction against the peak that `backprop train` measures on stories260K.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/device_info.h"
#include "core/sysinfo.h"
#include "model/config.h"
#include "support/f32_cpu_gemms.h"
#include "support/test_util.h"
#include "train/estimate.h"
#include "train/memory_plan.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

struct Result {
  int rc;
  std::string out;
};

// The plans below are worked out for a base held in f32, which --base-dtype auto gives on the CPU
// under --cpu-gemm openblas on every CPU (on one with bf16 dot products, auto with oneDNN holds bf16:
// AutoOnTheCpuPlansTheBaseAsTrainHoldsIt); a test's `env` may set it back.
Result backprop(const std::string& args, const std::string& env = "", bool stdout_only = false) {
  std::string cmd =
      "{ env -u BACKPROPAGATE_TRAINING__MAX_MEMORY -u BACKPROPAGATE_TRAINING__VRAM_GB "
      "BACKPROPAGATE_RUNTIME__CPU_GEMM=openblas " +
      env + " " + test::backprop_exe() + " " + args + (stdout_only ? " 2>/dev/null; }" : " 2>&1; }");
  Result r;
  r.rc = test::run_command(cmd, &r.out);
  return r;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// SmolLM-135M's config.json (no weights next to it).
struct SmolDir {
  test::TempDir dir;
  SmolDir() {
    nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"vocab_size", 49152},
                        {"hidden_size", 576},
                        {"intermediate_size", 1536},
                        {"num_hidden_layers", 30},
                        {"num_attention_heads", 9},
                        {"num_key_value_heads", 3},
                        {"max_position_embeddings", 2048},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"hidden_act", "silu"},
                        {"tie_word_embeddings", true},
                        {"torch_dtype", "bfloat16"}};
    std::ofstream(fs::path(dir.path) / "config.json") << j.dump(2);
  }
  std::string path() const { return dir.path; }
};
constexpr int64_t kSmolParameters = 134515008;

TEST(EstimateVramCli, TextBreakdownWithTheCrossEntropyArithmetic) {
  SmolDir m;
  Result r = backprop("estimate-vram --model " + m.path() + " --batch-size 4 --max-seq-length 512 --vram-gb 8");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* s :
       {"LlamaForCausalLM", "134,515,008 parameters", "Micro-batch: 4 sequences × 512 tokens = 2,048",
        "weights (frozen, f32)", "134,515,008 × 4 bytes", "trainable parameters", "gradients",
        "optimizer state (AdamW)", "saved activations", "recompute buffers",
        "256 tokens × 49,152 vocab × 4 bytes = 48.00 MiB", "workspace", "total",
        "Memory to fit: 8.00 GiB (--vram-gb 8)", "Fits: yes", "Largest micro-batch at 512 tokens per sequence:",
        "Largest max sequence length at 4 sequences per micro-batch:"})
    EXPECT_TRUE(has(r.out, s)) << s << "\n" << r.out;
  EXPECT_FALSE(has(r.out, "Note:")) << r.out;  // f32 on the CPU: nothing to explain
}

TEST(EstimateVramCli, JsonIsTheLibraryEstimate) {
  SmolDir m;
  Result r = backprop("estimate-vram --json --model " + m.path() +
                          " --batch-size 8 --micro-batch-size 2 --max-seq-length 1024 --lora-r 8 --vram-gb 4",
                      "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EstimateRequest q;  // the same settings, defaults as in the settings table
  q.lora.r = 8;
  q.lora.target_modules = {"all-linear"};
  q.batch_size = 8;
  q.micro_batch_size = 2;
  q.max_seq_length = 1024;
  q.limit_bytes = size_t{4} << 30;
  q.gradient_checkpointing = false;  // auto (the default): this micro-batch fits 4 GiB without it
  const Estimate e = estimate_memory(ModelConfig::from_file(m.path() + "/config.json"), q);
  EXPECT_EQ(j["settings"]["gradient_checkpointing"], false);
  EXPECT_EQ(j["limit_bytes"].get<size_t>(), q.limit_bytes);
  EXPECT_EQ(j["settings"]["micro_batch_size"], 2);
  EXPECT_EQ(j["settings"]["grad_accum"], 4);
  EXPECT_EQ(j["settings"]["micro_batch_tokens"], 2048);
  EXPECT_EQ(j["plan"]["weights"].get<size_t>(), size_t{kSmolParameters} * 4);
  for (const char* g : {"weights", "trainable", "gradients", "optimizer_state", "saved_activations",
                        "recompute_buffers", "cross_entropy_chunk", "workspace", "total"})
    EXPECT_EQ(j["plan"][g].get<size_t>(), e.plan.to_json()[g].get<size_t>()) << g;
  EXPECT_EQ(j["fits"], e.fits);
  EXPECT_EQ(j["max_fit"]["micro_batch_tokens"], e.max_micro_batch_tokens);
  EXPECT_EQ(j["max_fit"]["micro_batch_size"], e.max_micro_batch_size);
  EXPECT_EQ(j["max_fit"]["max_seq_length"], e.max_seq_length);
  EXPECT_EQ(j["model"]["architecture"], "LlamaForCausalLM");
  EXPECT_TRUE(j["notes"].empty());
  // Asked for explicitly, checkpointing stays on, as the trainer keeps it.
  Result on = backprop("estimate-vram --json --model " + m.path() +
                           " --batch-size 8 --micro-batch-size 2 --max-seq-length 1024 --lora-r 8 --vram-gb 4"
                           " --gradient-checkpointing",
                       "", true);
  ASSERT_EQ(on.rc, 0) << on.out;
  q.gradient_checkpointing = true;
  const auto jon = nlohmann::json::parse(on.out);
  EXPECT_EQ(jon["settings"]["gradient_checkpointing"], true);
  EXPECT_EQ(jon["plan"]["total"].get<size_t>(),
            estimate_memory(ModelConfig::from_file(m.path() + "/config.json"), q).plan.total());
}

// --device cuda plans for the card: the library's device plan (the kernels' own workspace, held to
// the simulated card's measured peak in tests/cuda, and cuBLASLt's as a row of its own), bf16 for
// --base-dtype auto; --device cpu and auto on a machine without a usable GPU plan for the CPU.
TEST(EstimateVramCli, DeviceCudaPlansTheCardsOwnWorkspace) {
  SmolDir m;
  const std::string common = " --model " + m.path() + " --batch-size 2 --max-seq-length 512 --vram-gb 16";
  Result g = backprop("estimate-vram --json --device cuda --gradient-checkpointing" + common, "", true);
  ASSERT_EQ(g.rc, 0) << g.out;
  Result c =
      backprop("estimate-vram --json --device cpu --base-dtype bf16 --gradient-checkpointing" + common, "", true);
  ASSERT_EQ(c.rc, 0) << c.out;
  const auto jg = nlohmann::json::parse(g.out), jc = nlohmann::json::parse(c.out);
  EXPECT_EQ(jg["settings"]["device"], "cuda");
  EXPECT_EQ(jg["settings"]["weights_dtype"], "bf16");  // auto on the card
  EXPECT_EQ(jc["settings"]["device"], "cpu");
  EstimateRequest q;
  q.lora.target_modules = {"all-linear"};
  q.batch_size = 2;
  q.max_seq_length = 512;
  q.limit_bytes = size_t{16} << 30;
  q.weights_dtype = DType::BF16;
  const ModelConfig cfg = ModelConfig::from_file(m.path() + "/config.json");
  const test::F32CpuGemms f32_gemms;  // as the command runs (BACKPROPAGATE_RUNTIME__CPU_GEMM=openblas)
  const Estimate cpu = estimate_memory(cfg, q);
  q.device = DeviceType::CUDA;
  // cuBLASLt's workspace: GPU 0's recommended size, the largest (Hopper's 32 MiB) without a GPU.
  const CudaStatus cuda = cuda_status();
  q.gemm_workspace_bytes = cuda.usable() ? cuda_workspace::gemm_workspace_bytes(cuda.devices[0].cc_major)
                                         : cuda_workspace::kGemmWorkspaceBytesMax;
  const Estimate gpu = estimate_memory(cfg, q);
  EXPECT_EQ(jg["plan"]["total"].get<size_t>(), gpu.plan.total());
  EXPECT_EQ(jc["plan"]["total"].get<size_t>(), cpu.plan.total());
  EXPECT_NE(gpu.plan.total(), cpu.plan.total());
  EXPECT_EQ(jg["plan"]["gemm_workspace"].get<size_t>(), q.gemm_workspace_bytes);
  EXPECT_EQ(gpu.plan.gemm_workspace, q.gemm_workspace_bytes);
  EXPECT_EQ(jc["plan"]["gemm_workspace"].get<size_t>(), 0u) << "the CPU's GEMMs hold no device workspace";
  Result t = backprop("estimate-vram --device cuda" + common);
  EXPECT_TRUE(has(t.out, "Planned for: a CUDA device")) << t.out;
  EXPECT_TRUE(has(t.out, "GEMM workspace (cuBLASLt)")) << t.out;
  EXPECT_TRUE(has(t.out, format_bytes(q.gemm_workspace_bytes))) << t.out;
  if (!cuda.usable()) {
    EXPECT_TRUE(has(t.out, "no GPU here: the largest (Hopper's)")) << t.out;
  }
  Result tc = backprop("estimate-vram --device cpu" + common);
  EXPECT_FALSE(has(tc.out, "GEMM workspace")) << tc.out;
  if (!cuda.usable()) {
    Result a = backprop("estimate-vram --json --device auto" + common, "", true);
    ASSERT_EQ(a.rc, 0) << a.out;
    EXPECT_EQ(nlohmann::json::parse(a.out)["settings"]["device"], "cpu");
  }
}

// Full fine-tuning planned for a card: --matmul-dtype auto makes bf16 GEMM copies of the linear
// matrices and the head (2 bytes each, the weights row), as `train` does; f32 makes none, and
// neither does auto on the CPU, where bf16 is still accepted.
TEST(EstimateVramCli, FullFineTuningCountsTheBf16GemmCopies) {
  SmolDir m;
  const ModelConfig cfg = ModelConfig::from_file(m.path() + "/config.json");
  const std::string common = " --mode full --model " + m.path() + " --batch-size 1 --max-seq-length 128 --vram-gb 16";
  auto weights = [&](const std::string& flags, const char* matmul) {
    Result r = backprop("estimate-vram --json" + flags + common, "", true);
    EXPECT_EQ(r.rc, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["settings"]["matmul_dtype"], matmul) << flags;
    return j["plan"]["weights"].get<size_t>();
  };
  EXPECT_EQ(weights(" --device cuda", "bf16"), gemm_copy_bytes(cfg));
  EXPECT_EQ(weights(" --device cuda --matmul-dtype f32", "f32"), 0u);
  EXPECT_EQ(weights(" --device cpu", "f32"), 0u);
  EXPECT_EQ(weights(" --device cpu --matmul-dtype bf16", "bf16"), gemm_copy_bytes(cfg));
  EXPECT_GT(gemm_copy_bytes(cfg), size_t{kSmolParameters});  // 2 bytes a matrix parameter, the head too
  Result t = backprop("estimate-vram --device cuda" + common);
  EXPECT_TRUE(has(t.out, "weights (bf16 GEMM copies)")) << t.out;
  EXPECT_TRUE(has(t.out, "Note: full fine-tuning with bf16 GEMMs (--matmul-dtype)")) << t.out;
}

TEST(EstimateVramCli, Bf16CountsFrozenWeightsAtTwoBytesNormsAtFour) {
  SmolDir m;
  Result r = backprop("estimate-vram --json --base-dtype bf16 --model " + m.path() + " --vram-gb 16", "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const size_t norms = (2 * 30 + 1) * 576;  // input/post-attention norms per layer + the final norm stay f32
  EXPECT_EQ(j["plan"]["weights"].get<size_t>(), size_t{kSmolParameters} * 2 + norms * 2);
  EXPECT_EQ(j["plan"]["weights_f32"].get<size_t>(), size_t{kSmolParameters} * 4);
  EXPECT_EQ(j["settings"]["weights_dtype"], "bf16");
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_TRUE(has(j["notes"][0].get<std::string>(), "frozen weights held at bf16 (--base-dtype bf16)"));
  Result t = backprop("estimate-vram --base-dtype bf16 --model " + m.path() + " --vram-gb 16");
  EXPECT_TRUE(has(t.out, "Note: frozen weights held at bf16")) << t.out;
  EXPECT_TRUE(has(t.out, "weights (frozen, bf16)")) << t.out;
  EXPECT_TRUE(has(t.out, "134,515,008 × 2 bytes")) << t.out;
}

// --base-dtype counts the held blocks; SmolLM's 576-wide rows are not whole q4_K blocks, so those
// weights are planned (and held) at q5_0, the 1536-wide down_proj rows at q4_K.
TEST(EstimateVramCli, BaseDtypeCountsQuantizedBlocks) {
  SmolDir m;
  Result r = backprop("estimate-vram --json --base-dtype q4_k --model " + m.path() + " --vram-gb 16", "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["settings"]["weights_dtype"], "q4_K");
  const size_t down = size_t{30} * 576 * 1536 / 256 * 144;                             // q4_K
  const size_t q5 = (size_t{kSmolParameters} - 30 * 576 * 1536 - 61 * 576) / 32 * 22;  // q5_0
  EXPECT_EQ(j["plan"]["weights"].get<size_t>(), down + q5 + 61 * 576 * 4);
  Result t = backprop("estimate-vram --base-dtype q4_k --model " + m.path() + " --vram-gb 16");
  EXPECT_TRUE(has(t.out, "rows that are not whole blocks use the nearest type")) << t.out;
}

// A GGUF base is planned as `train` holds it under --base-dtype auto: in its stored type (here
// q8_0: the same bytes as the safetensors base quantized on load), not at f32.
TEST(EstimateVramCli, GgufBaseIsPlannedInItsStoredType) {
  const std::string model = test::shared_dir() + "/models/stories260K";
  test::TempDir tmp;
  const std::string gguf = tmp.path + "/m-q8_0.gguf";
  Result x = backprop("export " + model + " --format gguf --quantization q8_0 --output " + gguf);
  ASSERT_EQ(x.rc, 0) << x.out;
  auto plan = [&](const std::string& args) {
    Result r = backprop("estimate-vram --json --vram-gb 1 " + args, "", true);
    EXPECT_EQ(r.rc, 0) << r.out;
    return nlohmann::json::parse(r.out);
  };
  const auto auto_gguf = plan("--device cpu --model " + gguf);
  EXPECT_EQ(auto_gguf["settings"]["weights_dtype"], "q8_0");
  const auto q8 = plan("--device cpu --model " + model + " --base-dtype q8_0");
  EXPECT_EQ(auto_gguf["plan"]["weights"], q8["plan"]["weights"]);
  const auto f32 = plan("--device cpu --model " + gguf + " --base-dtype f32");  // asked for: dequantized on load
  EXPECT_EQ(f32["settings"]["weights_dtype"], "f32");
  EXPECT_GT(f32["plan"]["weights"].get<size_t>(), q8["plan"]["weights"].get<size_t>());
  // A safetensors base on a card: bf16, as the trainer holds it there.
  EXPECT_EQ(plan("--model " + model + " --device cuda")["settings"]["weights_dtype"], "bf16");
}

TEST(EstimateVramCli, NonFittingRunGetsTheCheapestChange) {
  SmolDir m;
  // Full fine-tuning needs 16 bytes per parameter (2.0 GiB) before any activation: 1 GiB is too
  // little; LoRA at 512 tokens fits.
  Result r = backprop("estimate-vram --model " + m.path() +
                      " --mode full --batch-size 1 --max-seq-length 512 "
                      "--vram-gb 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "Fits: no")) << r.out;
  EXPECT_TRUE(has(r.out, "Not even one token per micro-batch fits")) << r.out;
  EXPECT_TRUE(
      has(r.out, "Cheapest change that fits: LoRA (r=16) instead of full fine-tuning (--mode lora --lora-r 16)"))
      << r.out;
  Result j = backprop(
      "estimate-vram --json --model " + m.path() + " --mode full --batch-size 1 --max-seq-length 512 --vram-gb 1", "",
      true);
  const auto jj = nlohmann::json::parse(j.out);
  EXPECT_EQ(jj["fix"]["kind"], "mode");
  EXPECT_EQ(jj["fix"]["fits"], true);
  EXPECT_LE(jj["fix"]["total_bytes"].get<size_t>(), size_t{1} << 30);
  EXPECT_GT(jj["plan"]["total"].get<size_t>(), size_t{1} << 30);
}

// --base-dtype auto on the CPU plans the base as `train` holds it: bf16 where `backprop info` says the
// CPU's bf16 GEMMs run in oneDNN, else f32 (model/held_weights.h resolve_base_dtype).
TEST(EstimateVramCli, AutoOnTheCpuPlansTheBaseAsTrainHoldsIt) {
  SmolDir m;
  Result info = backprop("info --json", "BACKPROPAGATE_RUNTIME__CPU_GEMM=auto", true);
  ASSERT_EQ(info.rc, 0) << info.out;
  const bool onednn = nlohmann::json::parse(info.out)["cpu_gemm"]["held_bf16"] == "bf16-onednn";
  const std::string args = "estimate-vram --json --device cpu --model " + m.path() + " --vram-gb 16";
  Result a = backprop(args, "BACKPROPAGATE_RUNTIME__CPU_GEMM=auto", true);
  ASSERT_EQ(a.rc, 0) << a.out;
  const auto j = nlohmann::json::parse(a.out);
  EXPECT_EQ(j["settings"]["weights_dtype"], onednn ? "bf16" : "f32") << info.out;
  Result explicit_type = backprop(args + (onednn ? " --base-dtype bf16" : " --base-dtype f32"), "", true);
  ASSERT_EQ(explicit_type.rc, 0) << explicit_type.out;
  EXPECT_EQ(j["plan"]["weights"], nlohmann::json::parse(explicit_type.out)["plan"]["weights"]);
}

TEST(EstimateVramCli, SettingsFromEnvironmentAndConfigFileAndDefaultLimit) {
  SmolDir m;
  // The config.json path itself works as --model; vram_gb from the environment.
  Result r =
      backprop("estimate-vram --json --model " + m.path() + "/config.json", "BACKPROPAGATE_TRAINING__VRAM_GB=2", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["limit_bytes"].get<size_t>(), size_t{2} << 30);
  // training.max_memory is the next source of the limit.
  r = backprop("estimate-vram --json --model " + m.path(), "BACKPROPAGATE_TRAINING__MAX_MEMORY=3G", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["limit_bytes"].get<size_t>(), size_t{3} << 30);
  // Without either: the GPU's free memory, or this machine's RAM.
  r = backprop("estimate-vram --json --model " + m.path(), "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  const CudaStatus cuda = cuda_status();
  if (cuda.usable()) {
    EXPECT_TRUE(has(j["limit_source"].get<std::string>(), "GPU")) << j["limit_source"];
  } else {
    EXPECT_EQ(j["limit_source"], "this machine's RAM");
    EXPECT_EQ(j["limit_bytes"].get<uint64_t>(), mem_info().bytes_total);
    EXPECT_EQ(j["settings"]["weights_dtype"], "f32");  // dtype auto on the CPU, under --cpu-gemm openblas
    // A plan for a card that is not here still fits into the RAM, but says that it is no card's size.
    r = backprop("estimate-vram --json --device cuda --model " + m.path(), "", true);
    ASSERT_EQ(r.rc, 0) << r.out;
    j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["limit_bytes"].get<uint64_t>(), mem_info().bytes_total);
    EXPECT_TRUE(has(j["limit_source"].get<std::string>(), "no usable GPU here; --vram-gb N")) << j["limit_source"];
  }
  // Defaults: batch 8 in one micro-batch of 2,048-token sequences.
  EXPECT_EQ(j["settings"]["micro_batch_tokens"], 8 * 2048);
}

TEST(EstimateVramCli, BadInputIsAnErrorWithACode) {
  Result r = backprop("estimate-vram");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r.out, "CONFIG_INVALID")) << r.out;
  r = backprop("estimate-vram --model /nonexistent/model-dir");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.out, "/nonexistent/model-dir")) << r.out;
  SmolDir m;
  r = backprop("estimate-vram --model " + m.path() + " --vram-gb -1");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r.out, "vram_gb")) << r.out;
  r = backprop("estimate-vram --model " + m.path() + " --lora-r 0");
  EXPECT_EQ(r.rc, 1) << r.out;
}

// The prediction against what `backprop train` measures (summary.json peak_memory_bytes: the
// allocator's peak over the training steps, weights and optimizer state included) on the real
// stories260K model. Every sample is longer than --max-seq-length, so each micro-batch is exactly
// micro-batch × max-seq-length tokens, the case the estimate plans for.
TEST(EstimateVramCli, PredictionMatchesThePeakOfARealTrainingRun) {
  const std::string model = test::shared_dir() + "/models/stories260K";
  ASSERT_TRUE(fs::exists(model + "/model.safetensors")) << "stories260K is missing at " << model;
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/data.jsonl");
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Lily and Tom went to the park to play with a big red ball. ";
    for (int i = 0; i < 8; ++i) f << nlohmann::json{{"text", text}}.dump() << "\n";
  }
  struct Case {
    const char* name;
    std::string flags;
  };
  const std::vector<Case> cases = {
      {"lora_ckpt", "--mode lora --lora-r 8 --batch-size 4 --micro-batch-size 4 --max-seq-length 64"},
      {"lora_nockpt",
       "--mode lora --lora-r 4 --no-gradient-checkpointing --batch-size 2 --micro-batch-size 2 "
       "--max-seq-length 128"},
      {"full_ckpt", "--mode full --batch-size 2 --micro-batch-size 2 --max-seq-length 96"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string common = " --model " + model + " --threads 1 " + c.flags;
    const std::string out = tmp.path + "/run_" + c.name;
    Result t = backprop("train --device cpu --json --data " + tmp.path +
                            "/data.jsonl --steps 2 --holdout 0 --save-every 0 --output " + out + common,
                        "", true);
    ASSERT_EQ(t.rc, 0) << t.out;
    const auto summary = nlohmann::json::parse(t.out);
    const size_t measured = summary["peak_memory_bytes"].get<size_t>();
    Result e = backprop("estimate-vram --json --vram-gb 1" + common, "", true);
    ASSERT_EQ(e.rc, 0) << e.out;
    const auto est = nlohmann::json::parse(e.out);
    const size_t predicted = est["plan"]["total"].get<size_t>();
    std::cout << "[estimate-vram vs train] " << c.name << ": predicted " << predicted << " B, measured " << measured
              << " B\n";
    EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(measured), 1.0, 0.10) << est.dump(2);
  }
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// Qwen3-30B-A3B (its config.json, shipped in tests/cli/data): LoRA r=16 on attention over a q4_K base.
// By hand: per layer attention q 4096·2048 + k, v 512·2048 each + o 2048·4096 = 18,874,368; norms
// 2·2048 + q/k norms 2·128 = 4,352; router 128·2048 = 262,144; experts 128·3·768·2048 = 603,979,776.
// 48 layers: 29,909,790,720; embed and lm_head 2·151936·2048 = 622,329,856; final norm 2,048:
// 30,532,122,624 parameters. Active per token (8 of 128 experts: 8·3·768·2048 = 37,748,736 a layer):
// 48·56,889,600 + 622,331,904 = 3,353,032,704. Held at q4_K (144 bytes per 256 values; every row
// length 2048, 4096 or 768 is whole blocks): attention + experts + embed + head = 30,519,328,768
// values = 17,167,122,432 bytes; routers and norms f32: 12,793,856 values = 51,175,424 bytes;
// weights 17,218,297,856 bytes (16.04 GiB). LoRA: r·(in + out) per layer q 16·6144 + k, v 16·2560 +
// o 16·6144 = 278,528, × 48 = 13,369,344 trainable parameters.
TEST(EstimateVramCli, Qwen3MoePlansActiveAndTotalParametersAtQ4K) {
  const std::string model = test::source_dir() + "/tests/cli/data/qwen3_30b_a3b";
  Result r = backprop("estimate-vram --json --model " + model +
                          " --base-dtype q4_k --lora-r 16 --target-modules q_proj,k_proj,v_proj,o_proj "
                          "--batch-size 1 --max-seq-length 1024",
                      "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("base_parameters").get<int64_t>(), 30532122624);
  EXPECT_EQ(j.at("active_parameters").get<int64_t>(), 3353032704);
  EXPECT_EQ(j.at("settings").at("weights_dtype").get<std::string>(), "q4_K");
  EXPECT_EQ(j.at("plan").at("weights").get<int64_t>(), 17218297856);
  EXPECT_EQ(j.at("plan").at("trainable_parameters").get<int64_t>(), 13369344);
  // The text report says both counts.
  Result t = backprop("estimate-vram --model " + model +
                      " --base-dtype q4_k --target-modules q_proj,k_proj,v_proj,o_proj --max-seq-length 1024");
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_TRUE(has(t.out,
                  "30,532,122,624 parameters, 3,353,032,704 active per token: 8 of 128 experts on 48 sparse "
                  "layers"))
      << t.out;
  // LoRA on the experts too: r·(2048 + 768) per expert and projection, 128 experts, 3 projections,
  // 48 layers = 16·2816·128·3·48 = 830,472,192 more trainable parameters.
  Result ex = backprop("estimate-vram --json --model " + model +
                           " --base-dtype q4_k --lora-r 16 --target-modules "
                           "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --max-seq-length 1024",
                       "", true);
  ASSERT_EQ(ex.rc, 0) << ex.out;
  EXPECT_EQ(nlohmann::json::parse(ex.out).at("plan").at("trainable_parameters").get<int64_t>(), 13369344 + 830472192);
  // all-linear (the default) takes the routers too, as PEFT's does: r·(2048 + 128) more per layer,
  // 16·2176·48 = 1,671,168.
  Result all = backprop(
      "estimate-vram --json --model " + model + " --base-dtype q4_k --lora-r 16 --max-seq-length 1024", "", true);
  ASSERT_EQ(all.rc, 0) << all.out;
  EXPECT_EQ(nlohmann::json::parse(all.out).at("plan").at("trainable_parameters").get<int64_t>(),
            13369344 + 830472192 + 1671168);
}

}  // namespace
}  // namespace bp
