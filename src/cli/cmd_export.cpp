// `backprop export RUN_OR_DIR --format lora|merged|gguf`: turns what training produced into
// something to ship (issue 7). Only wiring: every format is a library call.
//
//   RUN_OR_DIR  a run folder (its adapter/ or model/, see train/trainer.h), a PEFT adapter folder
//               (adapter_config.json), a Hugging Face model folder (config.json), or a checkpoint
//               folder of a finished LoRA run (checkpoints/checkpoint-N: its trainable.safetensors
//               holds PEFT-named tensors; the run's adapter_config.json gives r, alpha, targets).
//   lora        load_peft_adapter against the base's config (a shape check), save_peft_adapter.
//   merged      load_model(base) + load_peft_adapter + export_merged_model (base dtype, sharded,
//               tokenizer files copied); a full model is re-saved with save_hf_model.
//   gguf        merge_lora when an adapter, export_gguf, then always a Modelfile next to the file
//               (make_modelfile); --ollama registers it (register_with_ollama).
//
// The base model of an adapter is --model (model.path) when given, else adapter_config.json's
// base_model_name_or_path, tried as given (relative to the working folder) and relative to the
// adapter folder. Default outputs: <run>/export/model-<quant>.gguf (+ Modelfile),
// <run>/merged/, <run>/export/adapter/; for a folder outside a run, <folder>-export/ next to it.
// Every flag is a setting (export.*), so TOML and BACKPROPAGATE_EXPORT__* work too.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/gguf_export.h"
#include "io/gguf_writer.h"
#include "io/ollama.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using bp::Error;
using bp::ErrorCode;

enum class InputKind { Adapter, Model };

// A LoRA checkpoint seen as an adapter folder: adapter_config.json of the run's final adapter and
// a link to the checkpoint's trainable.safetensors (PEFT tensor names) in a temporary folder.
struct CheckpointStaging {
  fs::path dir;
  ~CheckpointStaging() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

struct ExportInput {
  InputKind kind = InputKind::Adapter;
  std::string shown;  // what the user named (a checkpoint is read through a staging folder)
  std::shared_ptr<CheckpointStaging> staging;
  fs::path dir;       // the adapter or model folder
  fs::path run_dir;   // the run folder holding it; empty outside a run
  fs::path out_root;  // default outputs: <run>/export or <dir>-export
  fs::path merged_default;
};

bool is_adapter_dir(const fs::path& p) {
  return fs::is_regular_file(p / "adapter_config.json");
}
bool is_model_dir(const fs::path& p) {
  return fs::is_regular_file(p / "config.json");
}
bool looks_like_run(const fs::path& p) {
  return fs::is_directory(p / "checkpoints") || fs::is_regular_file(p / "summary.json") ||
         fs::is_regular_file(p / "metrics.jsonl");
}

ExportInput resolve_input(const std::string& arg) {
  if (arg.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[export] pass the run folder, PEFT adapter folder or model folder to export");
  std::error_code ec;
  if (!fs::exists(arg, ec))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[export] {} does not exist", arg));
  if (!fs::is_directory(arg, ec))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is a file; pass a run folder, a PEFT adapter folder (adapter_config.json) "
                            "or a model folder (config.json)",
                            arg));
  fs::path p = fs::absolute(arg).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  ExportInput in;
  if (is_adapter_dir(p) || is_model_dir(p)) {
    in.kind = is_adapter_dir(p) ? InputKind::Adapter : InputKind::Model;
    in.dir = p;
    if (looks_like_run(p.parent_path())) in.run_dir = p.parent_path();
  } else if (is_adapter_dir(p / "adapter") || is_model_dir(p / "model")) {
    in.kind = is_adapter_dir(p / "adapter") ? InputKind::Adapter : InputKind::Model;
    in.dir = p / (in.kind == InputKind::Adapter ? "adapter" : "model");
    in.run_dir = p;
  } else if (fs::is_regular_file(p / "manifest.json") && fs::is_regular_file(p / "trainer_state.json") &&
             fs::is_regular_file(p / "trainable.safetensors") &&
             is_adapter_dir(p.parent_path().parent_path() / "adapter")) {
    // checkpoints/checkpoint-N of a LoRA run: its weights with the run's adapter_config.json.
    bp::CheckpointStore::verify(p.string());  // STATE_CHECKPOINT_INVALID when damaged
    const fs::path run = p.parent_path().parent_path();
    in.staging = std::make_shared<CheckpointStaging>();
    in.staging->dir = fs::temp_directory_path() / fmt::format("bp-export-{}-{}", ::getpid(), p.filename().string());
    fs::create_directories(in.staging->dir);
    fs::copy_file(run / "adapter" / "adapter_config.json", in.staging->dir / "adapter_config.json");
    fs::create_symlink(p / "trainable.safetensors", in.staging->dir / "adapter_model.safetensors");
    in.kind = InputKind::Adapter;
    in.dir = in.staging->dir;
    in.run_dir = run;
    in.shown = p.string();
    in.out_root = run / "export" / p.filename();
    in.merged_default = run / ("merged-" + p.filename().string());
    return in;
  } else if (fs::is_regular_file(p / "manifest.json") && fs::is_regular_file(p / "trainer_state.json")) {
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[export] {} is a training checkpoint (trainer state, not an export source); export the "
                    "run folder {} (its final adapter/ or model/), or finish the run with `backprop train "
                    "--resume {}` first",
                    p.string(), p.parent_path().parent_path().string(), p.parent_path().parent_path().string()));
  } else if (looks_like_run(p)) {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] the run folder {} has neither adapter/ nor model/: the run did not finish; "
                            "resume it with `backprop train --resume {}`",
                            p.string(), p.string()));
  } else {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is not a run folder, a PEFT adapter folder (adapter_config.json) or a model "
                            "folder (config.json)",
                            p.string()));
  }
  in.shown = in.dir.string();
  if (!in.run_dir.empty()) {
    in.out_root = in.run_dir / "export";
    in.merged_default = in.run_dir / "merged";
  } else {
    in.out_root = in.dir.parent_path() / (in.dir.filename().string() + "-export");
    in.merged_default = in.out_root / "merged";
  }
  return in;
}

// The base model folder of an adapter (see the file comment); DEP_MODEL_LOAD_FAILED otherwise.
fs::path resolve_base(const ExportInput& in, const std::string& model_flag) {
  if (!model_flag.empty()) {
    const std::string dir = bp::cli::resolve_model(model_flag);
    bp::check_model_dir(dir);
    return fs::absolute(dir).lexically_normal();
  }
  const fs::path cfg_path = in.dir / "adapter_config.json";
  std::string base;
  try {
    auto j = nlohmann::json::parse(bp::read_file(cfg_path.string()));
    if (auto it = j.find("base_model_name_or_path"); it != j.end() && it->is_string()) base = it->get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is not valid JSON: {}", cfg_path.string(), e.what()));
  }
  if (base.empty())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[export] {} names no base model (base_model_name_or_path is empty)", cfg_path.string()))
        .with_suggestion("Pass the base model folder the adapter was trained on with --model PATH.");
  for (const fs::path& c : {fs::path(base), in.dir / base})
    if (is_model_dir(c)) return fs::absolute(c).lexically_normal();
  if (bp::looks_like_hub_name(base)) return fs::path(bp::cli::resolve_model(base));  // cache, else download
  Error e(ErrorCode::DEP_MODEL_LOAD_FAILED,
          fmt::format("[export] the base model '{}' named in {} was not found (tried it relative to the working "
                      "folder and to {}); pass the base model folder with --model PATH",
                      base, cfg_path.string(), in.dir.string()),
          {{"base_model_name_or_path", base}});
  e.with_suggestion("Pass the base model folder (or its hub name org/name) the adapter was trained on with --model.");
  throw e;
}

// An Ollama model name from a folder name: lower case, [a-z0-9_.-], starting with a letter or digit.
std::string derive_model_name(const ExportInput& in) {
  std::string src = (in.run_dir.empty() ? in.dir : in.run_dir).filename().string();
  std::string name;
  for (char c : src) {
    const auto u = static_cast<unsigned char>(c);
    name += (std::isalnum(u) || c == '_' || c == '.' || c == '-') ? static_cast<char>(std::tolower(u)) : '-';
  }
  while (!name.empty() && !std::isalnum(static_cast<unsigned char>(name.front()))) name.erase(0, 1);
  if (name.size() > 60) name.resize(60);
  return name.empty() ? "backprop-model" : name;
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    const int err = ec.value();
    throw Error(err == ENOSPC || err == EDQUOT ? ErrorCode::STATE_DISK_FULL : ErrorCode::RUNTIME_EXPORT_FAILED,
                fmt::format("[export] cannot create the folder {}: {}", dir.string(), ec.message()))
        .with_suggestion("Pass a writable place with --output PATH.");
  }
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

int run_export(const std::string& input_arg) {
  using namespace bp;
  const Settings& st = cli::settings();
  const bool json = cli::global_options().json;
  const std::string format = st.get_string("export.format");
  const GGUFQuant quant = parse_gguf_quant(st.get_string("export.quantization"));
  const std::string output = st.get_string("export.output");
  const bool ollama = st.get_bool("export.ollama");
  if (ollama && format != "gguf")
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[export] --ollama registers a GGUF file; use it with --format gguf (got --format {})", format));
  if (const int64_t n = st.get_int("training.fault_inject_enospc_after_bytes"); n >= 0) {  // tests: a full disk
    io_faults().enospc_after_bytes = n;
    gguf_set_write_fault_for_testing(n, ENOSPC);
  }

  const ExportInput in = resolve_input(input_arg);
  if (format == "lora" && in.kind == InputKind::Model)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is a full model, not a LoRA adapter; use --format merged or --format gguf",
                            in.dir.string()));
  std::string ollama_name = st.get_string("export.ollama_name");
  if (ollama_name.empty()) ollama_name = derive_model_name(in);
  if (ollama) validate_ollama_model_name(ollama_name);  // before the long export, not after

  const auto t0 = std::chrono::steady_clock::now();
  fs::path base_dir;
  if (in.kind == InputKind::Adapter) base_dir = resolve_base(in, st.get_string("model.path"));
  const fs::path source_dir = in.kind == InputKind::Adapter ? base_dir : in.dir;  // weights + tokenizer

  nlohmann::json result = {{"format", format},
                           {"input", in.shown},
                           {"input_kind", in.kind == InputKind::Adapter ? "adapter" : "model"},
                           {"run_dir", in.run_dir.string()},
                           {"base_model", base_dir.string()}};
  std::vector<std::string> next;
  std::vector<std::string> written;  // paths, for the text summary

  if (format == "lora") {
    const fs::path out = output.empty() ? in.out_root / "adapter" : fs::absolute(output).lexically_normal();
    check_not_input(out, {in.dir});
    const ModelConfig cfg = load_model_config(base_dir.string());
    LoraAdapter adapter = load_peft_adapter(in.dir.string(), cfg);  // throws when it does not fit the base
    // Keep the adapter's own base reference when it is a folder that exists or a hub name (portable to
    // PEFT); a stale local path becomes the base folder actually used.
    const std::string& ref = adapter.base_model_name_or_path;
    if (!is_model_dir(ref) && !(looks_like_hub_name(ref) && !fs::exists(ref)))
      adapter.base_model_name_or_path = base_dir.string();
    make_dirs(out);
    const auto files = save_peft_adapter(adapter, out.string());
    for (const auto& f : files) written.push_back((out / f).string());
    result["output"] = out.string();
    result["files"] = files;
    result["bytes"] = folder_bytes(out, files);
    result["lora_r"] = adapter.config.r;
    result["lora_alpha"] = adapter.config.alpha;
    next.push_back(
        fmt::format("backprop generate --model {} --adapter {} --prompt \"...\"", base_dir.string(), out.string()));
  } else if (format == "merged") {
    const fs::path out = output.empty() ? in.merged_default : fs::absolute(output).lexically_normal();
    check_not_input(out, {in.dir, base_dir});
    ModelWeights base = load_model(source_dir.string());
    make_dirs(out);
    std::vector<std::string> files;
    if (in.kind == InputKind::Adapter) {
      const LoraAdapter adapter = load_peft_adapter(in.dir.string(), base.config);
      files = export_merged_model(base, adapter, base_dir.string(), out.string());
    } else {
      SaveModelOptions so;
      so.copy_files_from = in.dir.string();
      files = save_hf_model(base, out.string(), so);
    }
    for (const auto& f : files) written.push_back((out / f).string());
    result["output"] = out.string();
    result["files"] = files;
    result["bytes"] = folder_bytes(out, files);
    result["dtype"] = dtype_name(base.config.torch_dtype);
    next.push_back(fmt::format("backprop generate --model {} --prompt \"...\"", out.string()));
    next.push_back(fmt::format("backprop export {} --format gguf --quantization q4_k_m", out.string()));
  } else {  // gguf
    fs::path out = output.empty() ? in.out_root / fmt::format("model-{}.gguf", gguf_quant_name(quant))
                                  : fs::absolute(output).lexically_normal();
    if (fs::is_directory(out) || out.filename().empty())  // a folder: "--output dir/"
      out = out / fmt::format("model-{}.gguf", gguf_quant_name(quant));
    make_dirs(out.parent_path());
    ModelWeights weights = load_model(source_dir.string());
    if (in.kind == InputKind::Adapter) {
      const LoraAdapter adapter = load_peft_adapter(in.dir.string(), weights.config);
      merge_lora_into(weights, adapter);  // the base copy is ours: merge in place, no second model in memory
    }
    const GGUFExportResult g = export_gguf(weights, source_dir.string(), quant, out.string(), ollama_name);
    const OllamaTemplate tmpl = ollama_template_from_jinja(g.chat_template, g.end_tokens);
    // Ollama allocates the KV cache for num_ctx: cap a long-context model's default at 8192.
    const int64_t num_ctx = std::min<int64_t>(g.context_length > 0 ? g.context_length : 2048, 8192);
    const fs::path modelfile = out.parent_path() / "Modelfile";
    write_file_atomic(modelfile.string(), make_modelfile(out.string(), tmpl, num_ctx));
    written.push_back(out.string());
    written.push_back(modelfile.string());
    result["output"] = out.string();
    result["files"] = {out.filename().string(), "Modelfile"};
    result["bytes"] = g.bytes;
    result["quantization"] = g.file_type;
    result["tensor_count"] = g.tensor_types.size();
    result["modelfile"] = modelfile.string();
    result["chat_template_family"] = tmpl.family;
    result["num_ctx"] = num_ctx;
    result["ollama"] = nullptr;
    if (tmpl.fallback && !json)
      std::cerr << "[WARN] the chat template is none of the families the Modelfile knows (ChatML, Llama-3, "
                   "Llama-2/Mistral, Gemma); the Modelfile uses a plain {{ .Prompt }} template\n";
    const std::string create_cmd = fmt::format("ollama create {} -f {}", ollama_name, modelfile.string());
    if (ollama) {
      OllamaOptions oo;
      // export.ollama_host set anywhere (flag, env, TOML) wins; else OLLAMA_HOST, else 127.0.0.1:11434.
      if (st.source("export.ollama_host") != SettingSource::Default) oo.host = st.get_string("export.ollama_host");
      oo.max_attempts = static_cast<int>(st.get_int("export.ollama_retries")) + 1;
      try {
        const OllamaResult r = register_with_ollama(out.string(), ollama_name, tmpl, num_ctx, oo);
        result["ollama"] = {{"model", r.model},
                            {"digest", r.digest},
                            {"endpoint", r.endpoint},
                            {"blob_uploaded", r.blob_uploaded},
                            {"requests", r.requests}};
      } catch (Error& e) {
        if (e.code() == ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED)
          e.with_suggestion(
              fmt::format("{} The GGUF and its Modelfile are written ({}); once Ollama runs, "
                          "register them with `{}`.",
                          e.suggestion(), out.string(), create_cmd));
        throw;
      }
      next.push_back(fmt::format("ollama run {}", ollama_name));
    } else {
      next.push_back(create_cmd);
      next.push_back(fmt::format("ollama run {}", ollama_name));
    }
    next.push_back(fmt::format("llama-cli -m {}", out.string()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result["seconds"] = seconds;
  result["next"] = next;

  if (json) {
    std::cout << result.dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("Exported {} {} as {}{} in {:.1f} s{}\n", result["input_kind"].get<std::string>(), in.shown,
                           format, format == "gguf" ? std::string(" ") + gguf_quant_name(quant) : "", seconds,
                           base_dir.empty() ? "" : fmt::format(" (base model {})", base_dir.string()));
  for (const auto& w : written) std::cout << "  wrote " << w << "\n";
  std::cout << fmt::format("  {} in total\n", format_bytes(result["bytes"].get<uint64_t>()));
  if (result.contains("ollama") && !result["ollama"].is_null())
    std::cout << fmt::format("Registered with Ollama at {} as {}\n", result["ollama"]["endpoint"].get<std::string>(),
                             ollama_name);
  std::cout << "Next:\n";
  for (const auto& n : next) std::cout << "  " << n << "\n";
  return 0;
}

bp::cli::RunFn setup_export(CLI::App& sub) {
  auto input = std::make_shared<std::string>();
  sub.add_option("input", *input,
                 "Run folder, PEFT adapter folder, Hugging Face model folder or LoRA checkpoint folder to export")
      ->required();
  bp::cli::bind_settings(sub,
                         {"model.offline", "export.format", "export.quantization", "export.output", "export.ollama",
                          "export.ollama_name", "export.ollama_host", "export.ollama_retries", "model.path"});
  return [input] { return run_export(*input); };
}

}  // namespace

BP_REGISTER_COMMAND("export", "Export a run as a PEFT adapter, a merged HF model or a GGUF file (+ Ollama)",
                    setup_export);
