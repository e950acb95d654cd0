// --model resolution with a download progress bar (see model_ref.h).
#include "cli/model_ref.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

#include "cli/command.h"
#include "core/redact.h"
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
}  // namespace

std::string resolve_model(const std::string& reference, hub::ModelFiles need) {
  hub::HubOptions o = hub::HubOptions::from_environment(settings().get_bool("model.offline"));
  o.need = need;
  if (!o.token.empty()) redact_add_secret(o.token);
  const bool tty = isatty(fileno(stderr)) != 0;
  std::string last_file;
  int last_decile = -1;
  o.progress = [&](const hub::DownloadProgress& p) {
    const int decile = p.bytes_total ? static_cast<int>(10 * p.bytes_done / p.bytes_total) : 10;
    if (tty) {
      std::fprintf(stderr, "\r%s\033[K%s", progress_line(p).c_str(), p.bytes_done == p.bytes_total ? "\n" : "");
    } else if (p.file != last_file || decile != last_decile) {
      std::fprintf(stderr, "%s\n", progress_line(p).c_str());
    }
    last_file = p.file;
    last_decile = decile;
  };
  hub::ModelSource s = hub::resolve_model_source(reference, o);
  if (s.from_hub)
    spdlog::info(fmt::format("--model {}: {} snapshot {} ({})", reference, s.downloaded ? "downloaded" : "cached",
                             s.commit, s.path));
  return s.path;
}

}  // namespace bp::cli
