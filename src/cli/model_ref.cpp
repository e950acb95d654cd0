// --model resolution with a download progress bar (see model_ref.h).
#include "cli/model_ref.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/redact.h"
#include "hub/hf_dataset.h"
#include "hub/model_source.h"

namespace bp::cli {

namespace {
std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

// "[hub] 2/5 model.safetensors [=========>          ]  48% 12.3 MiB / 25.6 MiB"
std::string progress_line(const hub::DownloadProgress& p) {
  constexpr int kWidth = 24;
  const double frac = p.bytes_total ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
  return fmt::format("[hub] {}/{} {} [{}] {:3.0f}% {} / {}", p.file_index, p.file_count, p.file, bar, frac * 100,
                     mib(p.bytes_done), mib(p.bytes_total));
}

// The hub options of a command (environment, --offline), the token redacted from every log line,
// and the download progress drawn on stderr.
hub::HubOptions hub_options_with_progress() {
  hub::HubOptions o = hub::HubOptions::from_environment(settings().get_bool("model.offline"));
  if (!o.token.empty()) redact_add_secret(o.token);
  const bool tty = isatty(fileno(stderr)) != 0;
  struct Last {
    std::string file;
    int decile = -1;
  };
  auto last = std::make_shared<Last>();  // the callback outlives this function
  o.progress = [tty, last](const hub::DownloadProgress& p) {
    const int decile = p.bytes_total ? static_cast<int>(10 * p.bytes_done / p.bytes_total) : 10;
    if (tty) {
      std::fprintf(stderr, "\r%s\033[K%s", progress_line(p).c_str(), p.bytes_done == p.bytes_total ? "\n" : "");
    } else if (p.file != last->file || decile != last->decile) {
      std::fprintf(stderr, "%s\n", progress_line(p).c_str());
    }
    last->file = p.file;
    last->decile = decile;
  };
  return o;
}

}  // namespace

std::string resolve_model(const std::string& reference, hub::ModelFiles need) {
  hub::HubOptions o = hub_options_with_progress();
  o.need = need;
  hub::ModelSource s = hub::resolve_model_source(reference, o);
  if (s.from_hub)
    spdlog::info(fmt::format("--model {}: {} snapshot {} ({})", reference, s.downloaded ? "downloaded" : "cached",
                             s.commit, s.path));
  return s.path;
}

std::string resolve_data(const std::string& reference) {
  if (!hub::is_hub_dataset_reference(reference)) return reference;
  const std::string path = hub::resolve_dataset_file(reference, hub_options_with_progress());
  spdlog::info(fmt::format("data {}: {}", reference, path));
  return path;
}

}  // namespace bp::cli
