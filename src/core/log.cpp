// The logger and its sinks. Both sink kinds derive from RedactingSink, whose sink_it_ redacts the
// formatted payload before the concrete sink sees it, so no sink can forget to redact.
#include "core/log.h"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/collective.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/record_file.h"
#include "core/redact.h"
#include "core/settings.h"
#include "core/uuid.h"

namespace bp::log {

namespace {

std::mutex g_run_mu;
std::string g_run_id;
bool g_run_started = false;

std::string iso_time(spdlog::log_clock::time_point tp) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(tp.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z", tm, static_cast<int>(ms % 1000));
}

std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string json_record(const spdlog::details::log_msg& msg, const std::string& text) {
  nlohmann::json j = {{"ts", iso_time(msg.time)},
                      {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                            spdlog::level::to_string_view(msg.level).size())},
                      {"run_id", run_id()},
                      {"msg", text}};
  return json_line(j);
}

// Redacts the message, then hands the clean text to write().
class RedactingSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    write(msg, redact(std::string_view(msg.payload.data(), msg.payload.size())));
  }
  virtual void write(const spdlog::details::log_msg& msg, const std::string& clean_text) = 0;
};

class ConsoleSink final : public RedactingSink {
 public:
  ConsoleSink(FILE* out, bool json, ConsoleHandler handler) : out_(out), json_(json), handler_(std::move(handler)) {}

 protected:
  void write(const spdlog::details::log_msg& msg, const std::string& text) override {
    if (handler_ && !json_) {
      handler_(static_cast<int>(msg.level), text);
      return;
    }
    std::string line;
    if (json_) {
      line = json_record(msg, text);
    } else {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count();
      std::time_t secs = static_cast<std::time_t>(ms / 1000);
      std::tm tm{};
      localtime_r(&secs, &tm);
      auto lvl = spdlog::level::to_string_view(msg.level);
      line = fmt::format("{:%H:%M:%S}.{:03d} [{}] {}\n", tm, static_cast<int>(ms % 1000),
                         std::string_view(lvl.data(), lvl.size()), text);
    }
    std::fwrite(line.data(), 1, line.size(), out_);
  }
  void flush_() override { std::fflush(out_); }

 private:
  FILE* out_;
  bool json_;
  ConsoleHandler handler_;
};

// Opens --log-file for appending without ever blocking: O_NONBLOCK makes a FIFO with no reader
// fail at once (ENXIO) instead of hanging in open(). A directory, FIFO or socket is refused with
// INPUT_FILE_NOT_REGULAR; regular files and character devices (/dev/null, a terminal) are kept.
// Returns the descriptor, or -1 with errno set.
int open_log_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644);
  const int open_errno = errno;
  struct stat st {};
  const bool have_stat = fd >= 0 ? ::fstat(fd, &st) == 0 : ::stat(path.c_str(), &st) == 0;
  if (have_stat && !S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    check_not_special_file(path, "log");  // throws, naming the file type
  }
  if (fd < 0) {
    errno = open_errno;
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// Each record goes out with one write() (a crash must not lose the lines before it) through a
// RecordFile (core/record_file.h): a failed write is said once on stderr (this sink cannot log
// through the logger it belongs to), and then in the file itself once there is room again; the
// record waits and is retried with the next one, and a loss is counted (records_lost()).
class JsonlFileSink final : public RedactingSink {
 public:
  explicit JsonlFileSink(const std::string& path) : path_(path) {
    const int fd = open_log_file(path);
    if (fd < 0)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[log] cannot open log file {}: {}", path, std::strerror(errno)), {{"path", path}});
    file_.attach(fd, path, "log file");
    file_.set_on_failure([this](const std::string& m) {
      std::fprintf(stderr, "[warning] %s\n", m.c_str());
      failure_ = m;
    });
  }
  // A whole record built by the caller (record_error_in_files), under the sink's lock.
  void write_line(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    put(line);
  }
  // Records lost so far, counting those still waiting for room.
  uint64_t records_lost() {
    std::lock_guard<std::mutex> lock(mutex_);
    file_.flush_pending();
    return file_.records_lost() + file_.records_waiting();
  }
  const std::string& path() const { return path_; }

 protected:
  void write(const spdlog::details::log_msg& msg, const std::string& text) override { put(json_record(msg, text)); }
  void flush_() override { file_.flush_pending(); }

 private:
  void put(const std::string& line) {
    file_.write(line);
    if (failure_.empty()) return;
    // The warning joins the file's own records (written once the disk has room again).
    const nlohmann::json j = {
        {"ts", iso_time(spdlog::log_clock::now())}, {"level", "warning"}, {"run_id", run_id()}, {"msg", failure_}};
    failure_.clear();
    file_.write(json_line(j));
  }
  std::string path_;
  RecordFile file_;
  std::string failure_;  // set by the first failed write, recorded right after it
};

spdlog::level::level_enum parse_level(const std::string& level) {
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  for (int i = 0; i < 7; ++i)
    if (level == kNames[i]) return static_cast<spdlog::level::level_enum>(i);
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[log] unknown log level '{}'; allowed: trace|debug|info|warn|error|off", level),
              {{"key", "logging.level"}, {"value", level}});
}

std::shared_ptr<spdlog::logger> make_logger(const LogOptions& o) {
  if (o.format != "console" && o.format != "json")
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[log] unknown log format '{}'; allowed: console|json", o.format),
                {{"key", "logging.format"}, {"value", o.format}});
  auto level = parse_level(o.level);
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<ConsoleSink>(o.console ? o.console : stderr, o.format == "json", o.console_handler));
  if (!o.file.empty()) sinks.push_back(std::make_shared<JsonlFileSink>(o.file));
  if (!o.console_level.empty()) sinks[0]->set_level(parse_level(o.console_level));
  auto logger = std::make_shared<spdlog::logger>("backprop", sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace

void init(const LogOptions& options) {
  auto logger = make_logger(options);  // throws before anything is replaced
  spdlog::set_default_logger(logger);
}

void init_from_settings(const Settings& s, ConsoleHandler console_handler) {
  set_redaction_enabled(s.get_bool("security.redact_secrets"));
  for (const auto& spec : settings_registry()) {
    if (!spec.secret) continue;
    std::string v = s.text(spec.key, /*reveal_secrets=*/true);
    size_t colon = v.find(':');
    if (spec.rule == StringRule::UserPass && colon != std::string::npos) v = v.substr(colon + 1);
    if (!v.empty()) redact_add_secret(v);
  }
  LogOptions o;
  o.level = s.get_string("logging.level");
  o.format = s.get_string("logging.format");
  o.file = s.get_string("logging.file");
  if (const LaunchInfo launch = launch_from_environment(); launch.rank > 0) {
    if (!o.file.empty()) o.file += ".rank" + std::to_string(launch.rank);
    o.console_level = "warn";
  }
  o.console_handler = std::move(console_handler);
  init(o);
}

void add_file(const std::string& path) {
  auto sink = std::make_shared<JsonlFileSink>(path);
  spdlog::default_logger()->sinks().push_back(sink);
}

void flush() {
  spdlog::default_logger()->flush();
}

std::vector<std::pair<std::string, uint64_t>> records_lost() {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const spdlog::sink_ptr& sink : spdlog::default_logger()->sinks())
    if (auto* file = dynamic_cast<JsonlFileSink*>(sink.get())) out.emplace_back(file->path(), file->records_lost());
  return out;
}

void record_error_in_files(const nlohmann::json& fields) {
  if (!spdlog::default_logger()->should_log(spdlog::level::err)) return;  // --log-level off
  nlohmann::json j = fields;                                              // already redacted (render_error_json)
  j["ts"] = iso_time(spdlog::log_clock::now());
  j["level"] = "error";
  j["run_id"] = run_id();
  j["msg"] = fmt::format("[{}] {}", fields.value("code", "?"), fields.value("message", ""));
  const std::string line = json_line(j);
  for (const spdlog::sink_ptr& sink : spdlog::default_logger()->sinks())
    if (auto* file = dynamic_cast<JsonlFileSink*>(sink.get())) file->write_line(line);
}

std::string run_id() {
  std::lock_guard<std::mutex> lock(g_run_mu);
  if (g_run_id.empty()) g_run_id = uuid4();
  return g_run_id;
}

void begin_run(const std::string& id) {
  std::lock_guard<std::mutex> lock(g_run_mu);
  if (!id.empty()) g_run_id = id;
  if (g_run_id.empty()) g_run_id = uuid4();
  g_run_started = true;
}

bool run_started() {
  std::lock_guard<std::mutex> lock(g_run_mu);
  return g_run_started;
}

}  // namespace bp::log
