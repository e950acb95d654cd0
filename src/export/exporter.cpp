// `backprop export` as a library call: the table of formats and their writers (see exporter.h).
#include "export/exporter.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "export/export_input.h"
#include "export/merged_model.h"
#include "export/ollama.h"
#include "io/atomic_file.h"
#include "model/loader.h"
#include "model/peft.h"
#include "text/chat_template_source.h"

namespace bp {

namespace fs = std::filesystem;

struct ExportJob {
  const ExportRequest& request;
  ExportInput input;
  fs::path base_dir;        // the base model of an adapter; empty for a model
  fs::path source_dir;      // where weights and tokenizer come from
  std::string ollama_name;  // the Ollama model name (registered or suggested)
  bool is_adapter() const { return input.kind == ExportInputKind::Adapter; }
  // --output when given, else `fallback`.
  fs::path output_or(const fs::path& fallback) const {
    return request.output.empty() ? fallback : fs::absolute(request.output).lexically_normal();
  }
};

namespace {

// The template a run trained with, recorded by the trainer in its adapter or model folder and in the
// run folder (chat_template.jinja); nullopt for a plain model folder or a run from before this.
std::optional<ChatTemplateSource> run_chat_template(const ExportJob& job) {
  if (!job.is_adapter() && job.input.run_dir.empty()) return std::nullopt;  // a model folder's own
  std::error_code ec;
  for (const fs::path& dir : {job.input.dir, job.input.run_dir})
    if (!dir.empty() && fs::exists(dir / "chat_template.jinja", ec)) {
      ChatTemplateSource s = read_model_chat_template(dir.string(), nlohmann::json::object());
      if (s.kind == ChatTemplateSource::Kind::ModelFile) return s;
    }
  return std::nullopt;
}

// What the exported model is served with: the run's template, else the model's own (the one
// reader, text/chat_template_source.h: chat_template.jinja wins over tokenizer_config.json).
ChatTemplateSource export_chat_template(const ExportJob& job) {
  if (auto s = run_chat_template(job)) return *s;
  return read_model_chat_template(job.source_dir.string());
}

void make_dirs(const fs::path& dir) {
  ensure_writable_dir(dir.string(), "the export folder");
}

uint64_t folder_bytes(const fs::path& dir, const std::vector<std::string>& files) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& f : files) {
    const auto s = fs::file_size(dir / f, ec);
    if (!ec) n += s;
  }
  return n;
}

// Refuses to write into the folder being read (a merged export over its own base, ...).
void check_not_input(const fs::path& out, const std::vector<fs::path>& inputs) {
  std::error_code ec;
  for (const auto& p : inputs)
    if (!p.empty() && fs::exists(out, ec) && fs::equivalent(out, p, ec))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[export] --output {} is the folder being exported from; choose another", out.string()));
}

void report_folder(const fs::path& out, const std::vector<std::string>& files, ExportReport& r) {
  for (const auto& f : files) r.written.push_back((out / f).string());
  r.result["output"] = out.string();
  r.result["files"] = files;
  r.result["bytes"] = folder_bytes(out, files);
}

void write_lora(const ExportJob& job, ExportReport& r) {
  const fs::path out = job.output_or(job.input.out_root / "adapter");
  check_not_input(out, {job.input.dir});
  const ModelConfig cfg = load_model_config(job.base_dir.string());
  LoraAdapter adapter = load_peft_adapter(job.input.dir.string(), cfg);  // throws when it does not fit the base
  // Keep the adapter's own base reference when it is a folder that exists or a hub name (portable to
  // PEFT); a stale local path becomes the base folder actually used.
  const std::string& ref = adapter.base_model_name_or_path;
  if (!is_model_dir(ref) && !(looks_like_hub_name(ref) && !fs::exists(ref)))
    adapter.base_model_name_or_path = job.base_dir.string();
  make_dirs(out);
  report_folder(out, save_peft_adapter(adapter, out.string()), r);
  r.result["lora_r"] = adapter.config.r;
  r.result["lora_alpha"] = adapter.config.alpha;
  r.next.push_back(
      fmt::format("backprop generate --model {} --adapter {} --prompt \"...\"", job.base_dir.string(), out.string()));
}

void write_merged(const ExportJob& job, ExportReport& r) {
  const fs::path out = job.output_or(job.input.merged_default);
  check_not_input(out, {job.input.dir, job.base_dir});
  ModelWeights base = load_model(job.source_dir.string());
  // Written into <out>.partial and moved into place when complete: a failure (a full disk)
  // leaves neither a half-written nor an empty folder, and an earlier export at <out> survives.
  const std::string partial = out.string() + ".partial";
  std::error_code ec;
  fs::remove_all(partial, ec);
  make_dirs(partial);
  std::vector<std::string> files;
  try {
    if (job.is_adapter()) {
      const LoraAdapter adapter = load_peft_adapter(job.input.dir.string(), base.config);
      files = export_merged_model(base, adapter, job.base_dir.string(), partial);
    } else {
      SaveModelOptions so;
      so.copy_files_from = job.input.dir.string();
      files = save_hf_model(base, partial, so);
    }
    if (const auto trained_with = run_chat_template(job)) {  // not the base model's template
      save_chat_template(partial, trained_with->text);
      if (std::find(files.begin(), files.end(), "chat_template.jinja") == files.end())
        files.push_back("chat_template.jinja");
    }
    promote_folder(partial, out.string(), "export");
  } catch (...) {
    fs::remove_all(partial, ec);
    throw;
  }
  report_folder(out, files, r);
  r.result["dtype"] = dtype_name(base.config.torch_dtype);
  r.next.push_back(fmt::format("backprop generate --model {} --prompt \"...\"", out.string()));
  r.next.push_back(fmt::format("backprop export {} --format gguf --quantization q4_k_m", out.string()));
}

void register_gguf(const ExportJob& job, const fs::path& gguf, const OllamaTemplate& tmpl, int64_t num_ctx,
                   ExportReport& r) {
  const ExportRequest& rq = job.request;
  const std::string create_cmd =
      fmt::format("ollama create {} -f {}", job.ollama_name, (gguf.parent_path() / "Modelfile").string());
  if (!rq.ollama) {
    r.next.push_back(create_cmd);
    r.next.push_back(fmt::format("ollama run {}", job.ollama_name));
    return;
  }
  OllamaOptions oo;
  oo.host = rq.ollama_host;
  oo.max_attempts = rq.ollama_max_attempts;
  try {
    const OllamaResult o = register_with_ollama(gguf.string(), job.ollama_name, tmpl, num_ctx, oo);
    r.result["ollama"] = {{"model", o.model},
                          {"digest", o.digest},
                          {"endpoint", o.endpoint},
                          {"blob_uploaded", o.blob_uploaded},
                          {"requests", o.requests}};
  } catch (Error& e) {
    if (e.code() == ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED)
      e.with_suggestion(
          fmt::format("{} The GGUF and its Modelfile are written ({}); once Ollama runs, "
                      "register them with `{}`.",
                      e.suggestion(), gguf.string(), create_cmd));
    throw;
  }
  r.next.push_back(fmt::format("ollama run {}", job.ollama_name));
}

void write_gguf(const ExportJob& job, ExportReport& r) {
  const GGUFQuant quant = job.request.quantization;
  const std::string file_name = fmt::format("model-{}.gguf", gguf_quant_name(quant));
  fs::path out = job.output_or(job.input.out_root / file_name);
  if (fs::is_directory(out) || out.filename().empty()) out = out / file_name;  // a folder: "--output dir/"
  make_dirs(out.parent_path());
  ModelWeights weights = load_model(job.source_dir.string());
  if (job.is_adapter()) {
    const LoraAdapter adapter = load_peft_adapter(job.input.dir.string(), weights.config);
    merge_lora_into(weights, adapter);  // the base copy is ours: merge in place, no second model in memory
  }
  const ChatTemplateSource chat_template = export_chat_template(job);
  const GGUFExportResult g =
      export_gguf(weights, job.source_dir.string(), quant, out.string(), job.ollama_name, chat_template.text);
  const OllamaTemplate tmpl = ollama_template_from_jinja(g.chat_template, g.end_tokens);
  // Ollama allocates the KV cache for num_ctx: cap a long-context model's default at 8192.
  const int64_t num_ctx = std::min<int64_t>(g.context_length > 0 ? g.context_length : 2048, 8192);
  const fs::path modelfile = out.parent_path() / "Modelfile";
  write_file_atomic(modelfile.string(), make_modelfile(out.string(), tmpl, num_ctx));
  r.written.push_back(out.string());
  r.written.push_back(modelfile.string());
  r.result["output"] = out.string();
  r.result["files"] = {out.filename().string(), "Modelfile"};
  r.result["bytes"] = g.bytes;
  r.result["quantization"] = g.file_type;
  r.result["tensor_count"] = g.tensor_types.size();
  r.result["modelfile"] = modelfile.string();
  r.result["chat_template_family"] = tmpl.family;
  r.result["num_ctx"] = num_ctx;
  r.result["ollama"] = nullptr;
  if (tmpl.fallback)
    r.warnings.push_back(
        "the chat template is none of the families the Modelfile knows (ChatML, Llama-3, Llama-2/Mistral, "
        "Gemma); the Modelfile uses a plain {{ .Prompt }} template");
  register_gguf(job, out, tmpl, num_ctx, r);
  r.next.push_back(fmt::format("llama-cli -m {}", out.string()));
}

const ExportFormat& find_format(const std::string& name) {
  std::string names;
  for (const ExportFormat& f : export_formats()) {
    if (name == f.name) return f;
    names += (names.empty() ? "" : ", ") + std::string(f.name);
  }
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[export] unknown format '{}'; the formats are {}", name, names));
}

}  // namespace

const std::vector<ExportFormat>& export_formats() {
  static const std::vector<ExportFormat> formats = {
      {"lora", "the PEFT adapter (adapter_config.json + adapter_model.safetensors)", true, false, write_lora},
      {"merged", "a Hugging Face model folder with the adapter merged in", false, false, write_merged},
      {"gguf", "one GGUF file for llama.cpp and Ollama, with a Modelfile", false, true, write_gguf},
  };
  return formats;
}

ExportReport run_export(const ExportRequest& rq) {
  const ExportFormat& format = find_format(rq.format);
  if (rq.ollama && !format.can_register_ollama)
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[export] --ollama registers a GGUF file; use it with --format gguf (got --format {})", rq.format));
  ExportJob job{rq, resolve_export_input(rq.input, rq.runs_root), {}, {}, rq.ollama_name};
  const ExportInput& in = job.input;
  if (format.needs_adapter && !job.is_adapter())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is a full model, not a LoRA adapter; use --format merged or --format gguf",
                            in.dir.string()));
  if (job.ollama_name.empty()) job.ollama_name = derive_ollama_model_name(in);
  if (rq.ollama) validate_ollama_model_name(job.ollama_name);  // before the long export, not after

  const auto t0 = std::chrono::steady_clock::now();
  if (job.is_adapter()) job.base_dir = resolve_base_model(in, rq.model_path, rq.resolve_model);
  job.source_dir = job.is_adapter() ? job.base_dir : in.dir;  // weights + tokenizer

  ExportReport r;
  r.note = in.note;
  r.result = {{"format", rq.format},
              {"input", in.shown},
              {"input_kind", job.is_adapter() ? "adapter" : "model"},
              {"run_dir", in.run_dir.string()},
              {"base_model", job.base_dir.string()}};
  format.write(job, r);
  r.result["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.result["next"] = r.next;
  return r;
}

}  // namespace bp
