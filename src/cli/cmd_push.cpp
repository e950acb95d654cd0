// `backprop push INPUT --repo org/name [--format lora|merged|gguf|gguf-lora] [--private]
// [--revision BRANCH]`: exports INPUT as `backprop export` does and commits the export with a
// generated model card to a Hugging Face hub repository (export/hub_push.h, hub/hf_upload.h).
// Only wiring: settings become a PushRequest, the report is printed as text or --json. The token
// comes from HF_TOKEN or the login file, as downloads do, and is never printed: it is registered
// with the redactor that every log sink and printed error goes through.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "cli/command.h"
#include "cli/export_request.h"
#include "core/error.h"
#include "core/redact.h"
#include "export/hub_push.h"

namespace bp::cli {

PushRequest push_request(const Settings& st, const std::string& input, const std::string& repo) {
  PushRequest rq;
  rq.export_request = export_request(st, input);
  rq.hub = hub::HubOptions::from_environment(/*offline_flag=*/false);
  if (!rq.hub.token.empty()) redact_add_secret(rq.hub.token);
  rq.upload.repo_id = repo;
  rq.upload.revision = st.get_string("export.hub_revision");
  rq.upload.private_repo = st.get_bool("export.hub_private");
  rq.upload.commit_message = st.get_string("export.hub_commit_message");
  rq.upload.max_retries = static_cast<int>(st.get_int("export.hub_retries"));
  rq.upload.retry_wait_s = st.get_float("export.hub_retry_wait_s");
  rq.upload.on_event = [](const std::string& line) { spdlog::info("[hub] " + line); };
  const bool tty = isatty(fileno(stderr)) != 0;
  auto last = std::make_shared<std::pair<std::string, int>>("", -1);
  rq.upload.progress = [tty, last](const hub::UploadProgress& p) {
    const int decile = p.bytes_total ? static_cast<int>(10 * p.bytes_done / p.bytes_total) : 10;
    if (!tty && p.file == last->first && decile == last->second) return;
    const std::string line = fmt::format("[hub] uploading {} {:3d}% {} / {}", p.file, decile * 10,
                                         format_bytes(p.bytes_done), format_bytes(p.bytes_total));
    if (tty)
      std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), p.bytes_done == p.bytes_total ? "\n" : "");
    else
      std::fprintf(stderr, "%s\n", line.c_str());
    *last = {p.file, decile};
  };
  return rq;
}

void print_push_report(const PushReport& r) {
  const nlohmann::json& j = r.result;
  std::cout << fmt::format("Pushed {} to {} (branch {}{})\n", j["format"].get<std::string>(),
                           j["repo_url"].get<std::string>(), j["revision"].get<std::string>(),
                           r.uploaded.commit_oid.empty() ? "" : ", commit " + r.uploaded.commit_oid.substr(0, 12));
  if (r.uploaded.created_repo)
    std::cout << fmt::format("  created the repository ({})\n", r.result["private"].get<bool>() ? "private" : "public");
  if (r.uploaded.created_branch) std::cout << "  created the branch\n";
  for (const auto& f : r.uploaded.regular_files) std::cout << "  committed " << f << "\n";
  for (const auto& f : r.uploaded.lfs_files)
    std::cout << "  committed " << f << " (large file"
              << (std::find(r.uploaded.lfs_skipped.begin(), r.uploaded.lfs_skipped.end(), f) !=
                          r.uploaded.lfs_skipped.end()
                      ? ", already on the hub)\n"
                      : ")\n");
  for (const auto& f : r.uploaded.ignored) std::cout << "  left out " << f << " (the hub ignores it)\n";
  if (r.uploaded.parts_resumed > 0)
    std::cout << fmt::format("  resumed: {} parts uploaded earlier were not sent again\n", r.uploaded.parts_resumed);
  std::cout << fmt::format("  {} sent, model card {}\n", format_bytes(r.uploaded.bytes_sent), r.card_path);
  if (!r.uploaded.commit_url.empty()) std::cout << "  " << r.uploaded.commit_url << "\n";
}

}  // namespace bp::cli

namespace {

struct PushArgs {
  std::string input, repo;
};

int push_command(const PushArgs& a) {
  using namespace bp;
  const PushRequest rq = cli::push_request(cli::settings(), a.input, a.repo);
  const PushReport r = run_push(rq);
  if (!r.exported.note.empty()) std::cerr << r.exported.note << "\n";
  if (cli::global_options().json) {
    std::cout << r.result.dump(2) << std::endl;
    return 0;
  }
  for (const auto& w : r.exported.warnings) std::cerr << "[WARN] " << w << "\n";
  cli::print_push_report(r);
  return 0;
}

bp::cli::RunFn setup_push(CLI::App& sub) {
  auto a = std::make_shared<PushArgs>();
  sub.add_option("input", a->input,
                 "Run folder (or the folder given to train --output, or a run id), PEFT adapter folder or Hugging Face "
                 "model folder to push")
      ->required();
  sub.add_option("--repo", a->repo, "Hugging Face repository to push to (org/name); made when it does not exist")
      ->required();
  bp::cli::bind_settings(
      sub, {"export.format", "export.quantization", "export.output", "model.path", "export.hub_private",
            "export.hub_revision", "export.hub_commit_message", "export.hub_retries", "export.hub_retry_wait_s"});
  return [a] { return push_command(*a); };
}

}  // namespace

BP_REGISTER_COMMAND("push", "Export a run and upload it with a generated model card to a Hugging Face hub repository",
                    setup_push);
