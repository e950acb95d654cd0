// `backprop doctor [FILE|-] [--json] [--markdown]`: diagnoses an error message or a log (doctor.h).
// Reads FILE (a regular file: devices and FIFOs are refused), or stdin for "-" or when no FILE is
// given and stdin is not a terminal. Logs larger than kMaxInputBytes are diagnosed from their last
// kMaxInputBytes (the fatal error is at the end); only that tail is read from a file.
// `--markdown` prints docs/troubleshooting.md.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <vector>

#include "cli/command.h"
#include "cli/doctor.h"
#include "core/error.h"
#include "core/file_read.h"

namespace {

constexpr size_t kMaxInputBytes = size_t{64} << 20;
constexpr uint64_t kMaxStdinBytes = uint64_t{4} << 30;

struct DoctorOptions {
  std::string file;
  bool markdown = false;
};

using bp::cli::doctor::DoctorInput;

// Keeps the last kMaxInputBytes of a stream of chunks.
void append_tail(std::string& tail, const char* data, size_t n) {
  tail.append(data, n);
  if (tail.size() > 2 * kMaxInputBytes) tail.erase(0, tail.size() - kMaxInputBytes);
}

DoctorInput read_stdin() {
  DoctorInput in;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    in.total_bytes += static_cast<uint64_t>(n);
    // An endless stream (`< /dev/zero`) must end: a log this long is not a log.
    if (in.total_bytes > kMaxStdinBytes)
      throw bp::Error(bp::ErrorCode::INPUT_FILE_TOO_LARGE,
                      fmt::format("[doctor] stdin gave more than {} bytes; pass the log file instead", kMaxStdinBytes));
    append_tail(in.text, buf.data(), static_cast<size_t>(n));
  }
  if (in.text.size() > kMaxInputBytes) in.text.erase(0, in.text.size() - kMaxInputBytes);
  return in;
}

}  // namespace

namespace bp::cli::doctor {
DoctorInput read_input(const std::string& file) {
  if (file.empty() || file == "-") {
    if (file.empty() && isatty(STDIN_FILENO))
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      "[doctor] no input: give a log file, or pipe one in (`... 2>&1 | backprop doctor -`)");
    return read_stdin();
  }
  // A regular file only (a device such as /dev/zero never ends); of a long log, only the tail is read.
  const bp::OpenFile f = bp::open_regular_file(file, {"doctor", bp::ErrorCode::INPUT_VALIDATION_FAILED});
  DoctorInput in;
  in.total_bytes = f.size();
  const uint64_t from = f.size() > kMaxInputBytes ? f.size() - kMaxInputBytes : 0;
  in.text.resize(static_cast<size_t>(f.size() - from));
  size_t have = 0;
  while (have < in.text.size()) {
    const ssize_t n = ::pread(f.fd(), in.text.data() + have, in.text.size() - have, static_cast<off_t>(from + have));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[doctor] cannot read '{}': {}", file, std::strerror(errno)), {{"path", file}});
    if (n == 0) break;  // the file shrank
    have += static_cast<size_t>(n);
  }
  in.text.resize(have);
  return in;
}

nlohmann::json diagnose_input(const DoctorInput& input, const std::string& file) {
  const std::string& text = input.text;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[doctor] the input{} is empty: nothing to diagnose",
                                file.empty() || file == "-" ? "" : " '" + file + "'"));
  nlohmann::json report = diagnose(text);
  report["truncated"] = input.total_bytes > text.size();
  return report;
}
}  // namespace bp::cli::doctor

namespace {
using bp::cli::doctor::read_input;

bp::cli::RunFn setup_doctor(CLI::App& sub) {
  auto o = std::make_shared<DoctorOptions>();
  sub.add_option("file", o->file, "Log or error message to diagnose; `-` (or nothing, with a pipe) reads stdin");
  sub.add_flag("--markdown", o->markdown, "Print the knowledge base as Markdown (docs/troubleshooting.md)");
  return [o] {
    if (o->markdown) {
      std::cout << bp::cli::doctor::troubleshooting_markdown();
      return 0;
    }
    const DoctorInput input = read_input(o->file);
    const std::string& text = input.text;
    const nlohmann::json report = bp::cli::doctor::diagnose_input(input, o->file);
    const bool truncated = report["truncated"].get<bool>();
    if (bp::cli::global_options().json) {
      std::cout << report.dump(2) << std::endl;
    } else {
      if (truncated)
        std::cout << fmt::format("(input is {} bytes; diagnosing its last {} bytes)\n", input.total_bytes, text.size());
      std::cout << bp::cli::doctor::render_text(report);
    }
    return 0;
  };
}

}  // namespace

BP_REGISTER_COMMAND("doctor", "Explain an error message or log: causes, numbers, fixes", setup_doctor);
