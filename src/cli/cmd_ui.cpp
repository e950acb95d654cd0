// `backprop ui`: the web dashboard (src/ui/). Every flag is a setting of the [ui] section.
//
// Refuses to start, before binding anything (exit code 1, the error says why and what to do):
//   * --host other than loopback without --auth or --auth-file: RUNTIME_UI_AUTH_NOT_ENFORCED
//     (with the SSH-tunnel advice);
//   * --auth and --auth-file together: CONFIG_INVALID;
//   * an --auth-file that is missing, readable by others, empty or malformed:
//     RUNTIME_UI_AUTH_FILE_INVALID.
// A port in use is RUNTIME_UI_PORT_IN_USE (exit code 2: retryable, nothing wrong with the flags).
// `backprop ui --auth-file FILE --set-password USER` reads a password from stdin, stores its
// PBKDF2 hash in FILE (mode 0600) and exits.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <sstream>
#include <thread>

#include "cli/command.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/interrupt.h"
#include "io/atomic_file.h"
#include "ui/server.h"

namespace {

std::string g_set_password_user;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

bp::ui::UiOptions options_from_settings(const bp::Settings& st) {
  using namespace bp;
  ui::UiOptions o;
  o.host = st.get_string("ui.host");
  o.port = static_cast<int>(st.get_int("ui.port"));
  o.runs_dir = st.get_string("ui.runs");
  o.data_dir = st.get_string("ui.data_dir");
  o.system_root = st.get_string("monitor.system_root");
  o.nvml_library = st.get_string("monitor.nvml_library");
  o.allowed_hosts = split_commas(st.get_string("ui.allowed_hosts"));
  o.max_upload_bytes = static_cast<size_t>(st.get_int("ui.max_upload_mb")) << 20;
  o.max_login_failures = static_cast<int>(st.get_int("ui.max_login_failures"));
  o.stream_lifetime_s = static_cast<int>(st.get_int("ui.stream_lifetime_s"));
  const std::string& auth = st.get_string("ui.auth");
  const std::string& auth_file = st.get_string("ui.auth_file");
  if (!auth.empty() && !auth_file.empty())
    throw Error(ErrorCode::CONFIG_INVALID, "[ui] give --auth or --auth-file, not both");
  if (!auth.empty()) o.credentials = ui::Credentials::from_user_pass(auth);
  if (!auth_file.empty()) o.credentials = ui::Credentials::from_file(auth_file);
  if (!o.credentials.enabled() && !ui::is_loopback_host(o.host))
    throw Error(ErrorCode::RUNTIME_UI_AUTH_NOT_ENFORCED,
                fmt::format("[ui] refusing to listen on {} without authentication: anyone who can reach this "
                            "machine could start processes and read your data",
                            o.host),
                {{"host", o.host}});
  return o;
}

int set_password(const std::string& auth_file) {
  using namespace bp;
  if (auth_file.empty())
    throw Error(ErrorCode::CONFIG_INVALID, "[ui] --set-password needs --auth-file FILE to write to");
  if (isatty(0)) std::cerr << "Password for " << g_set_password_user << ": " << std::flush;
  std::string password;
  std::getline(std::cin, password);
  ui::set_password_in_file(auth_file, g_set_password_user, password);
  std::cerr << "Stored a hash of the password of " << g_set_password_user << " in " << auth_file << "\n";
  return 0;
}

int run_ui() {
  using namespace bp;
  const Settings& st = cli::settings();
  if (!g_set_password_user.empty()) return set_password(st.get_string("ui.auth_file"));
  ui::UiOptions o;
  try {
    o = options_from_settings(st);
  } catch (const Error& e) {  // a refusal to start is the user's to fix: exit code 1
    if (cli::global_options().json)
      std::cout << render_error_json(e, "").dump(2) << std::endl;
    else
      std::cerr << render_error_text(e, "");
    return 1;
  }
  // Tests: uploads meet a full disk after this many bytes (the io layer's one disk-full hook).
  if (const int64_t n = st.get_int("training.fault_inject_enospc_after_bytes"); n >= 0)
    io_faults().enospc_after_bytes = n;
  ui::UiServer server(o);
  server.bind();
  install_interrupt_handler();
  std::thread watcher([&server] {
    while (!interrupt_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
  });
  std::cerr << fmt::format("backprop ui: http://{}:{}/ (runs: {}, datasets: {}, auth: {})\n",
                           o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host, o.port, o.runs_dir,
                           o.data_dir, o.credentials.enabled() ? "on" : "off (loopback only)")
            << std::flush;
  server.serve();
  watcher.join();
  return 0;
}

bp::cli::RunFn setup_ui(CLI::App& sub) {
  bp::cli::bind_settings(sub,
                         {"ui.host", "ui.port", "ui.auth", "ui.auth_file", "ui.runs", "ui.data_dir", "ui.allowed_hosts",
                          "ui.max_upload_mb", "ui.max_login_failures", "ui.stream_lifetime_s"});
  sub.add_option("--set-password", g_set_password_user,
                 "Store a hash of a password read from stdin for this user in --auth-file, then exit");
  sub.footer(
      "Listens on 127.0.0.1 by default. To use it from another machine keep it there and tunnel: "
      "ssh -L 7862:127.0.0.1:7862 HOST, then open http://127.0.0.1:7862/. Listening on another address needs "
      "--auth user:pass or --auth-file FILE.");
  return run_ui;
}

}  // namespace

BP_REGISTER_COMMAND("ui", "Web dashboard: start, watch, stop, resume and export runs (127.0.0.1:7862)", setup_ui);
