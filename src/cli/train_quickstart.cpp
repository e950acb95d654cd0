#include "cli/train_quickstart.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "cli/progress.h"
#include "core/error.h"
#include "export/gguf_export.h"
#include "model/loader.h"
#include "model/merge.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "train/task_eval.h"
#include "train/trainer.h"

namespace bp::cli {

namespace fs = std::filesystem;

static constexpr const char* kModel = "models/tiny-chat";
static constexpr const char* kData = "examples/quickstart_sharegpt.jsonl";
static constexpr const char* kEval = "examples/quickstart_sharegpt_holdout.jsonl";

// Quick-start values for settings the user left at their defaults.
static const std::pair<const char*, const char*> kDefaults[] = {
    {"training.steps", "300"},  // ~30 s on 2 idle cores; exact match 0% -> 48% (models/README.md)
    {"training.batch_size", "8"},
    {"training.lr", "3e-3"},
    {"training.warmup_steps", "5"},
    {"training.lr_scheduler", "cosine"},
    {"lora.r", "16"},
    {"lora.alpha", "32"},
    {"lora.dropout", "0"},
    {"training.max_seq_length", "256"},
    {"training.save_every", "0"},
    {"training.eval_every", "0"},
};

bool is_quickstart(const Settings& s) {
  return s.get_string("model.path").empty() && s.get_string("data.path").empty() &&
         s.get_string("training.init_from_config").empty() && s.get_string("training.resume").empty();
}

// The folder holding models/ and examples/: the working directory; else, walking up from the
// executable, a folder holding them (the repository, above build/backprop) or its share/backpropagate
// (an installed package: PREFIX/bin/backprop and PREFIX/share/backpropagate, cmake/packaging.cmake).
static fs::path find_root() {
  auto has_files = [](const fs::path& p) { return fs::exists(p / kModel / "config.json") && fs::exists(p / kData); };
  if (has_files(fs::current_path())) return fs::current_path();
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (has_files(p)) return p;
    if (has_files(p / "share/backpropagate")) return p / "share/backpropagate";
  }
  throw Error(ErrorCode::CONFIG_INVALID,
              fmt::format("[train] no --model or --data given, and the quick-start files ({}, {}) were not found "
                          "in the working directory, above the executable ({}) or in its ../share/backpropagate",
                          kModel, kData, exe.string()))
      .with_suggestion("Run from the repository folder for the quick start, or pass --model DIR --data FILE.");
}

int run_quickstart(Settings st, bool json) {
  fs::path root = find_root();
  auto set_default = [&](const char* key, const std::string& value) {
    if (st.source(key) == SettingSource::Default) st.set(key, value, SettingSource::Default);
  };
  set_default("model.path", (root / kModel).string());
  set_default("data.path", (root / kData).string());
  set_default("data.eval_path", (root / kEval).string());
  for (const auto& [k, v] : kDefaults) set_default(k, v);
  TrainOptions o = TrainOptions::from_settings(st);
  if (json) o.quiet = true;

  auto say = [&](const std::string& s) {
    if (!json) std::cout << s << std::flush;
  };
  say(fmt::format("Quick start: LoRA fine-tuning of {} on {} ({} steps), held-out set {}\n\n", o.model_dir, o.data_path,
                  o.steps, o.eval_data_path));

  check_model_dir(o.model_dir);  // a hub name is explained, as in every command
  auto tok = Tokenizer::from_dir(o.model_dir);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  std::vector<TaskExample> examples = load_task_examples(o.eval_data_path);
  TaskEvalOptions teo;
  teo.max_new_tokens = 24;

  // Before: the base model as shipped.
  TaskEvalResult before;
  {
    ModelOptions mo;
    mo.mode = TrainMode::Frozen;
    Model base(load_model(o.model_dir), mo);
    base.set_training(false);
    before = evaluate_task(base, *tok, tmpl, examples, teo);
  }

  ProgressBar bar(!json);
  Trainer trainer(o, bar.callbacks());
  TrainSummary sum = trainer.run();
  bar.finish();

  trainer.model().set_training(false);
  TaskEvalResult after = evaluate_task(trainer.model(), *tok, tmpl, examples, teo);

  // GGUF export of the merged model: the adapter merged into the base as shipped (f32), as
  // `backprop export` merges it, not into the copy training held (bf16 where --base-dtype auto
  // picks it).
  ModelWeights merged = merge_lora(load_model(o.model_dir), *trainer.adapter());
  std::string gguf_path = (fs::path(sum.output_dir) / "export" / "tiny-chat-q8_0.gguf").string();
  fs::create_directories(fs::path(gguf_path).parent_path());
  GGUFExportResult gguf =
      export_gguf(merged, o.model_dir, GGUFQuant::Q8_0, gguf_path, "tiny-chat-quickstart", tmpl.source().text);

  if (json) {
    nlohmann::json j = sum.to_json();
    j["exact_match_before"] = before.exact_match();
    j["exact_match_after"] = after.exact_match();
    j["gguf"] = gguf.path;
    if (!before.answers.empty())
      j["example"] = {{"prompt", before.answers[0].prompt},
                      {"reference", before.answers[0].reference},
                      {"before", before.answers[0].output},
                      {"after", after.answers[0].output}};
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : std::string("n/a"); };
  std::string out;
  out += "\nWhat changed (held-out set, " + std::to_string(before.num_examples) + " examples):\n";
  out += fmt::format("  eval loss     {} -> {}\n", opt(sum.initial_eval_loss), opt(sum.final_eval_loss));
  out +=
      fmt::format("  exact match   {:.0f}% ({}/{}) -> {:.0f}% ({}/{})\n", 100 * before.exact_match(), before.num_exact,
                  before.num_examples, 100 * after.exact_match(), after.num_exact, after.num_examples);
  if (!before.answers.empty()) {
    out += fmt::format("\n  prompt        {}\n", before.answers[0].prompt);
    out += fmt::format("  expected      {}\n", before.answers[0].reference);
    out += fmt::format("  before        {}\n", before.answers[0].output);
    out += fmt::format("  after         {}\n", after.answers[0].output);
  }
  out += fmt::format("\n  GGUF (q8_0)   {} ({})\n", gguf.path, format_bytes(gguf.bytes));
  std::cout << out << format_train_summary(sum, o);
  std::cout << fmt::format("  ollama create tiny-chat -f <(echo 'FROM {}')   (with Ollama installed)\n", gguf.path);
  return 0;
}

}  // namespace bp::cli
