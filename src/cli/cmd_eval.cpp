// `backprop eval [INPUT] --eval-data FILE --metric ...` (issue 43; train/eval_metrics.h has the
// metrics and intervals). INPUT is what `export` takes (a run, a run id, an adapter or a model
// folder); without it, --model [--adapter]. --vs INPUT2 evaluates a second model on the same rows
// and reports the paired difference; --gate METRIC>=X (repeatable) exits 1 when one fails. When
// INPUT is a run, the results are also written to its folder (eval_results.json), where show-run
// finds them. The frozen base is held as `train` holds it (--base-dtype, resolved the same way: auto is
// bf16 on a CPU whose bf16 GEMMs run in oneDNN), and a run is evaluated, unless --base-dtype is given,
// at the base dtype it trained with (its settings.json), so the run's own held-out loss is eval's.
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "core/error.h"
#include "export/export_input.h"
#include "export/gguf_lora.h"
#include "export/model_card.h"
#include "io/atomic_file.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/peft.h"
#include "train/eval_metrics.h"

namespace {

namespace fs = std::filesystem;

struct EvalOptions {
  std::string input, model, adapter, eval_data, vs, format = "auto";
  std::vector<std::string> metrics{"exact_match"}, gates;
  int64_t max_new_tokens = 64, max_examples = 0, resamples = 1000;
  uint64_t seed = 0;
  bool json = false;
};

// What one side of the comparison evaluates: a base model folder, an optional adapter, and the
// run folder when the input named a run.
struct Subject {
  std::string shown, model_dir, adapter_dir, run_dir;
};

Subject resolve_subject(const std::string& input, const std::string& model, const std::string& adapter) {
  Subject s;
  auto resolve = [](const std::string& ref) { return bp::cli::resolve_model(ref); };
  if (input.empty()) {
    if (model.empty())
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      "[eval] nothing to evaluate: give a run, adapter or model folder, or --model [--adapter]")
          .with_suggestion("e.g. backprop eval runs/<run id> --eval-data held_out.jsonl --metric exact_match");
    s.model_dir = resolve(model);
    s.adapter_dir = adapter;
    s.shown = adapter.empty() ? model : adapter;
    return s;
  }
  if (!adapter.empty())
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[eval] --adapter {} and the input {} both name what to evaluate", adapter, input))
        .with_suggestion("Give one of them.");
  const bp::ExportInput in = bp::resolve_export_input(input, bp::cli::settings().get_string("training.output"));
  s.shown = in.shown;
  s.run_dir = in.run_dir.string();
  if (in.kind == bp::ExportInputKind::Model) {
    s.model_dir = in.dir.string();
  } else {
    s.adapter_dir = in.dir.string();
    s.model_dir = bp::resolve_base_model(in, model, resolve).string();
  }
  return s;
}

struct Evaluated {
  Subject subject;
  bp::EvalValues values;
};

// model.base_dtype for `s`: the flag (or environment, config) when given, else a run's own setting
// from its settings.json, else auto.
std::string base_dtype_setting(const Subject& s) {
  const bp::Settings& st = bp::cli::settings();
  if (st.source("model.base_dtype") != bp::SettingSource::Default || s.run_dir.empty())
    return st.get_string("model.base_dtype");
  const nlohmann::json j =
      bp::read_json_object_file((fs::path(s.run_dir) / "settings.json").string()).value_or(nlohmann::json::object());
  const nlohmann::json dtype = j.contains("model") && j["model"].is_object() ? j["model"].value("base_dtype", "") : "";
  return dtype.is_string() && !dtype.get<std::string>().empty() ? dtype.get<std::string>()
                                                                : st.get_string("model.base_dtype");
}

Evaluated evaluate(const Subject& s, const std::vector<bp::EvalMetric>& metrics, const EvalOptions& o) {
  auto tok = bp::Tokenizer::from_dir(s.model_dir);
  bp::ChatTemplate tmpl = bp::adapter_chat_template(*tok, s.adapter_dir);
  const bp::ChatDataOptions chat = bp::ChatDataOptions::from_settings(bp::cli::settings());
  chat.apply(tmpl);
  const std::vector<bp::TaskExample> examples =
      bp::load_task_examples(o.eval_data, bp::parse_dataset_format(o.format), false, chat);
  const std::optional<bp::DType> base =
      bp::resolve_base_dtype(base_dtype_setting(s), bp::DeviceType::CPU, !bp::gguf_base_file(s.model_dir).empty());
  bp::ModelWeights weights = bp::load_model(s.model_dir, base);
  const bp::ModelConfig cfg = weights.config;
  bp::LoraAdapter adapter;
  bp::Model model(std::move(weights),
                  bp::ModelOptions{s.adapter_dir.empty() ? bp::TrainMode::Frozen : bp::TrainMode::Lora});
  if (!s.adapter_dir.empty()) {
    adapter = bp::load_peft_adapter(s.adapter_dir, cfg);
    model.attach_lora(adapter);
  }
  bp::EvalRunOptions ro;
  ro.max_new_tokens = o.max_new_tokens;
  ro.max_examples = o.max_examples;
  return {s, bp::evaluate_metrics(model, *tok, tmpl, examples, metrics, ro)};
}

nlohmann::ordered_json estimate_json(const bp::Estimate& e) {
  return {{"value", e.value}, {"ci_low", e.low}, {"ci_high", e.high}};
}

int run_eval(const EvalOptions& o) {
  if (o.eval_data.empty())
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED, "[eval] --eval-data FILE is required")
        .with_suggestion("A held-out file of conversations (ShareGPT, OpenAI or Alpaca rows).");
  if (o.resamples < 0 || o.max_new_tokens < 0 || o.max_examples < 0)
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                    "[eval] --resamples, --max-new-tokens and --max-examples must be >= 0");
  const std::vector<bp::EvalMetric> metrics = bp::parse_eval_metrics(o.metrics);
  std::vector<bp::EvalGate> gates;
  for (const std::string& g : o.gates) gates.push_back(bp::parse_eval_gate(g, metrics));  // before any work
  const Subject a_subject = resolve_subject(o.input, o.model, o.adapter);
  EvalOptions local = o;  // an hf:// file resolved to its cached copy once, for both sides of --vs
  local.eval_data = bp::cli::resolve_data(o.eval_data);
  const Evaluated a = evaluate(a_subject, metrics, local);
  std::optional<Evaluated> b;
  if (!o.vs.empty()) b = evaluate(resolve_subject(o.vs, "", ""), metrics, local);

  nlohmann::ordered_json j;
  j["evaluated"] = a.subject.shown;
  j["model"] = a.subject.model_dir;
  if (!a.subject.adapter_dir.empty()) j["adapter"] = a.subject.adapter_dir;
  j["eval_data"] = o.eval_data;
  j["examples"] = a.values.tokens.size();
  j["resamples"] = o.resamples;
  j["seed"] = o.seed;
  nlohmann::ordered_json m = nlohmann::ordered_json::object(), vs = nlohmann::ordered_json::object(),
                         diff = nlohmann::ordered_json::object();
  std::map<std::string, double> value_of;
  for (size_t k = 0; k < metrics.size(); ++k) {
    const bp::Estimate e = bp::metric_estimate(metrics[k], a.values, k, o.resamples, o.seed);
    m[metrics[k].label()] = estimate_json(e);
    value_of[metrics[k].label()] = e.value;
    if (b) {
      vs[metrics[k].label()] = estimate_json(bp::metric_estimate(metrics[k], b->values, k, o.resamples, o.seed));
      diff[metrics[k].label()] =
          estimate_json(bp::paired_difference(metrics[k], a.values, b->values, k, o.resamples, o.seed));
    }
  }
  j["metrics"] = m;
  if (b) {
    j["vs"] = {{"evaluated", b->subject.shown}, {"metrics", vs}};
    j["difference"] = diff;  // vs − evaluated, paired
  }
  nlohmann::ordered_json gj = nlohmann::ordered_json::array();
  std::vector<std::string> failed;
  for (const bp::EvalGate& g : gates) {
    const bool ok = g.passes(value_of.at(g.metric));
    gj.push_back({{"gate", g.text()}, {"value", value_of.at(g.metric)}, {"passed", ok}});
    if (!ok) failed.push_back(g.text());
  }
  j["gates"] = gj;
  nlohmann::ordered_json answers = nlohmann::ordered_json::array();
  for (size_t i = 0; i < a.values.answers.size() && i < 5; ++i)
    answers.push_back({{"prompt", a.values.answers[i].prompt},
                       {"reference", a.values.answers[i].reference},
                       {"output", a.values.answers[i].output}});
  j["first_answers"] = answers;
  if (!a.subject.run_dir.empty())
    bp::write_file_atomic((fs::path(a.subject.run_dir) / "eval_results.json").string(), j.dump(2) + "\n");

  if (o.json || bp::cli::global_options().json) {
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << fmt::format("{} on {} ({} examples; 95% bootstrap intervals, {} resamples)\n", a.subject.shown,
                             o.eval_data, a.values.tokens.size(), o.resamples);
    for (size_t k = 0; k < metrics.size(); ++k) {
      const auto& e = m[metrics[k].label()];
      std::cout << fmt::format("  {:<24} {:.4f}  [{:.4f}, {:.4f}]", metrics[k].label(), e["value"].get<double>(),
                               e["ci_low"].get<double>(), e["ci_high"].get<double>());
      if (b) {
        const auto& v = vs[metrics[k].label()];
        const auto& d = diff[metrics[k].label()];
        std::cout << fmt::format("   vs {:.4f}: difference {:+.4f} [{:+.4f}, {:+.4f}]", v["value"].get<double>(),
                                 d["value"].get<double>(), d["ci_low"].get<double>(), d["ci_high"].get<double>());
      }
      std::cout << "\n";
    }
    if (b) std::cout << fmt::format("  (vs: {})\n", b->subject.shown);
    for (const auto& g : gj)
      std::cout << fmt::format("  gate {}: {}\n", g["gate"].get<std::string>(),
                               g["passed"].get<bool>() ? "passed" : "FAILED");
    if (!a.subject.run_dir.empty())
      std::cout << fmt::format("  saved {}\n", (fs::path(a.subject.run_dir) / "eval_results.json").string());
  }
  return failed.empty() ? 0 : 1;
}

bp::cli::RunFn setup_eval(CLI::App& sub) {
  auto o = std::make_shared<EvalOptions>();
  sub.add_option("input", o->input, "A run folder or id, an adapter folder or a model folder (as export takes)");
  sub.add_option("--model", o->model, "The model (without INPUT), or the base of an adapter whose config names none");
  sub.add_option("--adapter", o->adapter, "A PEFT LoRA adapter on --model");
  sub.add_option("--eval-data", o->eval_data, "Held-out conversations (ShareGPT, OpenAI or Alpaca rows)");
  sub.add_option("--format", o->format, "Row format of --eval-data, as train's --format")->capture_default_str();
  sub.add_option("--metric", o->metrics,
                 "exact_match, token_f1, contains, regex:PATTERN, loss, perplexity (comma-separated or repeated; "
                 "a regex with commas on its own)")
      ->capture_default_str();
  sub.add_option("--vs", o->vs, "A second run, adapter or model: both on the same rows, with the paired difference");
  sub.add_option("--gate", o->gates, "METRIC>=X (or >, <=, <; repeatable): exit 1 when one fails");
  sub.add_option("--max-new-tokens", o->max_new_tokens, "Greedy answer length")->capture_default_str();
  sub.add_option("--max-examples", o->max_examples, "Evaluate the first N examples only (0 = all)")
      ->capture_default_str();
  sub.add_option("--resamples", o->resamples, "Bootstrap resamples for the 95% intervals (0 = none)")
      ->capture_default_str();
  sub.add_option("--seed", o->seed, "Seed of the bootstrap (same seed, same intervals)")->capture_default_str();
  sub.add_flag("--json", o->json, "Machine-readable results");
  bp::cli::bind_settings(sub, {"model.offline", "model.base_dtype", "training.output", "data.columns", "data.tools",
                               "data.template_kwargs", "data.reasoning", "data.tool_arguments"});
  return [o] { return run_eval(*o); };
}

}  // namespace

BP_REGISTER_COMMAND("eval", "Task metrics of a run, adapter or model on held-out data, with confidence intervals",
                    setup_eval);
