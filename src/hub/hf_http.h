// The HTTP requests the hub client makes (cpp-httplib, with OpenSSL for https), kept apart from
// the download logic so httplib.h stays out of every other file.
//
// Redirects are followed by hand, as huggingface_hub does: a HEAD on /resolve/ follows only
// relative redirects (a renamed repository: a Location without scheme and host) and reports an absolute one (the LFS
// CDN) without following it; GETs follow both. The token goes only to the endpoint's own origin, never to a CDN.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace bp::hub {

struct HttpReply {
  int status = 0;                              // 0 = no HTTP answer (see error)
  std::map<std::string, std::string> headers;  // keys lower-case
  std::string body;                            // GET only
  std::string url;                             // the URL that answered (after redirects)
  std::string error;                           // transport failure, empty when an answer came
  int write_errno = 0;                         // download(): writing the file failed (ENOSPC: disk full)
  std::string header(const std::string& lower_name) const;
};

class HubHttp {
 public:
  HubHttp(std::string endpoint, std::string token, int timeout_s);
  // GET or HEAD. follow_absolute=false stops at an absolute redirect (scheme://host/...) and returns it.
  HttpReply request(const std::string& method, const std::string& url, bool follow_absolute) const;
  // GET url appending to `file`, asking for bytes from `offset` on (Range) when offset > 0. A 200
  // answer to a Range request restarts the file from byte 0. on_bytes gets the file's new size.
  // Returns the reply (status and headers; error set when the connection broke, write_errno too
  // when writing the file failed).
  HttpReply download(const std::string& url, const std::string& file, uint64_t offset,
                     const std::function<void(uint64_t)>& on_bytes) const;
  // POST or PUT `body` (JSON, NDJSON) with `headers` added (a server-given header replaces ours of
  // the same name). Redirects are not followed: the upload API answers where it was asked.
  HttpReply send(const std::string& method, const std::string& url, const std::string& body,
                 const std::string& content_type, const std::map<std::string, std::string>& headers = {}) const;
  // PUT `length` bytes of `file` from byte `offset`, streamed from the file (an LFS upload or one
  // part of one). error is set when the file cannot be read or the connection broke.
  HttpReply put_file_range(const std::string& url, const std::string& file, uint64_t offset, uint64_t length,
                           const std::map<std::string, std::string>& headers) const;

 private:
  std::string endpoint_origin_, token_;
  int timeout_s_;
};

// "http://host:port/a/b" -> ("http://host:port", "/a/b").
std::pair<std::string, std::string> split_url(const std::string& url);
// Percent-encodes everything but unreserved characters (and '/' when keep_slash).
std::string url_quote(const std::string& s, bool keep_slash);

}  // namespace bp::hub
