// Registration of a GGUF file with an Ollama server over its HTTP API (protocol in export/ollama.h).
#include "export/ollama.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "io/sha256.h"

namespace bp {
namespace {

constexpr const char* kServeHint =
    "Start Ollama with `ollama serve` (or point OLLAMA_HOST at a running server), then run the export again with "
    "--ollama.";

struct Attempt {
  int status = 0;  // HTTP status, 0 when no answer
  httplib::Error error = httplib::Error::Success;
  std::string body;
};

bool retryable(const Attempt& a) {
  if (a.status == 0) return true;  // connection refused/reset, timeout
  return a.status == 429 || a.status >= 500;
}

std::string describe(const Attempt& a) {
  if (a.status == 0) return "no answer (" + httplib::to_string(a.error) + ")";
  std::string msg;
  try {
    const auto j = nlohmann::json::parse(a.body);
    if (j.is_object() && j.contains("error"))
      msg = j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump();
  } catch (const std::exception&) {
    msg = a.body.substr(0, 200);
  }
  return fmt::format("HTTP {}{}{}", a.status, msg.empty() ? "" : ": ", msg);
}

class Session {
 public:
  Session(const OllamaEndpoint& ep, const OllamaOptions& o) : ep_(ep), o_(o), cli_(ep.host, ep.port) {
    auto split = [](double s, time_t* sec, time_t* usec) {
      *sec = static_cast<time_t>(s);
      *usec = static_cast<time_t>((s - static_cast<double>(*sec)) * 1e6);
    };
    time_t s, us;
    split(o.connect_timeout_s, &s, &us);
    cli_.set_connection_timeout(s, us);
    split(o.request_timeout_s, &s, &us);
    cli_.set_read_timeout(s, us);
    cli_.set_write_timeout(s, us);
    cli_.set_keep_alive(false);
    if (!ep.user.empty()) cli_.set_basic_auth(ep.user, ep.password);
  }

  // Sends with retries; returns the last attempt (the caller judges the status).
  template <class Send>
  Attempt with_retries(const char* what, Send send) {
    Attempt a;
    for (int i = 0; i < std::max(1, o_.max_attempts); ++i) {
      if (i > 0) {
        const double wait = std::min(o_.backoff_max_s, o_.backoff_initial_s * std::pow(2.0, i - 1));
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
      ++requests;
      httplib::Result r = send(cli_);
      a = Attempt{};
      if (r) {
        a.status = r->status;
        a.body = r->body;
      } else {
        a.error = r.error();
      }
      if (!retryable(a)) return a;
    }
    last_what_ = what;
    return a;
  }

  [[noreturn]] void fail(const char* what, const Attempt& a, bool after_retries) const {
    const std::string msg =
        fmt::format("[ollama] {} at {} failed: {}{}", what, ep_.str(), describe(a),
                    after_retries ? fmt::format(" (after {} attempts)", std::max(1, o_.max_attempts)) : "");
    Error e(ErrorCode::DEP_OLLAMA_REGISTRATION_FAILED, msg, {{"endpoint", ep_.str()}, {"status", a.status}});
    if (a.status == 0) e.with_suggestion(kServeHint);
    throw e;
  }

  int requests = 0;

 private:
  OllamaEndpoint ep_;
  OllamaOptions o_;
  httplib::Client cli_;
  std::string last_what_;
};

}  // namespace

namespace {

// HEAD then (when missing) a streamed POST of `path` as a blob; returns "sha256:<hex>".
std::string ensure_blob(Session& s, const std::string& path, bool* uploaded) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[ollama] cannot read {}: {}", path, ec.message()));
  const std::string digest = "sha256:" + sha256_file_hex(path);
  const std::string blob_path = "/api/blobs/" + digest;
  // 1. Does the server have the blob already?
  Attempt head = s.with_retries("checking the blob", [&](httplib::Client& c) { return c.Head(blob_path.c_str()); });
  if (head.status != 200 && head.status != 404) s.fail("checking the blob", head, retryable(head));
  // 2. Upload it (streamed from the file).
  if (head.status == 404) {
    Attempt up = s.with_retries("uploading the GGUF blob", [&](httplib::Client& c) {
      auto file = std::make_shared<std::ifstream>(path, std::ios::binary);
      auto buf = std::make_shared<std::vector<char>>(1 << 20);
      return c.Post(
          blob_path.c_str(), static_cast<size_t>(size),
          [file, buf](size_t offset, size_t length, httplib::DataSink& sink) {
            file->seekg(static_cast<std::streamoff>(offset));
            const size_t n = std::min(length, buf->size());
            file->read(buf->data(), static_cast<std::streamsize>(n));
            if (file->gcount() <= 0) return false;
            sink.write(buf->data(), static_cast<size_t>(file->gcount()));
            return true;
          },
          "application/octet-stream");
    });
    if (up.status != 201 && up.status != 200) s.fail("uploading the GGUF blob", up, retryable(up));
    *uploaded = true;
  }
  return digest;
}

}  // namespace

OllamaResult create_ollama_model(const OllamaCreate& c, const OllamaOptions& options) {
  validate_ollama_model_name(c.model_name);
  std::string host = options.host;
  if (host.empty()) {
    const char* env = std::getenv("OLLAMA_HOST");
    host = env ? env : "";
  }
  const OllamaEndpoint ep = parse_ollama_host(host);
  for (const std::string* p : {&c.gguf_path, &c.adapter_path})
    if (!p->empty() && !std::filesystem::is_regular_file(*p))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[ollama] cannot read {}: no such file", *p));

  OllamaResult res;
  res.model = c.model_name;
  res.endpoint = ep.str();
  Session s(ep, options);
  nlohmann::json body = {{"model", c.model_name}, {"stream", false}};
  if (!c.from.empty()) body["from"] = c.from;
  if (!c.gguf_path.empty()) {
    res.digest = ensure_blob(s, c.gguf_path, &res.blob_uploaded);
    body["files"] = {{std::filesystem::path(c.gguf_path).filename().string(), res.digest}};
  }
  if (!c.adapter_path.empty()) {
    res.adapter_digest = ensure_blob(s, c.adapter_path, &res.blob_uploaded);
    body["adapters"] = {{std::filesystem::path(c.adapter_path).filename().string(), res.adapter_digest}};
  }
  if (!c.tmpl.go_template.empty()) body["template"] = c.tmpl.go_template;
  if (!c.system.empty() || !c.tmpl.default_system.empty())
    body["system"] = c.system.empty() ? c.tmpl.default_system : c.system;
  nlohmann::json params = nlohmann::json::object();
  if (!c.tmpl.stops.empty()) params["stop"] = c.tmpl.stops;
  if (c.num_ctx > 0) params["num_ctx"] = c.num_ctx;
  if (!params.empty()) body["parameters"] = params;

  // 3. Create the model from the blobs.
  const std::string text = body.dump();
  Attempt cr = s.with_retries("creating the model",
                              [&](httplib::Client& cl) { return cl.Post("/api/create", text, "application/json"); });
  if (cr.status != 200) s.fail("creating the model", cr, retryable(cr));
  try {
    const auto j = nlohmann::json::parse(cr.body);
    if (j.contains("error")) s.fail("creating the model", cr, false);
  } catch (const nlohmann::json::exception&) {
    // A non-JSON 200 is unusual but not a failure of the creation itself.
  }
  res.requests = s.requests;
  return res;
}

OllamaResult register_with_ollama(const std::string& gguf_path, const std::string& model_name, const OllamaTemplate& t,
                                  int64_t num_ctx, const OllamaOptions& options) {
  OllamaCreate c;
  c.model_name = model_name;
  c.gguf_path = gguf_path;
  c.tmpl = t;
  c.num_ctx = num_ctx;
  return create_ollama_model(c, options);
}

}  // namespace bp
