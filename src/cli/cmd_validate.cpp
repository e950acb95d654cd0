// `backprop validate FILE`: reads a dataset the way training does and reports every bad row with
// its line number and reason. Lengths are exact token counts with --model (the model's tokenizer
// and chat template), otherwise estimated at 4 bytes per token; the report says which.
// Exit code 0 when every row is good, 1 when any row is bad or the file has no usable row.
// Messages quote rows, so each goes through redact() (tokens in a dataset stay out of terminals and CI logs).
// --show N (with --model) prints the first N samples as training renders them, the trained spans
// between [TRAIN] and [/TRAIN], so a person can see what the model will learn (issue 15); a pair
// shows its rejected sequence too.
// --method M (training.method, also from --config or the environment): a file whose format does not
// fit the method is reported as INPUT_DATASET_WRONG_SHAPE (issue 38), exit code 1.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "cli/validate.h"
#include "core/error.h"
#include "core/redact.h"
#include "model/loader.h"
#include "text/dataset.h"
#include "train/train_data.h"

namespace {

// The first n samples as training sees them: decoded text with the trained spans marked.
nlohmann::ordered_json rendered_samples(const bp::LoadedDataset& ds, const bp::Tokenizer& tok,
                                        const bp::ChatTemplate& tmpl, int64_t max_length, int64_t n) {
  using namespace bp;
  LoadedDataset head;
  for (size_t k = 0; k < ds.rows.size() && static_cast<int64_t>(head.rows.size()) < n; ++k)
    head.rows.push_back(ds.rows[k]);
  const TokenizedDataset td =
      tokenize_dataset(head, tok, tmpl, {.max_seq_length = max_length > 0 ? max_length : 1 << 24});
  // Decoded text with the trained spans marked, and the trained spans alone.
  const auto mark = [&](const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask, std::string& marked,
                        nlohmann::ordered_json& trained) {
    trained = nlohmann::ordered_json::array();
    for (size_t b = 0; b < ids.size();) {
      size_t e = b;
      while (e < ids.size() && mask[e] == mask[b]) ++e;
      const std::string piece = tok.decode(std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(b),
                                                                ids.begin() + static_cast<std::ptrdiff_t>(e)));
      if (mask[b]) trained.push_back(piece);
      marked += mask[b] ? "[TRAIN]" + piece + "[/TRAIN]" : piece;
      b = e;
    }
  };
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Sample& s : td.samples) {
    std::string marked;
    nlohmann::ordered_json trained;
    mark(s.ids, s.loss_mask, marked, trained);
    out.push_back({{"line", s.source_line}, {"tokens", s.ids.size()}, {"text", marked}, {"trained", trained}});
    if (s.label >= 0) out.back()["label"] = s.label == 1;
    if (!s.is_pair()) continue;
    std::string rejected;
    mark(s.rejected_ids, s.rejected_loss_mask, rejected, trained);
    out.back()["rejected_tokens"] = s.rejected_ids.size();
    out.back()["rejected_text"] = rejected;
    out.back()["rejected_trained"] = trained;
  }
  return out;
}

}  // namespace

namespace bp::cli {
ValidateReport validate_report(const ValidateOptions& o, const Settings& st) {
  ValidateReport out;
  if (o.max_errors < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[validate] --max-errors must be >= 0, got {}", o.max_errors));
  DatasetLoadOptions lo;
  lo.format = parse_dataset_format(o.format);
  lo.max_length = o.max_length;
  const ChatDataOptions chat = ChatDataOptions::from_settings(st);  // tools, reasoning, ... as training
  chat.apply(lo);
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  if (!o.model_dir.empty()) {
    tok = Tokenizer::from_dir(cli::resolve_model(o.model_dir, hub::ModelFiles::Tokenizer));
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer(*tok, o.chat_template));
    chat.apply(*tmpl);
    lo.tokenizer = tok.get();
    lo.chat_template = tmpl.get();
  }
  if (o.show > 0 && !tok)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[validate] --show needs --model: the samples are rendered with the model's tokenizer and template");
  LoadedDataset ds = load_dataset(cli::resolve_data(o.file), lo);
  const nlohmann::ordered_json samples =
      o.show > 0 ? rendered_samples(ds, *tok, *tmpl, o.max_length, o.show) : nlohmann::ordered_json::array();
  // Rows over the length are not bad: training keeps them, truncated to --max-seq-length (the
  // trainer's tokenize step). They are listed apart so the exit status and the "bad" count mean
  // "rows training skips".
  std::vector<RowIssue> long_rows;
  for (auto it = ds.issues.begin(); it != ds.issues.end();)
    if (it->problem == RowProblem::TooLong) {
      long_rows.push_back(*it);
      it = ds.issues.erase(it);
    } else {
      ++it;
    }
  const char* length_check = o.max_length <= 0 ? "off" : tok ? "tokens" : "estimate";
  // The method's shape, when one was chosen (--method, --config or the environment).
  const bool method_set = st.source("training.method") != SettingSource::Default;
  const std::string& method = st.get_string("training.method");
  const std::string shape_problem =
      method_set ? data_shape_problem(ds.format, method_data_shape(parse_train_method(method))) : "";
  std::string invalid_reason;
  if (ds.total_rows == 0)
    invalid_reason = "the file has no rows";
  else if (ds.rows.empty() && long_rows.empty())
    invalid_reason = "every row is bad";
  const auto shown = static_cast<size_t>(std::min<int64_t>(o.max_errors, static_cast<int64_t>(ds.issues.size())));
  {
    nlohmann::ordered_json& j = out.json;
    j["path"] = ds.path;
    j["format"] = dataset_format_name(ds.format);
    j["shape"] = data_shape_name(dataset_format_shape(ds.format));
    if (method_set) j["method"] = method;
    if (!shape_problem.empty()) j["shape_problem"] = shape_problem;
    j["total_rows"] = ds.total_rows;
    j["good_rows"] = ds.rows.size() + long_rows.size();
    j["long_rows"] = long_rows.size();
    j["bad_rows"] = ds.issues.size();
    j["length_check"] = length_check;
    j["max_length"] = o.max_length;
    if (tmpl && tmpl->is_fallback()) j["chat_template_warning"] = tmpl->warning();
    if (tmpl) j["chat_template"] = {{"source", tmpl->source().kind_name()}, {"origin", tmpl->source().origin}};
    if (o.show > 0) j["samples"] = samples;
    j["issues"] = nlohmann::ordered_json::array();
    for (size_t k = 0; k < shown; ++k)
      j["issues"].push_back({{"line", ds.issues[k].line},
                             {"reason", row_problem_name(ds.issues[k].problem)},
                             {"message", redact(ds.issues[k].message)}});
    j["issues_truncated"] = shown < ds.issues.size();
    j["long"] = nlohmann::ordered_json::array();
    for (size_t k = 0; k < std::min(long_rows.size(), static_cast<size_t>(o.max_errors)); ++k)
      j["long"].push_back({{"line", long_rows[k].line}, {"message", redact(long_rows[k].message)}});
    j["valid"] = ds.issues.empty() && invalid_reason.empty() && shape_problem.empty();
    j["error_code"] = !shape_problem.empty()    ? nlohmann::ordered_json("INPUT_DATASET_WRONG_SHAPE")
                      : !invalid_reason.empty() ? nlohmann::ordered_json("INPUT_DATASET_INVALID")
                                                : nullptr;
  }
  {
    out.text += fmt::format("{}: format {}, {} rows, {} good, {} bad\n", ds.path, dataset_format_name(ds.format),
                            ds.total_rows, ds.rows.size() + long_rows.size(), ds.issues.size());
    for (size_t k = 0; k < shown; ++k)
      out.text += fmt::format("line {}: {}: {}\n", ds.issues[k].line, row_problem_name(ds.issues[k].problem),
                              redact(ds.issues[k].message));
    if (shown < ds.issues.size())
      out.text += fmt::format("... {} more bad rows not shown (raise --max-errors)\n", ds.issues.size() - shown);
    for (size_t k = 0; k < std::min(long_rows.size(), static_cast<size_t>(o.max_errors)); ++k)
      out.text += fmt::format("line {}: long: {}\n", long_rows[k].line, redact(long_rows[k].message));
    if (!long_rows.empty())
      out.text += fmt::format(
          "{} rows are longer than {} tokens: training keeps their start (--max-seq-length); a row whose trainable "
          "part lies past it is skipped\n",
          long_rows.size(), o.max_length);
    if (tmpl) out.text += "Chat template: " + tmpl->source().describe() + "\n";
    for (const auto& smp : samples) {
      out.text += fmt::format("--- sample from line {} ({} tokens; trained spans in [TRAIN]...[/TRAIN]) ---\n{}\n",
                              smp["line"].get<int64_t>(), smp["tokens"].get<size_t>(), smp["text"].get<std::string>());
      if (smp.contains("rejected_text"))
        out.text += fmt::format("--- its rejected sequence ({} tokens) ---\n{}\n", smp["rejected_tokens"].get<size_t>(),
                                smp["rejected_text"].get<std::string>());
    }
    if (std::string(length_check) == "tokens")
      out.text += fmt::format("Length check: exact token counts with the tokenizer of {} (max {})\n", o.model_dir,
                              o.max_length);
    else if (std::string(length_check) == "estimate")
      out.text += fmt::format("Length check: estimated at 4 bytes per token (max {}); pass --model for exact counts\n",
                              o.max_length);
    if (!shape_problem.empty())
      out.text += fmt::format("[INPUT_DATASET_WRONG_SHAPE] {}: training.method {} would stop\n", shape_problem, method);
    if (!invalid_reason.empty())
      out.text += fmt::format("[INPUT_DATASET_INVALID] {}: training would stop\n", invalid_reason);
    else if (!ds.issues.empty())
      out.text += fmt::format("Training skips the {} bad rows (or stops with --strict)\n", ds.issues.size());
    else if (shape_problem.empty())
      out.text += "OK: every row is valid\n";
  }
  out.exit_code = ds.issues.empty() && invalid_reason.empty() && shape_problem.empty() ? 0 : 1;
  return out;
}
}  // namespace bp::cli

namespace {
using bp::cli::ValidateOptions;

int run_validate(const ValidateOptions& o) {
  if (o.json) bp::cli::global_options().json = true;
  const bp::cli::ValidateReport r = bp::cli::validate_report(o, bp::cli::settings());
  if (bp::cli::global_options().json)
    std::cout << r.json.dump(2) << std::endl;
  else
    std::cout << r.text;
  return r.exit_code;
}

bp::cli::RunFn setup_validate(CLI::App& sub) {
  auto o = std::make_shared<ValidateOptions>();
  sub.add_option("file", o->file, "Dataset file (JSONL, JSON array or .txt)")->required();
  sub.add_option("--format", o->format, fmt::format("Row format: {}", fmt::join(bp::dataset_format_names(), ", ")))
      ->capture_default_str();
  sub.add_option("--max-errors", o->max_errors, "Bad rows to list (all are counted)")->capture_default_str();
  sub.add_option("--max-length,--max-seq-length", o->max_length,
                 "Rows longer than this many tokens are listed: training truncates them (0: no check)")
      ->capture_default_str();
  sub.add_option("--model", o->model_dir,
                 "Model folder or hub name (org/name[@revision]) whose tokenizer and chat template give exact lengths");
  sub.add_option("--chat-template", o->chat_template,
                 "Chat template as training uses it: a Jinja file or 'chatml' (default: the model's own)");
  sub.add_option("--show", o->show, "Print the first N samples as training renders them, trained spans marked")
      ->check(CLI::NonNegativeNumber);
  bp::cli::bind_settings(sub, {"model.offline", "training.method", "data.columns", "data.tools", "data.template_kwargs",
                               "data.reasoning", "data.tool_arguments"});
  sub.add_flag("--json", o->json, "Machine-readable report");
  return [o] { return run_validate(*o); };
}

}  // namespace

BP_REGISTER_COMMAND("validate", "Check a dataset and list every bad row with its line number", setup_validate);
