// The security layer and life cycle of the `backprop ui` server (server.h says what is checked and
// in which order); the routes live in api.cpp.
#include "ui/server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "ui/api.h"
#include "ui/assets.h"

namespace bp::ui {

namespace {

constexpr const char* kCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
constexpr const char* kCookie = "bp_session";

bool is_ip_literal(const std::string& h) {
  if (h.empty()) return false;
  if (h.front() == '[') return true;  // IPv6 in a Host header
  return h.find_first_not_of("0123456789.") == std::string::npos;
}

// "name" of a Host header "name:port" / "[v6]:port".
std::string host_name(const std::string& host_header) {
  if (!host_header.empty() && host_header.front() == '[') {
    const auto close = host_header.find(']');
    return close == std::string::npos ? host_header : host_header.substr(0, close + 1);
  }
  return host_header.substr(0, host_header.find(':'));
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string cookie_value(const httplib::Request& req, const std::string& name) {
  const std::string cookies = req.get_header_value("Cookie");
  size_t pos = 0;
  while (pos < cookies.size()) {
    size_t end = cookies.find(';', pos);
    if (end == std::string::npos) end = cookies.size();
    std::string part = cookies.substr(pos, end - pos);
    part.erase(0, part.find_first_not_of(' '));
    if (part.rfind(name + "=", 0) == 0) return part.substr(name.size() + 1);
    pos = end + 1;
  }
  return {};
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  std::string h = lower(host);
  if (h == "localhost") return true;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  // Only IP literals count: a name such as 127.attacker.example resolves wherever its owner likes.
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;  // 127.0.0.0/8
  in6_addr v6{};
  return ::inet_pton(AF_INET6, h.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

void send_error(httplib::Response& res, int status, ErrorCode code, const std::string& message,
                const std::string& suggestion) {
  const ErrorInfo& info = error_info(code);
  res.status = status;
  res.set_content(nlohmann::json{{"code", info.name},
                                 {"message", message},
                                 {"suggestion", suggestion.empty() ? std::string(info.suggestion) : suggestion}}
                      .dump(),
                  "application/json");
}

struct UiServer::Impl {
  UiOptions opt;
  httplib::Server svr;
  Sessions sessions;
  LoginLimiter limiter;
  std::unique_ptr<Api> api;
  std::atomic<bool> stopping{false};
  int bound_port = 0;

  explicit Impl(UiOptions o) : opt(std::move(o)), limiter(opt.max_login_failures) {}

  bool host_allowed(const std::string& host_header) const {
    const std::string name = lower(host_name(host_header));
    if (name.empty()) return false;
    if (is_loopback_host(name)) return true;
    const std::string bind = lower(opt.host);
    if (name == bind || "[" + bind + "]" == name) return true;
    for (const auto& h : opt.allowed_hosts)
      if (lower(h) == name) return true;
    const bool wildcard = bind == "0.0.0.0" || bind == "::" || bind.empty();
    return wildcard && is_ip_literal(name);
  }

  bool origin_allowed(const httplib::Request& req) const {
    const std::string site = req.get_header_value("Sec-Fetch-Site");
    if (!site.empty() && site != "same-origin" && site != "none") return false;
    if (!req.has_header("Origin")) return true;
    const std::string origin = lower(req.get_header_value("Origin"));
    const std::string host = lower(req.get_header_value("Host"));
    return origin == "http://" + host || origin == "https://" + host;
  }

  // True when the request carries a valid session or basic credentials; writes the refusal otherwise.
  bool authenticated(const httplib::Request& req, httplib::Response& res) {
    if (!opt.credentials.enabled()) return true;
    const std::string token = cookie_value(req, kCookie);
    if (!token.empty() && sessions.valid(token)) return true;
    const std::string authz = req.get_header_value("Authorization");
    if (authz.rfind("Basic ", 0) == 0) {
      const std::string pair = base64_decode(authz.substr(6));
      const auto colon = pair.find(':');
      const std::string user = pair.substr(0, colon);
      if (!limiter.begin(req.remote_addr, user)) {
        send_error(res, 429, ErrorCode::RUNTIME_UI_LOGIN_RATE_LIMITED,
                   "[ui] too many failed logins for this user name from this address");
        return false;
      }
      const bool ok = colon != std::string::npos && opt.credentials.check(user, pair.substr(colon + 1));
      limiter.finish(req.remote_addr, user, ok);
      if (ok) return true;
    }
    const bool page = req.method == "GET" && req.get_header_value("Accept").find("text/html") != std::string::npos;
    if (page) {
      res.status = 303;
      res.set_header("Location", "/login");
    } else {
      send_error(res, 401, ErrorCode::RUNTIME_UI_UNAUTHORIZED, "[ui] log in first (session cookie or basic auth)");
    }
    return false;
  }

  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res) {
    res.set_header("Content-Security-Policy", kCsp);
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Referrer-Policy", "same-origin");  // no-referrer would make form POSTs send "Origin: null"
    res.set_header("Cache-Control", "no-store");
    if (!host_allowed(req.get_header_value("Host"))) {
      send_error(res, 403, ErrorCode::RUNTIME_UI_FORBIDDEN_ORIGIN,
                 fmt::format("[ui] Host '{}' is not allowed", req.get_header_value("Host")));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!origin_allowed(req)) {
      send_error(res, 403, ErrorCode::RUNTIME_UI_FORBIDDEN_ORIGIN, "[ui] cross-site request refused");
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool is_public = req.path == "/login" || req.path == "/assets/style.css";
    if (!is_public && !authenticated(req, res)) return httplib::Server::HandlerResponse::Handled;
    // A chunked body has no length to check up front and httplib would keep all of it in memory:
    // only dataset uploads (streamed to disk, counted against the limit) take one.
    const bool upload = req.method == "PUT" && req.path.rfind("/api/datasets/", 0) == 0;
    if (!upload && lower(req.get_header_value("Transfer-Encoding")).find("chunked") != std::string::npos) {
      send_error(res, 411, ErrorCode::INPUT_VALIDATION_FAILED,
                 "[ui] send this request with a Content-Length (only dataset uploads may be chunked)");
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  // httplib answers 413 for a body over max_upload_bytes and for a form body
  // (application/x-www-form-urlencoded, curl -d's default) over its fixed 8 KiB: say which.
  void explain_too_large(const httplib::Request& req, httplib::Response& res) const {
    const std::string type = lower(req.get_header_value("Content-Type"));
    const std::string length = req.get_header_value("Content-Length");
    const bool over_limit = !length.empty() && length.size() < 20 &&
                            length.find_first_not_of("0123456789") == std::string::npos &&
                            std::stoull(length) > opt.max_upload_bytes;
    if (type.rfind("application/x-www-form-urlencoded", 0) == 0 && !over_limit) {
      send_error(res, 415, ErrorCode::INPUT_VALIDATION_FAILED,
                 fmt::format("[ui] the body ({} bytes) was sent as a form (Content-Type: "
                             "application/x-www-form-urlencoded, curl -d's default); forms are read only up to "
                             "8192 bytes. Send JSON with -H 'Content-Type: application/json' (a dataset: curl -T FILE)",
                             length.empty() ? "?" : length));
      return;
    }
    send_error(
        res, 413, ErrorCode::RUNTIME_UI_UPLOAD_TOO_LARGE,
        fmt::format("[ui] the body is {} bytes, over the limit of {} bytes (--max-upload-mb {})",
                    length.empty() ? "more than that" : length, opt.max_upload_bytes, opt.max_upload_bytes >> 20));
  }

  void login_routes() {
    svr.Get("/login", [this](const httplib::Request&, httplib::Response& res) { login_page(res, ""); });
    svr.Post("/login", [this](const httplib::Request& req, httplib::Response& res) {
      if (!opt.credentials.enabled()) {
        res.status = 303;
        res.set_header("Location", "/");
        return;
      }
      const std::string user = req.get_param_value("user");
      if (!limiter.begin(req.remote_addr, user)) {
        res.status = 429;
        login_page(res, "Too many failed logins for this user name: wait 5 minutes.");
        return;
      }
      const bool ok = opt.credentials.check(user, req.get_param_value("password"));
      limiter.finish(req.remote_addr, user, ok);
      if (!ok) {
        res.status = 401;
        login_page(res, "Wrong user name or password.");
        return;
      }
      res.set_header("Set-Cookie", fmt::format("{}={}; HttpOnly; SameSite=Strict; Path=/", kCookie,
                                               sessions.create(req.get_param_value("user"))));
      res.status = 303;
      res.set_header("Location", "/");
    });
    svr.Post("/logout", [this](const httplib::Request& req, httplib::Response& res) {
      sessions.remove(cookie_value(req, kCookie));
      res.set_header("Set-Cookie", fmt::format("{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0", kCookie));
      res.status = 303;
      res.set_header("Location", "/login");
    });
  }

  void login_page(httplib::Response& res, const std::string& message) {
    const Asset* a = find_asset("login.html");
    std::string html(a ? a->data : "");
    const auto at = html.find("{{message}}");
    if (at != std::string::npos) html.replace(at, 11, message);  // fixed texts only: no user input
    res.set_content(html, "text/html; charset=utf-8");
  }
};

UiServer::UiServer(UiOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& m = *impl_;
  m.svr.new_task_queue = [] { return new httplib::ThreadPool(24); };
  m.svr.set_payload_max_length(m.opt.max_upload_bytes);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second server (or another
  // user's program) bind the same port and take over connections instead of failing.
  m.svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof yes);
  });
  m.svr.set_pre_routing_handler(
      [&m](const httplib::Request& req, httplib::Response& res) { return m.pre_route(req, res); });
  m.svr.set_error_handler([&m](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      m.explain_too_large(req, res);
    else if (res.status == 404)
      send_error(res, 404, ErrorCode::INPUT_VALIDATION_FAILED, "[ui] no such page");
  });
  m.login_routes();
  m.api = std::make_unique<Api>(m.opt, m.svr, m.stopping);
}

UiServer::~UiServer() = default;

void UiServer::bind() {
  Impl& m = *impl_;
  if (!m.svr.bind_to_port(m.opt.host, m.opt.port))
    throw Error(
        ErrorCode::RUNTIME_UI_PORT_IN_USE,
        fmt::format("[ui] cannot listen on {}:{} (in use, or not an address of this machine)", m.opt.host, m.opt.port),
        {{"host", m.opt.host}, {"port", m.opt.port}});
  m.bound_port = m.opt.port;
}

void UiServer::serve() {
  impl_->svr.listen_after_bind();
}

void UiServer::stop() {
  impl_->stopping = true;
  impl_->svr.stop();
}

int UiServer::port() const {
  return impl_->bound_port;
}

}  // namespace bp::ui
