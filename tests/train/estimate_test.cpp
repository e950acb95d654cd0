// estimate-vram's search (train/estimate.h):
//  - weights / trainable numbers for published model shapes (config.json only, no weights)
//    against parameter counts computed here from the HF module list and the published totals;
//  - the estimate against the CPU allocator's measured peak of a real forward_backward plus the
//    AdamW state, for tiny random models loaded from a config.json and for stories260K;
//  - the fit searches (largest micro-batch, largest sequence length) and each change of the
//    ordered fix list, with limits placed between the totals the changes give.
#include "train/estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include "backend/cpu/gemm_engine.h"
#include "core/allocator.h"
#include "core/sysinfo.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "support/f32_cpu_gemms.h"
#include "support/test_util.h"
#include "train/optimizer.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

ModelConfig config_from_json(const TempDir& dir, const nlohmann::json& j) {
  std::ofstream(fs::path(dir.path) / "config.json") << j.dump(2);
  return load_model_config(dir.path);  // only config.json is in the folder
}

nlohmann::json llama_json(int64_t V, int64_t D, int64_t F, int64_t L, int64_t H, int64_t KV, bool tied) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", V},
          {"hidden_size", D},
          {"intermediate_size", F},
          {"num_hidden_layers", L},
          {"num_attention_heads", H},
          {"num_key_value_heads", KV},
          {"max_position_embeddings", 8192},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", tied},
          {"torch_dtype", "bfloat16"}};
}

nlohmann::json qwen2_json(int64_t V, int64_t D, int64_t F, int64_t L, int64_t H, int64_t KV, bool tied) {
  nlohmann::json j = llama_json(V, D, F, L, H, KV, tied);
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["rope_theta"] = 1000000.0;
  j["rms_norm_eps"] = 1e-6;
  return j;
}

// Parameter count from the list of tensors a HF Llama/Qwen2 checkpoint holds (named_parameters).
struct Shapes {
  int64_t V, D, F, L, H, KV, hd;
  bool tied, bias;
};
int64_t count_parameters(const Shapes& s) {
  std::vector<std::vector<int64_t>> tensors = {{s.V, s.D}, {s.D}};  // embed_tokens, norm
  if (!s.tied) tensors.push_back({s.V, s.D});                       // lm_head
  for (int64_t l = 0; l < s.L; ++l) {
    tensors.push_back({s.H * s.hd, s.D});   // q_proj
    tensors.push_back({s.KV * s.hd, s.D});  // k_proj
    tensors.push_back({s.KV * s.hd, s.D});  // v_proj
    tensors.push_back({s.D, s.H * s.hd});   // o_proj
    if (s.bias) tensors.insert(tensors.end(), {{s.H * s.hd}, {s.KV * s.hd}, {s.KV * s.hd}});
    tensors.push_back({s.F, s.D});  // gate_proj
    tensors.push_back({s.F, s.D});  // up_proj
    tensors.push_back({s.D, s.F});  // down_proj
    tensors.push_back({s.D});       // input_layernorm
    tensors.push_back({s.D});       // post_attention_layernorm
  }
  int64_t n = 0;
  for (const auto& t : tensors) {
    int64_t e = 1;
    for (int64_t d : t) e *= d;
    n += e;
  }
  return n;
}
// LoRA on all seven projections: r × (in + out) each.
int64_t count_lora_all_linear(const Shapes& s, int64_t r) {
  const int64_t q = s.H * s.hd, kv = s.KV * s.hd;
  const int64_t per_layer = (s.D + q) + 2 * (s.D + kv) + (q + s.D) + 3 * (s.D + s.F);
  return r * per_layer * s.L;
}

TEST(Estimate, PublishedModelShapesFromConfigJsonOnly) {
  struct Published {
    const char* name;
    nlohmann::json config;
    Shapes shapes;
    int64_t published_parameters;  // from the model cards / safetensors metadata
  };
  const std::vector<Published> models = {
      {"SmolLM-135M",
       llama_json(49152, 576, 1536, 30, 9, 3, true),
       {49152, 576, 1536, 30, 9, 3, 64, true, false},
       134515008},
      {"Qwen2.5-0.5B",
       qwen2_json(151936, 896, 4864, 24, 14, 2, true),
       {151936, 896, 4864, 24, 14, 2, 64, true, true},
       494032768},
      {"Qwen2.5-7B",
       qwen2_json(152064, 3584, 18944, 28, 28, 4, false),
       {152064, 3584, 18944, 28, 28, 4, 128, false, true},
       7615616512},
      {"Llama-3-8B",
       llama_json(128256, 4096, 14336, 32, 32, 8, false),
       {128256, 4096, 14336, 32, 32, 8, 128, false, false},
       8030261248},
  };
  // The f32 engine: its plan of a bf16 base changes only the weights' bytes (the bf16 engines also
  // round the bf16 head's gradient: ABf16HeadUnderTheBf16EnginesCountsItsRoundedGradient).
  const F32CpuGemms f32_gemms;
  for (const auto& m : models) {
    SCOPED_TRACE(m.name);
    TempDir dir;
    const ModelConfig cfg = config_from_json(dir, m.config);
    const int64_t n = count_parameters(m.shapes);
    ASSERT_EQ(n, m.published_parameters);  // the test's own count agrees with the published one
    EstimateRequest r;
    r.lora.r = 16;
    r.batch_size = 2;
    r.max_seq_length = 512;
    r.limit_bytes = size_t{80} << 30;
    Estimate e = estimate_memory(cfg, r);
    EXPECT_EQ(e.base_parameters, n);
    EXPECT_EQ(e.plan.weights, static_cast<size_t>(n) * 4);
    const int64_t lora = count_lora_all_linear(m.shapes, 16);
    EXPECT_EQ(e.plan.trainable_parameters, lora);
    EXPECT_EQ(e.plan.trainable, static_cast<size_t>(lora) * 4);
    EXPECT_EQ(e.plan.gradients, e.plan.trainable);
    EXPECT_EQ(e.plan.optimizer_state, 2 * e.plan.trainable);
    EXPECT_EQ(e.micro_batch_tokens, 1024);
    // bf16 frozen weights: 2 bytes each, the norms (2 per layer + the final one) and q/k/v biases
    // stay f32; nothing else changes.
    const Shapes& sh = m.shapes;
    const auto norms = static_cast<size_t>((2 * sh.L + 1) * sh.D + (sh.bias ? sh.L * (sh.H + 2 * sh.KV) * sh.hd : 0));
    r.weights_dtype = DType::BF16;
    const Estimate b = estimate_memory(cfg, r);
    EXPECT_EQ(b.plan.weights, static_cast<size_t>(n) * 2 + norms * 2);
    EXPECT_EQ(b.weights_f32, static_cast<size_t>(n) * 4);
    EXPECT_EQ(b.plan.total(), e.plan.total() - static_cast<size_t>(n) * 2 + norms * 2);
    // Full fine-tuning: every weight trainable, f32 weights + grads + AdamW m and v = 16 bytes each.
    r.mode = TrainMode::Full;
    const Estimate f = estimate_memory(cfg, r);
    EXPECT_EQ(f.plan.weights, 0u);
    EXPECT_EQ(f.plan.trainable_parameters, n);
    EXPECT_EQ(f.plan.persistent(), static_cast<size_t>(n) * 16);
  }
  // Llama-3-8B LoRA with bf16 weights, no checkpointing, 8 × 4,096 tokens on a 24 GiB card: no
  // single change is enough short of cutting sequences to a few dozen tokens; checkpointing plus a
  // smaller micro-batch is.
  {
    TempDir dir;
    const ModelConfig l3 = config_from_json(dir, models[3].config);
    EstimateRequest r;
    r.weights_dtype = DType::BF16;
    r.gradient_checkpointing = false;
    r.batch_size = 8;
    r.max_seq_length = 4096;
    r.limit_bytes = size_t{24} << 30;
    const Estimate e = estimate_memory(l3, r);
    EXPECT_FALSE(e.fits);
    EXPECT_LT(e.max_seq_length, 2048);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "combined");
    EXPECT_TRUE(e.fix.fits);
    EXPECT_TRUE(e.fix.gradient_checkpointing);
    EXPECT_EQ(e.fix.max_seq_length, 4096);
    EXPECT_GE(e.fix.micro_batch_size, 1);
    EXPECT_LT(e.fix.micro_batch_size, 8);
    EXPECT_EQ(e.fix.flags, fmt::format("--gradient-checkpointing --micro-batch-size {}", e.fix.micro_batch_size));
  }
  // Llama-3-8B full fine-tuning does not fit 80 GiB (128 GB of persistent state); LoRA does.
  TempDir dir;
  const ModelConfig l3 = config_from_json(dir, models[3].config);
  EstimateRequest r;
  r.mode = TrainMode::Full;
  r.batch_size = 1;
  r.max_seq_length = 2048;
  r.limit_bytes = size_t{80} << 30;
  const Estimate e = estimate_memory(l3, r);
  EXPECT_FALSE(e.fits);
  EXPECT_EQ(e.max_micro_batch_tokens, 0);
  ASSERT_TRUE(e.has_fix);
  EXPECT_TRUE(e.fix.fits);
  EXPECT_EQ(e.fix.kind, "mode");
  EXPECT_EQ(e.fix.flags, "--mode lora --lora-r 16");
}

// ---- the prediction against a measured run --------------------------------------------------

struct MeasureCase {
  const char* name;
  nlohmann::json config;  // empty: stories260K
  TrainMode mode;
  bool ckpt;
  int64_t micro, seq;
  int64_t r = 8;
  float dropout = 0.05f;  // the CPU plan counts its per-call scratch (the default, 0, has none)
  std::vector<std::string> targets = {"all-linear"};
};

// Peak bytes of what the trainer holds during one micro-batch: the model's weights, LoRA,
// gradients, AdamW m/v, and the allocator's peak inside forward_backward.
struct Measured {
  size_t persistent = 0, total = 0;
};
Measured measure(const ModelConfig& cfg, const std::function<ModelWeights()>& make_weights, const EstimateRequest& r) {
  std::vector<std::vector<int32_t>> samples;
  std::mt19937_64 rng(7);
  for (int64_t s = 0; s < r.micro_batch(); ++s) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < r.max_seq_length; ++t)
      ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size)));
    samples.push_back(ids);
  }
  Batch batch = Batch::causal_lm(samples);
  Allocator& A = cpu_allocator();
  const size_t start = A.stats().bytes_in_use;
  Model model(make_weights(), ModelOptions{r.mode, r.gradient_checkpointing, r.ce_chunk_tokens});
  LoraAdapter adapter;
  if (r.mode == TrainMode::Lora) {
    adapter = init_lora(cfg, r.lora, 3);
    model.attach_lora(adapter);
  }
  model.set_training(true);
  AdamW adamw;
  adamw.init(model.trainable_parameters());
  Measured m;
  m.persistent = A.stats().bytes_in_use - start;
  A.reset_peak();
  model.forward_backward(batch, 1.0f, 11);
  m.total = A.stats().bytes_peak - start;
  return m;
}

TEST(Estimate, MatchesMeasuredPeakWithin10Percent) {
  const std::vector<MeasureCase> cases = {
      {"llama_lora_ckpt", llama_json(300, 64, 160, 3, 8, 2, true), TrainMode::Lora, true, 2, 48},
      {"llama_full_nockpt", llama_json(300, 64, 160, 3, 8, 2, false), TrainMode::Full, false, 1, 96},
      {"qwen2_lora_nockpt_qv",
       qwen2_json(500, 48, 128, 2, 6, 2, true),
       TrainMode::Lora,
       false,
       3,
       40,
       4,
       0.1f,
       {"q_proj", "v_proj"}},
      {"qwen2_full_ckpt", qwen2_json(500, 48, 128, 2, 6, 2, false), TrainMode::Full, true, 2, 64},
      {"stories260K_lora_ckpt", {}, TrainMode::Lora, true, 2, 64, 16},
      {"stories260K_lora_nockpt", {}, TrainMode::Lora, false, 1, 128, 8, 0.0f},
      {"stories260K_full_ckpt", {}, TrainMode::Full, true, 1, 100},
  };
  const std::string stories = shared_dir() + "/models/stories260K";
  ASSERT_TRUE(fs::exists(stories + "/model.safetensors")) << "stories260K is missing at " << stories;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const bool real = c.config.is_null();
    const ModelConfig cfg = real ? load_model_config(stories) : config_from_json(dir, c.config);
    auto make_weights = [&] { return real ? load_model(stories) : init_random_weights(cfg, 5); };
    EstimateRequest r;
    r.mode = c.mode;
    r.gradient_checkpointing = c.ckpt;
    r.lora.r = c.r;
    r.lora.dropout = c.dropout;
    r.lora.target_modules = c.targets;
    r.batch_size = 8;
    r.micro_batch_size = c.micro;
    r.max_seq_length = c.seq;
    r.limit_bytes = size_t{1} << 40;
    const Estimate e = estimate_memory(cfg, r);
    const Measured m = measure(cfg, make_weights, r);
    std::cout << "[estimate] " << c.name << ": predicted " << e.plan.total() << " B (persistent " << e.plan.persistent()
              << "), measured " << m.total << " B (persistent " << m.persistent << ")\n";
    EXPECT_EQ(e.plan.persistent(), m.persistent);
    EXPECT_NEAR(static_cast<double>(e.plan.total()) / static_cast<double>(m.total), 1.0, 0.10) << e.to_json().dump();
  }
}

// ---- fit searches and the fix list ------------------------------------------------------------

struct Fixture {
  TempDir dir;
  ModelConfig cfg;
  EstimateRequest r;
  Fixture() {
    cfg = config_from_json(dir, llama_json(1000, 64, 192, 4, 8, 4, false));
    r.lora.r = 16;
    r.batch_size = 8;
    r.max_seq_length = 256;
  }
  size_t total(TrainMode mode, bool ckpt, int64_t micro, int64_t seq, int64_t lora_r = 16) const {
    EstimateRequest q = r;
    q.mode = mode, q.gradient_checkpointing = ckpt, q.micro_batch_size = micro, q.max_seq_length = seq;
    q.lora.r = lora_r;
    return plan_memory_dtype(cfg, q.memory_settings(), q.weights_dtype).total();
  }
};

size_t plan_total(const ModelConfig& cfg, const EstimateRequest& r, int64_t tokens) {
  MemorySettings m = r.memory_settings();
  m.micro_batch_tokens = tokens;
  return plan_memory_dtype(cfg, m, r.weights_dtype).total();
}

TEST(Estimate, LargestMicroBatchAndSequenceLengthFit) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Fixture f;
    f.r.weights_dtype = dt;
    f.r.micro_batch_size = 4;
    f.r.limit_bytes = plan_total(f.cfg, f.r, 1000);  // 1,000 tokens fit, 4 × 256 = 1,024 do not
    const Estimate e = estimate_memory(f.cfg, f.r);
    EXPECT_FALSE(e.fits);
    EXPECT_GT(e.plan.total(), f.r.limit_bytes);
    const int64_t T = e.max_micro_batch_tokens;
    EXPECT_GE(T, 1000);
    EXPECT_LT(T, 1024);
    EXPECT_LE(plan_total(f.cfg, f.r, T), f.r.limit_bytes);
    EXPECT_GT(plan_total(f.cfg, f.r, T + 1), f.r.limit_bytes);
    EXPECT_EQ(e.max_micro_batch_size, T / 256);  // 3 sequences of 256
    EXPECT_EQ(e.max_seq_length, T / 4);          // 4 sequences of 250
    // Checkpointing is on, so the cheapest change is a smaller micro-batch, same batch of 8.
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "micro_batch_size");
    EXPECT_EQ(e.fix.micro_batch_size, 3);
    EXPECT_EQ(e.fix.grad_accum, 3);
    EXPECT_EQ(e.fix.flags, "--micro-batch-size 3");
    EXPECT_EQ(e.fix.total, plan_total(f.cfg, f.r, 3 * 256));
    EXPECT_TRUE(e.fix.fits);
    // A limit that holds the whole request: it fits, and the searches go past it.
    f.r.limit_bytes = e.plan.total();
    const Estimate ok = estimate_memory(f.cfg, f.r);
    EXPECT_TRUE(ok.fits);
    EXPECT_FALSE(ok.has_fix);
    EXPECT_GE(ok.max_micro_batch_size, 4);
  }
}

TEST(Estimate, EachChangeInOrder) {
  {  // 1. gradient checkpointing
    Fixture f;
    f.r.gradient_checkpointing = false;
    f.r.batch_size = 1;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 256);
    ASSERT_GT(f.total(TrainMode::Lora, false, 1, 256), f.r.limit_bytes);
    const Estimate e = estimate_memory(f.cfg, f.r);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "gradient_checkpointing");
    EXPECT_EQ(e.fix.flags, "--gradient-checkpointing");
    EXPECT_EQ(e.fix.total, f.r.limit_bytes);
    EXPECT_EQ(e.tried.front().kind, "gradient_checkpointing");
  }
  {  // 3. a shorter max sequence length (one sequence per micro-batch, checkpointing on)
    Fixture f;
    f.r.batch_size = 1;
    f.r.max_seq_length = 1024;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 600);
    const Estimate e = estimate_memory(f.cfg, f.r);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "max_seq_length");
    EXPECT_GE(e.fix.max_seq_length, 600);
    EXPECT_LT(e.fix.max_seq_length, 1024);
    EXPECT_EQ(e.fix.max_seq_length, e.max_seq_length);
    EXPECT_GT(f.total(TrainMode::Lora, true, 1, e.fix.max_seq_length + 1), f.r.limit_bytes);
    EXPECT_EQ(e.fix.flags, fmt::format("--max-seq-length {}", e.fix.max_seq_length));
  }
  {  // 4. LoRA instead of full (64-token sequences cannot usefully be shortened)
    Fixture f;
    f.r.mode = TrainMode::Full;
    f.r.batch_size = 1;
    f.r.max_seq_length = 64;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 64);
    ASSERT_GT(f.total(TrainMode::Full, true, 1, 64), f.r.limit_bytes);
    const Estimate e = estimate_memory(f.cfg, f.r);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "mode");
    EXPECT_EQ(e.fix.flags, "--mode lora --lora-r 16");
    EXPECT_EQ(e.fix.total, f.r.limit_bytes);
    ASSERT_EQ(e.tried.size(), 1u);  // nothing else applies
  }
  {  // 5. a lower LoRA r: r = 256 does not fit, r = 128 does not, r = 64 does
    Fixture f;
    f.r.lora.r = 256;
    f.r.batch_size = 1;
    f.r.max_seq_length = 32;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 32, 64);
    ASSERT_GT(f.total(TrainMode::Lora, true, 1, 32, 128), f.r.limit_bytes);
    const Estimate e = estimate_memory(f.cfg, f.r);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "lora_r");
    EXPECT_EQ(e.fix.lora_r, 64);
    EXPECT_EQ(e.fix.flags, "--lora-r 64");
    EXPECT_TRUE(e.fix.fits);
  }
  {  // None alone: full, no checkpointing, 4 sequences -> all of them together
    Fixture f;
    f.r.mode = TrainMode::Full;
    f.r.gradient_checkpointing = false;
    f.r.batch_size = 4;
    f.r.max_seq_length = 64;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 64);
    ASSERT_GT(f.total(TrainMode::Lora, false, 4, 64), f.r.limit_bytes);
    const Estimate e = estimate_memory(f.cfg, f.r);
    for (const auto& c : e.tried) EXPECT_FALSE(c.fits) << c.kind;
    EXPECT_EQ(e.tried.size(), 3u);  // checkpointing, micro-batch, mode
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "combined");
    EXPECT_TRUE(e.fix.fits);
    EXPECT_EQ(e.fix.flags, "--gradient-checkpointing --micro-batch-size 1 --mode lora --lora-r 16");
    EXPECT_EQ(e.fix.total, f.r.limit_bytes);
  }
  {  // A sequence length cut below half is not a cheap single change; combined, it is the last resort
    Fixture f;
    f.r.batch_size = 1;
    f.r.max_seq_length = 1024;
    f.r.limit_bytes = f.total(TrainMode::Lora, true, 1, 300);
    const Estimate e = estimate_memory(f.cfg, f.r);
    ASSERT_GE(e.max_seq_length, 300);
    ASSERT_LT(e.max_seq_length, 512);
    for (const auto& c : e.tried) EXPECT_NE(c.kind, "max_seq_length");
    ASSERT_EQ(e.tried.size(), 2u);  // a quantized base (too little: the activations dominate), then r
    EXPECT_EQ(e.tried[0].kind, "base_dtype");
    EXPECT_FALSE(e.tried[0].fits);
    EXPECT_EQ(e.tried[1].kind, "lora_r");
    EXPECT_FALSE(e.tried[1].fits);
    ASSERT_TRUE(e.has_fix);
    EXPECT_EQ(e.fix.kind, "combined");
    EXPECT_TRUE(e.fix.fits);
    EXPECT_EQ(e.fix.flags, fmt::format("--max-seq-length {}", e.max_seq_length));
  }
  {  // Nothing fits: a limit below the weights
    Fixture f;
    f.r.limit_bytes = 1000;
    const Estimate e = estimate_memory(f.cfg, f.r);
    EXPECT_FALSE(e.fits);
    EXPECT_EQ(e.max_micro_batch_tokens, 0);
    EXPECT_EQ(e.max_micro_batch_size, 0);
    ASSERT_TRUE(e.has_fix);
    EXPECT_FALSE(e.fix.fits);
    const auto j = e.to_json();
    EXPECT_EQ(j["fix"]["fits"], false);
    EXPECT_LT(j["headroom_bytes"].get<int64_t>(), 0);
  }
}

// The CPU's fused loss over an LM head held in bf16 (a tied embedding of a bf16 base) rounds the
// logits' gradient for dx = G·W under the bf16 engines (backend/cpu/cross_entropy.cpp): the plan's
// chunk counts 2 more bytes a logit with oneDNN, 4 with OpenBLAS's widened copy, none on the f32
// engine or over an f32 head; the estimate's arithmetic line says so.
TEST(Estimate, ABf16HeadUnderTheBf16EnginesCountsItsRoundedGradient) {
  TempDir dir;
  const ModelConfig cfg = config_from_json(dir, llama_json(49152, 576, 1536, 2, 9, 3, true));
  EstimateRequest r;
  r.lora.r = 16;
  r.batch_size = 1;
  r.max_seq_length = 512;
  r.limit_bytes = size_t{80} << 30;
  const auto plan_under = [&](const char* engine, bool bf16_dot, DType base) {
    CpuIsa isa = cpu_isa();
    if (!bf16_dot) isa.avx512_bf16 = isa.amx_bf16 = false;
    cpu::select_cpu_gemm(engine, isa, cpu::onednn_built());
    r.weights_dtype = base;
    const Estimate e = estimate_memory(cfg, r);
    cpu::select_cpu_gemm("auto");
    return e.plan;
  };
  const size_t values = size_t{256} * 49152;
  const MemoryPlan f32_engine = plan_under("openblas", true, DType::BF16);
  EXPECT_EQ(f32_engine.cross_entropy_value_bytes, 4);
  const MemoryPlan widened = plan_under("auto", false, DType::BF16);  // bf16-openblas
  EXPECT_EQ(widened.cross_entropy_value_bytes, 8);
  EXPECT_EQ(widened.total() - f32_engine.total(), values * 4);
  EXPECT_EQ(plan_under("auto", false, DType::F32).cross_entropy_value_bytes, 4);  // an f32 head
  EXPECT_EQ(cross_entropy_chunk_arithmetic(512, 49152, 256, 8),
            "256 tokens × 49,152 vocab × 8 bytes (f32 logits, the bf16 head's rounded gradient) = 96.00 MiB");
  bool onednn = cpu::onednn_built();
  try {
    if (onednn) cpu::select_cpu_gemm("onednn");
    cpu::select_cpu_gemm("auto");
  } catch (const Error&) {
    onednn = false;  // a CPU without AVX-512: oneDNN cannot make a bf16 matmul
  }
  if (!onednn) return;
  const MemoryPlan dnn = plan_under("onednn", true, DType::BF16);
  EXPECT_EQ(dnn.cross_entropy_value_bytes, 6);
  EXPECT_EQ(dnn.total() - f32_engine.total(), values * 2);
}

TEST(Estimate, CrossEntropyArithmeticAndDigits) {
  EXPECT_EQ(group_digits(0), "0");
  EXPECT_EQ(group_digits(999), "999");
  EXPECT_EQ(group_digits(49152), "49,152");
  EXPECT_EQ(group_digits(8030261248), "8,030,261,248");
  EXPECT_EQ(cross_entropy_chunk_arithmetic(1024, 49152, 256), "256 tokens × 49,152 vocab × 4 bytes = 48.00 MiB");
  EXPECT_EQ(cross_entropy_chunk_arithmetic(100, 512, 256), "100 tokens × 512 vocab × 4 bytes = 200.00 KiB");
}

TEST(Estimate, BadSettingsAreErrorsWithTheValue) {
  Fixture f;
  f.r.limit_bytes = size_t{1} << 30;
  auto expect_code = [&](EstimateRequest r, ErrorCode code, const std::string& text) {
    try {
      estimate_memory(f.cfg, r);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  EstimateRequest r = f.r;
  r.batch_size = 0;
  expect_code(r, ErrorCode::CONFIG_INVALID_SETTING, "batch_size must be >= 1, got 0");
  r = f.r;
  r.max_seq_length = -3;
  expect_code(r, ErrorCode::CONFIG_INVALID_SETTING, "got -3");
  r = f.r;
  r.lora.r = 0;
  expect_code(r, ErrorCode::CONFIG_INVALID_SETTING, "r must be >= 1, got 0");
  r = f.r;
  r.micro_batch_size = 100;  // more than the batch: clamped to it, as the trainer does
  EXPECT_EQ(estimate_memory(f.cfg, r).micro_batch_size, 8);
}

}  // namespace
}  // namespace bp::test

namespace bp::test {

// Phi-4-mini (microsoft/Phi-4-mini-instruct's config.json sizes): 3,836,021,760 parameters with its
// fused qkv_proj and gate_up_proj; LoRA r = 16 on PEFT's fused modules has one A per module:
// per layer 16·(3072 + 5120) + 16·(3072 + 3072) + 16·(3072 + 16384) + 16·(8192 + 3072) = 720,896,
// 23,068,672 in 32 layers (per projection, as a Llama of these sizes, it would be 27,787,264).
TEST(Estimate, Phi4MiniLoraOnTheFusedModules) {
  nlohmann::json j = llama_json(200064, 3072, 8192, 32, 24, 8, true);
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  j["partial_rotary_factor"] = 0.75;
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", std::vector<double>(48, 1.0)},
                       {"long_factor", std::vector<double>(48, 2.0)}};
  TempDir dir;
  const ModelConfig cfg = config_from_json(dir, j);
  EstimateRequest r;
  r.lora.r = 16;
  r.lora.target_modules = {"all-linear"};  // the setting's default (LoraConfig's own lists q_proj, ...)
  r.batch_size = 2;
  r.max_seq_length = 512;
  r.limit_bytes = size_t{80} << 30;
  const Estimate e = estimate_memory(cfg, r);
  EXPECT_EQ(e.base_parameters, 3836021760);
  EXPECT_EQ(e.plan.trainable_parameters, 23068672);
  EXPECT_EQ(e.request.lora.resolved_targets(),
            (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  r.lora.target_modules = {"qkv_proj"};
  EXPECT_EQ(estimate_memory(cfg, r).plan.trainable_parameters, 32 * 16 * (3072 + 5120));
  r.lora.target_modules = {"q_proj", "v_proj"};  // no such modules in Phi-3: refused as training refuses them
  EXPECT_THROW(estimate_memory(cfg, r), Error);
}

}  // namespace bp::test
