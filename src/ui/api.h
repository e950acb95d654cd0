// The routes of `backprop ui` behind the security layer (server.cpp): pages, assets and the JSON
// API the page script uses. Every route here is reached only after the Host, Origin and auth
// checks passed. Errors are JSON {code, message, suggestion} with an HTTP status from the code.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ui/runs.h"
#include "ui/server.h"

namespace httplib {
class Server;
struct Response;
struct DataSink;
}  // namespace httplib

namespace bp::ui {

// A JSON error {code, message, suggestion}; the suggestion is the catalog's unless one is given.
void send_error(httplib::Response& res, int status, ErrorCode code, const std::string& message,
                const std::string& suggestion = "");

// Event streams (run pages) the server keeps open at once, per client address and overall (each
// lasts UiOptions::stream_lifetime_s): the server has 24 threads and each open stream holds one, so
// the limits keep the rest of the API answering however many pages are open.
inline constexpr int kMaxStreams = 12;
inline constexpr int kMaxStreamsPerClient = 6;

class Api {
 public:
  Api(const UiOptions& opt, httplib::Server& svr, std::atomic<bool>& stopping);

 private:
  void page_routes(httplib::Server& svr);
  void run_routes(httplib::Server& svr);
  void dataset_routes(httplib::Server& svr);
  void info_routes(httplib::Server& svr);
  // Server-sent events of run `id`: "metrics" (new metrics.jsonl records from *offset, the event id
  // is the offset after them) and "status" (the run's detail), until the client leaves, the server
  // stops or opt_.stream_lifetime_s passed (the page's EventSource reconnects with the last id).
  bool stream_events(const std::string& id, size_t* offset, httplib::DataSink& sink);
  // One of the bounded event-stream slots for `client` (each live stream holds a server thread):
  // null, with the refusal written, past kMaxStreamsPerClient for the client or kMaxStreams overall.
  std::shared_ptr<void> take_stream_slot(const std::string& client, httplib::Response& res);

  const UiOptions& opt_;
  std::atomic<bool>& stopping_;
  RunStore runs_;
  std::filesystem::path data_dir_;
  std::mutex streams_mu_;
  int streams_total_ = 0;
  std::map<std::string, int> streams_by_client_;
};

}  // namespace bp::ui
