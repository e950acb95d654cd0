// `backprop export INPUT --format lora|merged|gguf|gguf-lora`: turns what training produced into something
// to ship (issue 7). Only wiring: settings become an ExportRequest (export/exporter.h, which also
// says what INPUT may be and where outputs go), and the report is printed as text or --json.
// Every flag is a setting (export.*), so TOML and BACKPROPAGATE_EXPORT__* work too.
// --push-to-hub org/name then commits the export to the Hugging Face hub as `backprop push` does
// (cmd_push.cpp, export/hub_push.h); --json adds the push's result under "push".
#include <cerrno>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/command.h"
#include "cli/export_request.h"
#include "cli/model_ref.h"
#include "core/error.h"
#include "export/exporter.h"
#include "export/hub_push.h"
#include "io/atomic_file.h"
#include "io/gguf_writer.h"

namespace bp::cli {
ExportRequest export_request(const Settings& st, const std::string& input_arg) {
  if (const int64_t n = st.get_int("training.fault_inject_enospc_after_bytes"); n >= 0)  // tests: a full disk
    io_faults().enospc_after_bytes = n;
  ExportRequest rq;
  rq.input = input_arg;
  rq.format = st.get_string("export.format");
  rq.quantization = parse_gguf_quant(st.get_string("export.quantization"));
  rq.quantization_given = st.source("export.quantization") != SettingSource::Default;
  rq.output = st.get_string("export.output");
  rq.model_path = st.get_string("model.path");
  rq.resolve_model = [](const std::string& ref) { return bp::cli::resolve_model(ref); };
  rq.runs_root = st.get_string("training.output");
  rq.ollama = st.get_bool("export.ollama");
  rq.ollama_name = st.get_string("export.ollama_name");
  // export.ollama_host set anywhere (flag, env, TOML) wins; else OLLAMA_HOST, else 127.0.0.1:11434.
  if (st.source("export.ollama_host") != SettingSource::Default) rq.ollama_host = st.get_string("export.ollama_host");
  rq.ollama_max_attempts = static_cast<int>(st.get_int("export.ollama_retries")) + 1;
  return rq;
}
}  // namespace bp::cli

namespace {

int export_command(const std::string& input_arg) {
  using namespace bp;
  const bool json = cli::global_options().json;
  const ExportRequest rq = cli::export_request(cli::settings(), input_arg);
  const std::string push_to = cli::settings().get_string("export.push_to_hub");
  std::optional<PushReport> pushed;
  if (!push_to.empty()) pushed = run_push(cli::push_request(cli::settings(), input_arg, push_to));
  const ExportReport r = pushed ? pushed->exported : run_export(rq);
  const nlohmann::json& result = r.result;
  if (!r.note.empty()) std::cerr << r.note << "\n";
  if (json) {
    nlohmann::json out = result;
    if (pushed) {  // the export's own result, with the push's beside it
      out["push"] = pushed->result;
      out["push"].erase("export");
    }
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  for (const auto& w : r.warnings) std::cerr << "[WARN] " << w << "\n";
  const std::string base = result["base_model"].get<std::string>();
  std::cout << fmt::format("Exported {} {} as {}{} in {:.1f} s{}\n", result["input_kind"].get<std::string>(),
                           result["input"].get<std::string>(), rq.format,
                           rq.format.rfind("gguf", 0) == 0 ? std::string(" ") + gguf_quant_name(rq.quantization) : "",
                           result["seconds"].get<double>(), base.empty() ? "" : fmt::format(" (base model {})", base));
  for (const auto& m : r.messages) std::cout << m << "\n";
  for (const auto& w : r.written) std::cout << "  wrote " << w << "\n";
  std::cout << fmt::format("  {} in total\n", format_bytes(result["bytes"].get<uint64_t>()));
  if (result.contains("ollama") && !result["ollama"].is_null())
    std::cout << fmt::format("Registered with Ollama at {} as {}\n", result["ollama"]["endpoint"].get<std::string>(),
                             result["ollama"]["model"].get<std::string>());
  if (pushed) cli::print_push_report(*pushed);
  std::cout << "Next:\n";
  for (const auto& n : r.next) std::cout << "  " << n << "\n";
  return 0;
}

bp::cli::RunFn setup_export(CLI::App& sub) {
  auto input = std::make_shared<std::string>();
  sub.add_option("input", *input,
                 "Run folder (or the folder given to train --output, or a run id), PEFT adapter folder, Hugging Face "
                 "model folder or LoRA checkpoint folder to export")
      ->required();
  bp::cli::bind_settings(sub, {"model.offline", "export.format", "export.quantization", "export.output",
                               "export.ollama", "export.ollama_name", "export.ollama_host", "export.ollama_retries",
                               "model.path", "export.push_to_hub", "export.hub_private", "export.hub_revision",
                               "export.hub_commit_message", "export.hub_retries", "export.hub_retry_wait_s"});
  return [input] { return export_command(*input); };
}

}  // namespace

BP_REGISTER_COMMAND("export",
                    "Export a run as a PEFT adapter, a merged HF model, a GGUF file or a GGUF LoRA adapter (+ Ollama)",
                    setup_export);
