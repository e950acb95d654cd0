// `backprop doctor [FILE|-] [--json] [--markdown]`: diagnoses an error message or a log (doctor.h).
// Reads FILE, or stdin for "-" or when no FILE is given and stdin is not a terminal. Logs larger
// than kMaxInputBytes are diagnosed from their last kMaxInputBytes (the fatal error is at the end).
// `--markdown` prints docs/troubleshooting.md.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/command.h"
#include "cli/doctor.h"
#include "core/error.h"

namespace {

constexpr size_t kMaxInputBytes = size_t{64} << 20;

struct DoctorOptions {
  std::string file;
  bool markdown = false;
};

std::string read_input(const std::string& file) {
  if (file.empty() || file == "-") {
    if (file.empty() && isatty(STDIN_FILENO))
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      "[doctor] no input: give a log file, or pipe one in (`... 2>&1 | backprop doctor -`)");
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[doctor] cannot read '{}': {}", file, std::strerror(errno)), {{"path", file}})
        .with_suggestion("Pass the path of a log or error message, or `-` to read stdin.");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bp::cli::RunFn setup_doctor(CLI::App& sub) {
  auto o = std::make_shared<DoctorOptions>();
  sub.add_option("file", o->file, "Log or error message to diagnose; `-` (or nothing, with a pipe) reads stdin");
  sub.add_flag("--markdown", o->markdown, "Print the knowledge base as Markdown (docs/troubleshooting.md)");
  return [o] {
    if (o->markdown) {
      std::cout << bp::cli::doctor::troubleshooting_markdown();
      return 0;
    }
    std::string text = read_input(o->file);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[doctor] the input{} is empty: nothing to diagnose",
                                  o->file.empty() || o->file == "-" ? "" : " '" + o->file + "'"));
    bool truncated = text.size() > kMaxInputBytes;
    std::string_view view(text);
    if (truncated) view = view.substr(text.size() - kMaxInputBytes);
    nlohmann::json report = bp::cli::doctor::diagnose(view);
    report["truncated"] = truncated;
    if (bp::cli::global_options().json) {
      std::cout << report.dump(2) << std::endl;
    } else {
      if (truncated)
        std::cout << fmt::format("(input is {} bytes; diagnosing its last {} bytes)\n", text.size(), kMaxInputBytes);
      std::cout << bp::cli::doctor::render_text(report);
    }
    return 0;
  };
}

}  // namespace

BP_REGISTER_COMMAND("doctor", "Explain an error message or log: causes, numbers, fixes", setup_doctor);
