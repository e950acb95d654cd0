// HTTP for the hub client (see hf_http.h).
#include "hub/hf_http.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <string>

#include "build_info.h"
#include "io/atomic_file.h"

namespace bp::hub {

namespace {
constexpr int kMaxRedirects = 10;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// An absolute URL for a Location header relative to `base`.
std::string resolve_location(const std::string& base, const std::string& location) {
  if (location.rfind("http://", 0) == 0 || location.rfind("https://", 0) == 0) return location;
  const auto [origin, path] = split_url(base);
  if (!location.empty() && location[0] == '/') return origin + location;
  return origin + path.substr(0, path.rfind('/') + 1) + location;
}

httplib::Client make_client(const std::string& origin, int timeout_s) {
  httplib::Client c(origin);
  c.set_connection_timeout(timeout_s, 0);
  c.set_read_timeout(timeout_s, 0);
  c.set_follow_location(false);
  c.set_keep_alive(false);
  return c;
}

// The token goes to the endpoint's own origin only, never to a CDN it redirects to.
httplib::Headers request_headers(const std::string& origin, const std::string& endpoint_origin,
                                 const std::string& token) {
  httplib::Headers h = {{"User-Agent", std::string("backprop/") + BP_VERSION}};
  if (!token.empty() && origin == endpoint_origin) h.emplace("Authorization", "Bearer " + token);
  return h;
}

// The file a download appends to: POSIX writes, so a failure keeps its errno (ENOSPC is a full
// disk, not a broken connection), and io_faults().enospc_after_bytes injects one in tests.
class PartFile {
 public:
  ~PartFile() { close(); }
  bool open(const std::string& path, bool truncate) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : O_APPEND), 0644);
    if (fd_ < 0) errno_ = errno;
    return fd_ >= 0;
  }
  bool write(const char* data, size_t n) {
    while (n > 0) {
      size_t chunk = n;
      IoFaults& f = io_faults();
      if (f.enospc_after_bytes >= 0) {
        if (f.enospc_after_bytes == 0) {
          errno_ = f.fail_errno;
          return false;
        }
        chunk = std::min<size_t>(chunk, static_cast<size_t>(f.enospc_after_bytes));
        f.enospc_after_bytes -= static_cast<int64_t>(chunk);
      }
      const ssize_t w = ::write(fd_, data, chunk);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        errno_ = w < 0 ? errno : EIO;
        return false;
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int error() const { return errno_; }

 private:
  int fd_ = -1;
  int errno_ = 0;
};

HttpReply too_many_redirects(const std::string& url) {
  HttpReply r;
  r.url = url;
  r.error = "more than 10 redirects";
  return r;
}

void copy_headers(const httplib::Headers& from, HttpReply& to) {
  for (const auto& [k, v] : from) to.headers[lower(k)] = v;
}
}  // namespace

std::string HttpReply::header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

std::pair<std::string, std::string> split_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  const auto path_start = scheme_end == std::string::npos ? url.find('/') : url.find('/', scheme_end + 3);
  if (path_start == std::string::npos) return {url, "/"};
  return {url.substr(0, path_start), url.substr(path_start)};
}

std::string url_quote(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

HubHttp::HubHttp(std::string endpoint, std::string token, int timeout_s)
    : endpoint_origin_(split_url(endpoint).first), token_(std::move(token)), timeout_s_(timeout_s) {}

namespace {
// Adds the server-given headers (an LFS action's), replacing ours of the same name.
void add_headers(httplib::Headers& h, const std::map<std::string, std::string>& extra) {
  for (const auto& [k, v] : extra) {
    for (auto it = h.begin(); it != h.end();) it = lower(it->first) == lower(k) ? h.erase(it) : std::next(it);
    h.emplace(k, v);
  }
}

HttpReply reply_of(const httplib::Result& r, const std::string& url) {
  HttpReply reply;
  reply.url = url;
  if (!r) {
    reply.error = httplib::to_string(r.error());
    return reply;
  }
  reply.status = r->status;
  copy_headers(r->headers, reply);
  reply.body = r->body;
  return reply;
}
}  // namespace

HttpReply HubHttp::request(const std::string& method, const std::string& url, bool follow_absolute) const {
  std::string current = url;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const auto [origin, path] = split_url(current);
    httplib::Client c = make_client(origin, timeout_s_);
    httplib::Headers h = request_headers(origin, endpoint_origin_, token_);
    const httplib::Result r = method == "HEAD" ? c.Head(path.c_str(), h) : c.Get(path.c_str(), h);
    HttpReply reply = reply_of(r, current);
    if (!r) return reply;
    if (!is_redirect(r->status) || reply.header("location").empty()) return reply;
    const std::string location = reply.header("location");
    const bool absolute = location.rfind("http://", 0) == 0 || location.rfind("https://", 0) == 0;
    if (!follow_absolute && absolute) return reply;  // the caller reads Location (a CDN)
    current = resolve_location(current, location);
  }
  return too_many_redirects(current);
}

HttpReply HubHttp::send(const std::string& method, const std::string& url, const std::string& body,
                        const std::string& content_type, const std::map<std::string, std::string>& headers) const {
  const auto [origin, path] = split_url(url);
  httplib::Client c = make_client(origin, timeout_s_);
  httplib::Headers h = request_headers(origin, endpoint_origin_, token_);
  add_headers(h, headers);
  const httplib::Result r = method == "PUT" ? c.Put(path.c_str(), h, body, content_type.c_str())
                                            : c.Post(path.c_str(), h, body, content_type.c_str());
  return reply_of(r, url);
}

HttpReply HubHttp::put_file_range(const std::string& url, const std::string& file, uint64_t offset, uint64_t length,
                                  const std::map<std::string, std::string>& headers) const {
  const auto [origin, path] = split_url(url);
  httplib::Client c = make_client(origin, timeout_s_);
  httplib::Headers h = request_headers(origin, endpoint_origin_, token_);
  add_headers(h, headers);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    HttpReply reply;
    reply.url = url;
    reply.error = fmt::format("cannot read {}: {}", file, std::strerror(errno));
    return reply;
  }
  std::string read_error;
  const httplib::Result r = c.Put(
      path.c_str(), h, static_cast<size_t>(length),
      [&](size_t at, size_t n, httplib::DataSink& sink) {
        char buf[1 << 16];
        const size_t want = std::min(n, sizeof(buf));
        const ssize_t got = ::pread(fd, buf, want, static_cast<off_t>(offset + at));
        if (got <= 0) {
          read_error = fmt::format("reading {} at byte {} failed: {}", file, offset + at,
                                   got < 0 ? std::strerror(errno) : "the file is shorter than it was");
          return false;
        }
        return sink.write(buf, static_cast<size_t>(got));
      },
      "application/octet-stream");
  ::close(fd);
  HttpReply reply = reply_of(r, url);
  if (!read_error.empty()) reply.error = read_error;
  return reply;
}

HttpReply HubHttp::download(const std::string& url, const std::string& file, uint64_t offset,
                            const std::function<void(uint64_t)>& on_bytes) const {
  std::string current = url;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    const auto [origin, path] = split_url(current);
    httplib::Client c = make_client(origin, timeout_s_);
    httplib::Headers h = request_headers(origin, endpoint_origin_, token_);
    if (offset > 0) h.emplace("Range", "bytes=" + std::to_string(offset) + "-");
    HttpReply reply;
    reply.url = current;
    PartFile out;
    uint64_t size = offset;
    httplib::Result r = c.Get(
        path.c_str(), h,
        [&](const httplib::Response& resp) {
          reply.status = resp.status;
          copy_headers(resp.headers, reply);
          if (resp.status == 200) size = 0;  // the server ignored Range: start the file again
          if (resp.status != 200 && resp.status != 206) return false;
          return out.open(file, size == 0);
        },
        [&](const char* data, size_t n) {
          if (!out.write(data, n)) return false;
          size += n;
          if (on_bytes) on_bytes(size);
          return true;
        });
    out.close();
    if (out.error() != 0) {
      reply.write_errno = out.error();
      reply.error = fmt::format("writing {} failed: {}", file, std::strerror(out.error()));
      return reply;
    }
    if (reply.status != 0 && is_redirect(reply.status) && !reply.header("location").empty()) {
      current = resolve_location(current, reply.header("location"));
      continue;
    }
    if (!r && (reply.status == 200 || reply.status == 206 || reply.status == 0))
      reply.error = httplib::to_string(r.error());
    return reply;
  }
  return too_many_redirects(current);
}

}  // namespace bp::hub
