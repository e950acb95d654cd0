// `backprop ui`: the web dashboard's HTTP server (cpp-httplib). server.cpp holds the security
// layer every request passes first, api.cpp the routes, assets.h the embedded page files.
//
// Order of checks for every request (pre-routing, before any route or asset is looked up, so an
// unauthenticated client learns nothing about which paths exist):
//   1. Host header in the allowlist (DNS rebinding): loopback (is_loopback_host), --host, ui.allowed_hosts, and
//      IP literals when listening on every interface. Else 403 RUNTIME_UI_FORBIDDEN_ORIGIN.
//   2. Origin (when sent) must be this same host:port; Sec-Fetch-Site (when sent) must be
//      same-origin or none. Else 403.
//   3. Auth (when on): session cookie, or HTTP basic; failures count towards the login limiter.
//      Else 303 to /login for a page request, 401 otherwise. Only /login and the login page's
//      style sheet are public.
// Every response carries a Content-Security-Policy without inline scripts or styles.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ui/auth.h"

namespace bp::ui {

struct UiOptions {
  std::string host = "127.0.0.1";
  int port = 7862;
  Credentials credentials;  // empty = no auth (loopback only)
  std::string runs_dir = "runs";
  std::string data_dir = "datasets";
  std::vector<std::string> allowed_hosts;
  size_t max_upload_bytes = 256u << 20;
  int max_login_failures = 5;
  int stream_lifetime_s = 60;  // ui.stream_lifetime_s: how long one run-page event stream lasts
  // The safety monitor's readings for the System page (monitor.system_root, monitor.nvml_library).
  std::string system_root;
  std::string nvml_library = "libnvidia-ml.so.1";
};

// True for the IP literals 127.0.0.0/8 and ::1 (brackets allowed) and exactly "localhost"; names
// that merely start with "127." are not loopback (DNS rebinding).
bool is_loopback_host(const std::string& host);

class UiServer {
 public:
  explicit UiServer(UiOptions options);
  ~UiServer();
  // Binds the port; throws RUNTIME_UI_PORT_IN_USE when it cannot.
  void bind();
  // Serves until stop() (from a signal handler thread or another thread).
  void serve();
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bp::ui
