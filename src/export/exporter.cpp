// `backprop export` as a library call: the table of formats and their writers (see exporter.h).
#include "export/exporter.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/file_read.h"
#include "export/export_input.h"
#include "export/gguf_lora.h"
#include "export/merged_model.h"
#include "export/ollama.h"
#include "io/atomic_file.h"
#include "io/gguf_reader.h"
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
    if (request.output.empty()) return fallback;
    const fs::path p = fs::absolute(request.output).lexically_normal();  // "dir/" keeps its empty filename
    return p.filename() == "." ? p.parent_path() : p;
  }
  // The same as a folder: no trailing separator (dir/ and dir are one folder).
  fs::path folder_output_or(const fs::path& fallback) const {
    const fs::path p = output_or(fallback);
    return p.filename().empty() ? p.parent_path() : p;
  }
};

namespace {

// The template a run trained with, recorded by the trainer in its adapter or model folder and in the
// run folder (chat_template.jinja); nullopt for a plain model folder or a run from before this.
std::optional<ChatTemplateSource> run_chat_template(const ExportJob& job) {
  if (!job.is_adapter() && job.input.run_dir.empty()) return std::nullopt;  // a model folder's own
  for (const fs::path& dir : {job.input.dir, job.input.run_dir})
    if (auto s = read_recorded_chat_template(dir.string())) return s;
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

// ---- where an export may write (exporter.h) ----------------------------------------------------

// `p` with symbolic links and "." / ".." resolved as far as it exists (the rest appended as written).
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

// Whether `p` is `root` or inside it.
bool is_within(const fs::path& p, const fs::path& root) {
  const fs::path a = resolved(p), b = resolved(root);
  auto ai = a.begin();
  for (const fs::path& part : b) {
    if (part.empty()) continue;  // a trailing separator
    if (ai == a.end() || *ai != part) return false;
    ++ai;
  }
  return true;
}

// What the export reads, and what each is called in an error.
std::vector<std::pair<fs::path, std::string>> read_paths(const ExportJob& job) {
  std::vector<std::pair<fs::path, std::string>> p;
  const std::string what = job.is_adapter() ? "the adapter being exported" : "the model being exported";
  if (!job.input.shown.empty()) p.emplace_back(job.input.shown, what);
  if (!job.input.dir.empty()) p.emplace_back(job.input.dir, what);
  if (!job.input.run_dir.empty()) p.emplace_back(job.input.run_dir, "the run being exported");
  if (!job.base_dir.empty()) p.emplace_back(job.base_dir, "the base model");
  if (const std::string gguf = gguf_base_file(job.source_dir.string()); !gguf.empty())
    p.emplace_back(gguf, "the base model's GGUF file");
  return p;
}

[[noreturn]] void refuse_output(const fs::path& out, const std::string& why) {
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[export] --output {} {}", out.string(), why))
      .with_suggestion(
          "Choose another --output (a new or empty folder, or a new file name), or leave it out for the default "
          "place beside the input; nothing was written.");
}

// A folder export (lora, merged) writes `out` whole. `marker` is the file every export of this format
// writes (adapter_config.json, config.json). Returns whether an earlier export there is replaced.
bool check_folder_output(const fs::path& out, const ExportJob& job, const char* marker) {
  for (const auto& [p, what] : read_paths(job))
    if (is_within(p, out))
      refuse_output(out, fmt::format("{} {}; the export would replace it", is_within(out, p) ? "is" : "holds", what));
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (!fs::exists(st)) return false;
  if (!fs::is_directory(st)) refuse_output(out, "exists and is not a folder");
  std::vector<std::string> others;  // what shows it is not an earlier export
  bool empty = true, has_marker = false;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    empty = false;
    const std::string name = e.path().filename().string();
    if (name == marker && e.is_regular_file(ec)) has_marker = true;
    if (!e.is_regular_file(ec)) others.push_back(name + "/");
  }
  if (ec) refuse_output(out, fmt::format("cannot be read ({})", ec.message()));
  if (empty) return false;
  if (!has_marker || !others.empty()) {
    std::string shown;
    for (size_t i = 0; i < others.size() && i < 3; ++i) shown += (i ? ", " : "") + others[i];
    refuse_output(out, fmt::format("is a folder that holds other things ({}); an export replaces its folder whole, "
                                   "so it only writes over an earlier export of this format",
                                   shown.empty() ? fmt::format("no {}", marker) : shown));
  }
  return true;
}

// A file export (gguf, gguf-lora) replaces `out`. Returns whether an earlier GGUF there is replaced.
bool check_file_output(const fs::path& out, const ExportJob& job) {
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(out, ec));
  for (const auto& [p, what] : read_paths(job)) {
    const bool folder = fs::is_directory(p, ec);
    if (is_within(p, out) || (exists && folder && is_within(out, p) && p != job.input.run_dir))
      refuse_output(out, fmt::format("{} {}; the export would replace it", folder ? "is inside" : "is", what));
  }
  if (!exists) return false;
  if (!fs::is_regular_file(out, ec)) refuse_output(out, "exists and is not a regular file");
  std::ifstream f(out, std::ios::binary);
  char magic[4] = {};
  if (!f.read(magic, 4) || std::string_view(magic, 4) != "GGUF")
    refuse_output(out, "is a file that is not a GGUF; an export only writes over an earlier GGUF");
  return true;
}

// --output as a file path: a folder given (DIR/, an existing folder, or a name without an
// extension) gets `file_name` inside it.
fs::path file_output(const ExportJob& job, const fs::path& fallback, const std::string& file_name) {
  fs::path out = job.output_or(fallback);
  std::error_code ec;
  if (out.filename().empty() || fs::is_directory(out, ec) || (!fs::exists(out, ec) && !out.has_extension()))
    out = (out.filename().empty() ? out.parent_path() : out) / file_name;
  return out;
}

// The Modelfile of a GGUF: beside it, named after it (model-q8_0.gguf: model-q8_0.Modelfile).
fs::path modelfile_for(const fs::path& gguf) {
  return gguf.parent_path() / (gguf.stem().string() + ".Modelfile");
}

void note_replaced(bool replaced, const fs::path& out, ExportReport& r) {
  r.result["replaced_earlier_export"] = replaced;
  if (replaced) r.messages.push_back(fmt::format("Replaced the earlier export at {}.", out.string()));
}

// --quantization chosen for a format that has no such choice: refused, not ignored.
void check_no_quantization(const ExportJob& job, const char* format, const char* what) {
  if (job.request.quantization_given)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[export] --quantization {} does not apply to --format {}: {}",
                            gguf_quant_name(job.request.quantization), format, what))
        .with_suggestion("Drop --quantization, or use --format gguf (or gguf-lora: f32, f16) for a quantized file.");
}

void report_folder(const fs::path& out, const std::vector<std::string>& files, ExportReport& r) {
  for (const auto& f : files) r.written.push_back((out / f).string());
  r.result["output"] = out.string();
  r.result["files"] = files;
  r.result["bytes"] = folder_bytes(out, files);
}

// Merging into a quantized GGUF base: the weights are dequantized to f32 on load (model/loader_gguf.h),
// the adapter is merged in f32 and the result written as `written_as`. Says so, once, in the output.
void note_dequantized_base(const ExportJob& job, const std::string& written_as, ExportReport& r) {
  if (!job.is_adapter()) return;
  const std::string gguf = gguf_base_file(job.source_dir.string());
  if (gguf.empty()) return;
  std::vector<std::string> types;
  GGUFReader reader(gguf);
  for (const GGUFTensorInfo& t : reader.tensors())
    if (ggml_is_quantized(t.type) && std::find(types.begin(), types.end(), ggml_type_name(t.type)) == types.end())
      types.push_back(ggml_type_name(t.type));
  if (types.empty()) return;
  std::string joined;
  for (const auto& t : types) joined += (joined.empty() ? "" : ", ") + t;
  r.messages.push_back(
      fmt::format("The base {} is quantized ({}): its weights were dequantized to f32, the adapter "
                  "merged in f32, and the result written as {}.",
                  gguf, joined, written_as));
  r.result["base_dequantized"] = {{"file", gguf}, {"types", types}, {"merged_in", "f32"}, {"written_as", written_as}};
}

void write_lora(const ExportJob& job, ExportReport& r) {
  check_no_quantization(job, "lora", "the PEFT adapter is written as trained (f32)");
  const fs::path out = job.folder_output_or(job.input.out_root / "adapter");
  const bool replaced = check_folder_output(out, job, "adapter_config.json");
  const ModelConfig cfg = load_model_config(job.base_dir.string());
  LoraAdapter adapter = load_peft_adapter(job.input.dir.string(), cfg);  // throws when it does not fit the base
  // Keep the adapter's own base reference when it is a folder that exists or a hub name (portable to
  // PEFT); a stale local path becomes the base folder actually used.
  const std::string& ref = adapter.base_model_name_or_path;
  if (!is_model_dir(ref) && !(looks_like_hub_name(ref) && !fs::exists(ref)))
    adapter.base_model_name_or_path = job.base_dir.string();
  make_dirs(out);
  report_folder(out, save_peft_adapter(adapter, out.string()), r);
  note_replaced(replaced, out, r);
  r.result["lora_r"] = adapter.config.r;
  r.result["lora_alpha"] = adapter.config.alpha;
  r.next.push_back(
      fmt::format("backprop generate --model {} --adapter {} --prompt \"...\"", job.base_dir.string(), out.string()));
}

void write_merged(const ExportJob& job, ExportReport& r) {
  check_no_quantization(job, "merged", "the merged model keeps the base model's dtype");
  const fs::path out = job.folder_output_or(job.input.merged_default);
  const bool replaced = check_folder_output(out, job, "config.json");
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
  note_replaced(replaced, out, r);
  r.result["dtype"] = dtype_name(base.config.torch_dtype);
  note_dequantized_base(job, dtype_name(base.config.torch_dtype), r);
  r.next.push_back(fmt::format("backprop generate --model {} --prompt \"...\"", out.string()));
  r.next.push_back(fmt::format("backprop export {} --format gguf --quantization q4_k_m", out.string()));
}

void register_gguf(const ExportJob& job, const fs::path& gguf, const OllamaTemplate& tmpl, int64_t num_ctx,
                   ExportReport& r) {
  const ExportRequest& rq = job.request;
  const std::string create_cmd = fmt::format("ollama create {} -f {}", job.ollama_name, modelfile_for(gguf).string());
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
  const fs::path out = file_output(job, job.input.out_root / file_name, file_name);
  const bool replaced = check_file_output(out, job);
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
  const fs::path modelfile = modelfile_for(out);
  write_file_atomic(modelfile.string(), make_modelfile(out.string(), tmpl, num_ctx));
  r.written.push_back(out.string());
  r.written.push_back(modelfile.string());
  note_replaced(replaced, out, r);
  r.result["output"] = out.string();
  r.result["files"] = {out.filename().string(), modelfile.filename().string()};
  r.result["bytes"] = g.bytes;
  r.result["quantization"] = g.file_type;
  r.result["tensor_count"] = g.tensor_types.size();
  r.result["modelfile"] = modelfile.string();
  r.result["chat_template_family"] = tmpl.family;
  r.result["num_ctx"] = num_ctx;
  r.result["ollama"] = nullptr;
  note_dequantized_base(job, gguf_quant_name(quant), r);
  if (!tmpl.warning.empty()) r.warnings.push_back(tmpl.warning);
  register_gguf(job, out, tmpl, num_ctx, r);
  r.next.push_back(fmt::format("llama-cli -m {}", out.string()));
}

// What a GGUF LoRA adapter is applied to in Ollama: the base's Ollama model (ollama.json, written
// by hub/model_source.cpp for --model ollama:NAME) with its own template and system prompt, else
// the base's GGUF file, else the base folder (which Ollama imports from safetensors).
struct AdapterBase {
  std::string from;     // FROM of the Modelfile
  std::string gguf;     // the base GGUF file ("" for an Ollama model or a folder)
  bool ollama = false;  // `from` names an Ollama model
  OllamaTemplate tmpl;  // go_template "" = the base's own
  std::string system;
  int64_t num_ctx = 0;
};

AdapterBase adapter_base(const ExportJob& job, const ModelConfig& cfg) {
  AdapterBase b;
  const fs::path kept = job.base_dir / "ollama.json";
  std::error_code ec;
  if (fs::is_regular_file(kept, ec)) {
    const nlohmann::json j = parse_json_bounded(read_file(kept.string()), kept.string(), "export");
    if (j.is_object() && j.value("name", "") != "") {
      b.ollama = true;
      b.from = j.value("name", "") + ":" + j.value("tag", "latest");
      b.tmpl.family = "the Ollama base's";
      b.tmpl.go_template = j.value("template", "");
      b.system = j.value("system", "");
      try {  // the manifest's parameters keep their stop strings
        const nlohmann::json params = nlohmann::json::parse(j.value("params", "{}"));
        if (params.contains("stop") && params["stop"].is_array())
          b.tmpl.stops = params["stop"].get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception&) {
      }
      return b;
    }
  }
  b.gguf = gguf_base_file(job.base_dir.string());
  b.from = b.gguf.empty() ? job.base_dir.string() : b.gguf;
  const ChatTemplateSource chat_template = read_model_chat_template(job.base_dir.string());
  b.tmpl = ollama_template_from_jinja(chat_template.text, read_gguf_tokenizer(job.base_dir.string(), cfg).end_tokens);
  b.num_ctx = std::min<int64_t>(cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 2048, 8192);
  return b;
}

void write_gguf_lora(const ExportJob& job, ExportReport& r) {
  const GGUFQuant quant = job.request.quantization;
  if (quant != GGUFQuant::F32 && quant != GGUFQuant::F16)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] a GGUF LoRA adapter is stored as f32 or f16 (llama.cpp applies it to any "
                            "base type); got --quantization {}",
                            gguf_quant_name(quant)));
  const std::string file_name = fmt::format("adapter-{}.gguf", gguf_quant_name(quant));
  const fs::path out = file_output(job, job.input.out_root / file_name, file_name);
  const bool replaced = check_file_output(out, job);
  const ModelConfig cfg = load_model_config(job.base_dir.string());
  const AdapterBase base = adapter_base(job, cfg);
  if (job.request.ollama && !base.ollama && base.gguf.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] --ollama with --format gguf-lora needs a GGUF or Ollama base model (--model "
                            "FILE.gguf or ollama:NAME); the base {} is a Hugging Face folder: use --format gguf "
                            "(the merged model) instead",
                            job.base_dir.string()));
  const LoraAdapter adapter = load_peft_adapter(job.input.dir.string(), cfg);  // throws when it does not fit
  make_dirs(out.parent_path());
  const GGUFLoraResult g = export_gguf_lora(adapter, cfg, quant == GGUFQuant::F32 ? GGMLType::F32 : GGMLType::F16,
                                            out.string(), job.ollama_name);
  const fs::path modelfile = modelfile_for(out);
  write_file_atomic(modelfile.string(), make_modelfile(base.from, base.tmpl, base.num_ctx, out.string(), base.system));
  r.written.push_back(out.string());
  r.written.push_back(modelfile.string());
  note_replaced(replaced, out, r);
  r.result["output"] = out.string();
  r.result["files"] = {out.filename().string(), modelfile.filename().string()};
  r.result["bytes"] = g.bytes;
  r.result["quantization"] = gguf_quant_name(quant);
  r.result["tensor_count"] = g.tensor_count;
  r.result["lora_alpha"] = g.alpha;
  r.result["modelfile"] = modelfile.string();
  r.result["ollama_from"] = base.from;
  if (!base.tmpl.warning.empty()) r.warnings.push_back(base.tmpl.warning);
  r.result["ollama"] = nullptr;
  const std::string create_cmd = fmt::format("ollama create {} -f {}", job.ollama_name, modelfile.string());
  if (!job.request.ollama) {
    r.next.push_back(create_cmd);
  } else {
    OllamaCreate c;
    c.model_name = job.ollama_name;
    (base.ollama ? c.from : c.gguf_path) = base.from;
    c.adapter_path = out.string();
    c.tmpl = base.tmpl;
    c.system = base.system;
    c.num_ctx = base.num_ctx;
    OllamaOptions oo;
    oo.host = job.request.ollama_host;
    oo.max_attempts = job.request.ollama_max_attempts;
    try {
      const OllamaResult o = create_ollama_model(c, oo);
      r.result["ollama"] = {{"model", o.model},       {"from", base.from},
                            {"digest", o.digest},     {"adapter_digest", o.adapter_digest},
                            {"endpoint", o.endpoint}, {"blob_uploaded", o.blob_uploaded},
                            {"requests", o.requests}};
    } catch (Error& e) {
      if (e.code() == ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED)
        e.with_suggestion(
            fmt::format("{} The adapter and its Modelfile are written ({}); once Ollama runs, "
                        "register them with `{}`.",
                        e.suggestion(), out.string(), create_cmd));
      throw;
    }
  }
  r.next.push_back(fmt::format("ollama run {}", job.ollama_name));
  if (!base.gguf.empty()) r.next.push_back(fmt::format("llama-cli -m {} --lora {}", base.gguf, out.string()));
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
      {"gguf-lora", "the adapter as a GGUF LoRA file (llama.cpp --lora, Ollama ADAPTER), with a Modelfile", true, true,
       write_gguf_lora},
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
