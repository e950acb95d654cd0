// `backprop generate`: text from a model folder (optionally with a PEFT LoRA adapter) using the
// KV-cache decoder of model/generate.h. Greedy with --temperature 0, else sampling with
// temperature, top-k, top-p and a seed (same seed, same text).
//
// Chat models (generate.chat, --chat auto|on|off): as llama.cpp's llama-cli and `ollama run` do,
// the prompt goes in as one user message (after --system, when given) rendered by the chat
// template with the generation prompt, and tokenized exactly as training tokenizes its renders
// (text/chat_template.h, no extra special tokens). The template is the one the adapter's run
// trained with (chat_template.jinja in the adapter folder, else in its run folder, as export
// ships), else the model's own (text/chat_template_source.h). auto uses the raw text when there
// is none; on refuses; off always feeds the raw text (with the tokenizer's BOS).
//
// Text output: the prompt followed by the continuation (raw), or the answer alone (chat). --json:
// prompt, ids, continuation, whole text, whether the chat template was applied and from where,
// why it stopped (stop_token, max_new_tokens or context_full), and the timing.
#include <charconv>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "cli/command.h"
#include "cli/generate.h"
#include "cli/model_ref.h"
#include "export/export_input.h"
#include "model/generate.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace {

using bp::cli::GenerateArgs;

// --seed: the whole unsigned 64-bit range (the sampler's generator takes 64 bits); nullopt = random.
std::optional<uint64_t> parse_seed(const std::string& text) {
  if (text.empty()) return std::nullopt;
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end)
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[generate] --seed must be an integer from 0 to {}, got '{}'",
                                std::numeric_limits<uint64_t>::max(), text));
  return v;
}

struct PromptTokens {
  std::vector<int32_t> ids;
  std::optional<bp::ChatTemplateSource> chat;  // set when the chat template rendered the prompt
};

PromptTokens encode_prompt(const bp::Tokenizer& tok, const GenerateArgs& a, const std::string& mode) {
  using namespace bp;
  PromptTokens p;
  const ChatTemplateSource source = adapter_chat_template_source(tok, a.adapter_dir);
  const bool has_template = source.kind != ChatTemplateSource::Kind::ChatMLDefault;
  if (mode == "on" && !has_template)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] --chat on: {} has no chat template (no chat_template.jinja, no "
                            "\"chat_template\" in tokenizer_config.json{})",
                            a.model_dir, a.adapter_dir.empty() ? "" : ", none beside the adapter"))
        .with_suggestion(
            "Use --chat off (or auto) to continue the raw prompt text, or a model or adapter that has a "
            "chat template.");
  if (mode == "off" || !has_template) {
    if (!a.system.empty())
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  "[generate] --system needs the chat template, and this prompt is fed as raw text (--chat off, or "
                  "a model without a template)")
          .with_suggestion("Drop --system, or use a model or adapter with a chat template and --chat auto|on.");
    p.ids = tok.encode(a.prompt, /*add_special=*/true);
    return p;
  }
  Conversation conv;
  if (!a.system.empty()) conv.push_back({"system", a.system});
  conv.push_back({"user", a.prompt});
  try {
    const std::string bos = tok.bos_id() >= 0 ? tok.id_to_token(tok.bos_id()) : "";
    const std::string eos = tok.eos_ids().empty() ? "" : tok.id_to_token(tok.eos_ids().front());
    ChatTemplate tmpl(source, bos, eos);
    // --template-kwargs, as training rendered its rows ('{"enable_thinking": false}' for Qwen3).
    tmpl.set_template_kwargs(parse_template_kwargs(bp::cli::settings().get_string("data.template_kwargs")));
    p.ids = tok.encode(tmpl.render(conv, /*add_generation_prompt=*/true), /*add_special=*/false);  // as training
  } catch (Error& e) {
    if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED || e.code() == ErrorCode::INPUT_VALIDATION_FAILED)
      e.with_suggestion("Use --chat off to feed the prompt as raw text" +
                        std::string(a.system.empty() ? "" : ", or drop --system (the template may not take one)") +
                        ".");
    throw;
  }
  p.chat = source;
  return p;
}

}  // namespace

namespace bp::cli {
nlohmann::json generate_report(const GenerateArgs& a, const Settings& st) {
  if (a.max_new_tokens < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] --max-new-tokens must be >= 0, got {}", a.max_new_tokens));
  const std::optional<uint64_t> seed = parse_seed(a.seed);
  const std::string chat_mode = st.get_string("generate.chat");
  const std::string model_dir = cli::resolve_model(a.model_dir);
  auto tokenizer = Tokenizer::from_dir(model_dir);
  const PromptTokens prompt = encode_prompt(*tokenizer, a, chat_mode);
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
  opts.sampling.seed = seed ? *seed : (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  opts.stop_ids = tokenizer->eos_ids();
  for (int32_t id : cfg.eos_token_ids)
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), id) == opts.stop_ids.end()) opts.stop_ids.push_back(id);

  const std::vector<int32_t>& prompt_ids = prompt.ids;
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
  {
    nlohmann::json j = {{"prompt", a.prompt},
                        {"prompt_ids", prompt_ids},
                        {"output_ids", res.tokens},
                        {"completion", completion},
                        {"text", text},
                        {"chat_template_applied", prompt.chat.has_value()},
                        {"chat_template_source", prompt.chat ? nlohmann::json(prompt.chat->describe()) : nullptr},
                        {"system", a.system},
                        {"stop_reason", res.stopped        ? "stop_token"
                                        : res.context_full ? "context_full"
                                                           : "max_new_tokens"},
                        {"new_tokens", res.tokens.size()},
                        {"seconds", seconds},
                        {"tokens_per_s", seconds > 0 ? static_cast<double>(res.tokens.size()) / seconds : 0.0},
                        {"temperature", a.temperature},
                        {"top_p", a.top_p},
                        {"top_k", a.top_k},
                        {"seed", opts.sampling.seed},
                        {"adapter", a.adapter_dir}};
    return j;
  }
}
}  // namespace bp::cli

namespace {

int run_generate(const GenerateArgs& a) {
  const nlohmann::json j = bp::cli::generate_report(a, bp::cli::settings());
  if (bp::cli::global_options().json)
    std::cout << j.dump(2) << std::endl;
  else  // a chat shows the answer, as ollama run does
    std::cout << j[j["chat_template_applied"].get<bool>() ? "completion" : "text"].get<std::string>() << std::endl;
  return 0;
}

bp::cli::RunFn setup_generate(CLI::App& sub) {
  auto args = std::make_shared<GenerateArgs>();
  sub.add_option("--model", args->model_dir, "Model folder (Hugging Face format) or hub name org/name[@revision]")
      ->required();
  bp::cli::bind_settings(sub, {"model.offline", "generate.chat", "data.template_kwargs"});
  sub.add_option("--adapter", args->adapter_dir, "PEFT LoRA adapter folder to apply");
  sub.add_option("--prompt", args->prompt, "The user message (chat), or the text to continue (--chat off)")->required();
  sub.add_option("--system", args->system, "System prompt before the user message (chat template only)");
  sub.add_option("--max-new-tokens", args->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  sub.add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  sub.add_option("--top-p", args->top_p, "Nucleus sampling: keep the smallest set with this probability mass")
      ->capture_default_str();
  sub.add_option("--top-k", args->top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  sub.add_option("--seed", args->seed, "Random seed for sampling, 0 to 2^64-1 (same seed, same text); default random");
  return [args] { return run_generate(*args); };
}

}  // namespace

BP_REGISTER_COMMAND("generate", "Generate text from a model (and optional LoRA adapter)", setup_generate);
