// LoRA step speed of each dense architecture family (issue 42 "Speed") beside a Llama of the same
// shape: Gemma 2 (sandwich norms, GeGLU, soft-caps, every other layer windowed), Gemma 3 (q/k norms,
// local RoPE, five windowed layers in six), Phi-3 (fused qkv_proj / gate_up_proj, partial rotary,
// LoRA on the fused modules) and SmolLM3 (every 4th layer without RoPE). Every model has the same
// sizes (hidden 576, intermediate 1536, 9 heads of 64, 3 KV heads, vocabulary 49152, BP_BENCH_LAYERS
// layers), so the model FLOPs (train/train_benchmark.h lora_step_flops) are the same and tokens/s
// compare directly; the windows (256) are shorter than the sequence (BP_BENCH_SEQ, 512) and the
// count is the causal one, so a windowed family's modelGF/s counts attention it skips. Qwen3 (dense)
// beside Qwen3-MoE (64 experts, top 8, 192 wide: the dense MLP's active parameters; see
// family_config) gives issue 42's MoE layer stack against a dense stack of the same active
// parameters.
//
// One step = zero_grads + Model::forward_backward (one sequence) + AdamW over the LoRA tensors
// (r 16, alpha 32, all-linear, no dropout, checkpointing on), random weights; 1 untimed warm-up step.
// Environment: BP_BENCH_THREADS (2), BP_BENCH_SEQ (512), BP_BENCH_LAYERS (6).
// Run: ./build/bench/bench_families --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/threads.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "ops/optim.h"
#include "train/optimizer.h"
#include "train/train_benchmark.h"

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The family's config.json at the common shape.
bp::ModelConfig family_config(const std::string& family) {
  nlohmann::json j = {{"vocab_size", 49152},
                      {"hidden_size", 576},
                      {"intermediate_size", 1536},
                      {"num_hidden_layers", env_int("BP_BENCH_LAYERS", 6)},
                      {"num_attention_heads", 9},
                      {"num_key_value_heads", 3},
                      {"head_dim", 64},
                      {"max_position_embeddings", 4096},
                      {"rms_norm_eps", 1e-5},
                      {"torch_dtype", "float32"}};
  if (family == "llama") {
    j["architectures"] = {"LlamaForCausalLM"};
  } else if (family == "gemma2" || family == "gemma3") {
    j["architectures"] = {family == "gemma2" ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"};
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["query_pre_attn_scalar"] = 64;
    j["sliding_window"] = 256;
    if (family == "gemma3") j["sliding_window_pattern"] = 6;
  } else if (family == "phi3") {
    j["architectures"] = {"Phi3ForCausalLM"};
    j["partial_rotary_factor"] = 0.75;
    j["tie_word_embeddings"] = true;
  } else if (family == "qwen3") {
    j["architectures"] = {"Qwen3ForCausalLM"};
  } else if (family == "qwen3moe") {
    // Qwen3-30B-A3B's proportions at this hidden size: 64 experts, 8 per token, each 192 wide, so
    // the active MLP width 8·192 equals the dense families' 1536 (same active parameters and FLOPs,
    // but the router [64, 576]); 8× the dense MLP's total parameters.
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["num_experts"] = 64;
    j["num_experts_per_tok"] = 8;
    j["moe_intermediate_size"] = 192;
    j["norm_topk_prob"] = true;
  } else {
    j["architectures"] = {"SmolLM3ForCausalLM"};
    j["no_rope_layer_interval"] = 4;
  }
  return bp::ModelConfig::from_json(j, family + " bench config");
}

void BM_family(benchmark::State& state, std::string family) {
  const int64_t T = env_int("BP_BENCH_SEQ", 512);
  const bp::ModelConfig cfg = family_config(family);
  bp::LoraConfig lc;
  lc.r = 16;
  lc.alpha = 32.0f;
  // all-linear, by name for Qwen3-MoE (PEFT's all-linear would include its router, refused): every
  // attention projection and every expert's gate/up/down.
  if (family == "qwen3moe")
    lc.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  else
    lc.target_modules = {"all-linear"};
  bp::LoraAdapter adapter = bp::init_lora(cfg, lc, 7);
  bp::ModelOptions mo;
  mo.mode = bp::TrainMode::Lora;
  mo.gradient_checkpointing = true;
  bp::Model model(bp::init_random_weights(cfg, 42), mo);
  model.attach_lora(adapter);
  auto params = model.trainable_parameters();
  bp::AdamW adam;
  adam.init(params);
  const bp::AdamWConfig opt{1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& i : ids) i = tok(rng);
  const bp::Batch batch = bp::Batch::causal_lm({ids});
  const float scale = 1.0f / static_cast<float>(batch.num_label_tokens());
  uint64_t seed = 1;
  auto step = [&] {
    model.zero_grads();
    const double loss = model.forward_backward(batch, scale, seed++).loss_sum;
    adam.step(params, opt);
    return loss;
  };
  step();  // warm-up
  double loss = 0;
  for (auto _ : state) loss = step();
  const bp::StepFlops f = bp::lora_step_flops(cfg, T, lc.r);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["modelGF/s"] = benchmark::Counter(f.total() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_GF"] = f.total() / 1e9;
  state.counters["loss"] = loss * scale;
  state.SetLabel(family);
}

}  // namespace

int main(int argc, char** argv) {
  bp::set_num_threads(env_int("BP_BENCH_THREADS", 2));
  for (const char* family : {"llama", "gemma2", "gemma3", "phi3", "smollm3", "qwen3", "qwen3moe"})
    benchmark::RegisterBenchmark((std::string("lora_step/") + family).c_str(), BM_family, std::string(family))
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(env_int("BP_BENCH_STEPS", 3));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
