// `backprop generate`: text from a model folder (optionally with a PEFT LoRA adapter) using the
// KV-cache decoder of model/generate.h. Greedy with --temperature 0, else sampling with
// temperature, top-k, top-p and a seed (same seed, same text).
//
// Text output: the prompt followed by the continuation. --json: prompt, ids, continuation,
// whole text, why it stopped, and the timing.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "model/generate.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "text/tokenizer.h"

namespace {

struct GenerateArgs {
  std::string model_dir, adapter_dir, prompt;
  int64_t max_new_tokens = 64;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int64_t top_k = 40;
  int64_t seed = -1;  // -1 = random
};

int run_generate(const GenerateArgs& a) {
  using namespace bp;
  if (a.max_new_tokens < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] --max-new-tokens must be >= 0, got {}", a.max_new_tokens));
  const std::string model_dir = cli::resolve_model(a.model_dir);
  auto tokenizer = Tokenizer::from_dir(model_dir);
  ModelWeights weights = load_model(model_dir);
  const ModelConfig cfg = weights.config;
  LoraAdapter adapter;
  const bool has_adapter = !a.adapter_dir.empty();
  Model model(std::move(weights), ModelOptions{has_adapter ? TrainMode::Lora : TrainMode::Frozen});
  if (has_adapter) {
    adapter = load_peft_adapter(a.adapter_dir, cfg);
    model.attach_lora(adapter);
  }
  model.set_training(false);

  GenerateOptions opts;
  opts.max_new_tokens = a.max_new_tokens;
  opts.sampling.temperature = a.temperature;
  opts.sampling.top_p = a.top_p;
  opts.sampling.top_k = a.top_k;
  opts.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  opts.stop_ids = tokenizer->eos_ids();
  for (int32_t id : cfg.eos_token_ids)
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) == opts.stop_ids.end()) opts.stop_ids.push_back(id);

  std::vector<int32_t> prompt_ids = tokenizer->encode(a.prompt, /*add_special=*/true);
  if (prompt_ids.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[generate] the prompt encodes to no tokens; pass --prompt TEXT");
  const auto t0 = std::chrono::steady_clock::now();
  GenerateResult res = generate(model, prompt_ids, opts);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<int32_t> all = prompt_ids;
  all.insert(all.end(), res.tokens.begin(), res.tokens.end());
  std::vector<int32_t> continuation = res.tokens;
  if (res.stopped && !continuation.empty()) continuation.pop_back();  // the stop token is not text
  const std::string text = tokenizer->decode(all, /*skip_special=*/true);
  const std::string completion = tokenizer->decode(continuation, /*skip_special=*/true);
  if (cli::global_options().json) {
    nlohmann::json j = {{"prompt", a.prompt},
                        {"prompt_ids", prompt_ids},
                        {"output_ids", res.tokens},
                        {"completion", completion},
                        {"text", text},
                        {"stop_reason", res.stopped ? "stop_token" : "max_new_tokens"},
                        {"new_tokens", res.tokens.size()},
                        {"seconds", seconds},
                        {"tokens_per_s", seconds > 0 ? static_cast<double>(res.tokens.size()) / seconds : 0.0},
                        {"temperature", a.temperature},
                        {"top_p", a.top_p},
                        {"top_k", a.top_k},
                        {"seed", opts.sampling.seed},
                        {"adapter", a.adapter_dir}};
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << text << std::endl;
  }
  return 0;
}

bp::cli::RunFn setup_generate(CLI::App& sub) {
  auto args = std::make_shared<GenerateArgs>();
  sub.add_option("--model", args->model_dir, "Model folder (Hugging Face format) or hub name org/name[@revision]")
      ->required();
  bp::cli::bind_settings(sub, {"model.offline"});
  sub.add_option("--adapter", args->adapter_dir, "PEFT LoRA adapter folder to apply");
  sub.add_option("--prompt", args->prompt, "Text to continue")->required();
  sub.add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  sub.add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  sub.add_option("--top-p", args->top_p, "Nucleus sampling: keep the smallest set with this probability mass")
      ->capture_default_str();
  sub.add_option("--top-k", args->top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  sub.add_option("--seed", args->seed, "Random seed for sampling (same seed, same text); default random");
  return [args] { return run_generate(*args); };
}

}  // namespace

BP_REGISTER_COMMAND("generate", "Generate text from a model (and optional LoRA adapter)", setup_generate);
