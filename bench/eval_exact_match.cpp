// Exact match of a model (optionally with a PEFT adapter) on held-out conversations, the metric
// the quick start prints (train/task_eval.h). Used to compare a multi-run's merged adapter with a
// single run's (docs/multi-run.md). A measurement tool, not a test:
//   build/bench/eval_exact_match MODEL_DIR HOLDOUT.jsonl [ADAPTER_DIR]
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "model/loader.h"
#include "model/peft.h"
#include "text/chat_template.h"
#include "train/task_eval.h"

int main(int argc, char** argv) {
  using namespace bp;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR HOLDOUT.jsonl [ADAPTER_DIR]\n", argv[0]);
    return 1;
  }
  try {
    auto tok = Tokenizer::from_dir(argv[1]);
    ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
    const auto examples = load_task_examples(argv[2]);
    ModelWeights weights = load_model(argv[1]);
    std::unique_ptr<LoraAdapter> adapter;
    ModelOptions mo;
    mo.mode = argc > 3 ? TrainMode::Lora : TrainMode::Frozen;
    if (argc > 3) adapter = std::make_unique<LoraAdapter>(load_peft_adapter(argv[3], weights.config));
    Model model(std::move(weights), mo);
    if (adapter) model.attach_lora(*adapter);
    model.set_training(false);
    TaskEvalOptions teo;
    teo.max_new_tokens = 24;  // as the quick start
    const TaskEvalResult r = evaluate_task(model, *tok, tmpl, examples, teo);
    std::printf("exact match %.0f%% (%lld/%lld)\n", 100.0 * r.exact_match(), static_cast<long long>(r.num_exact),
                static_cast<long long>(r.num_examples));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
