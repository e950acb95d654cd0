// The routes of `backprop ui` behind the security layer (server.cpp): pages, assets and the JSON
// API the page script uses. Every route here is reached only after the Host, Origin and auth
// checks passed. Errors are JSON {code, message, suggestion} with an HTTP status from the code.
#pragma once

#include <atomic>
#include <memory>
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

void send_error(httplib::Response& res, int status, ErrorCode code, const std::string& message);

class Api {
 public:
  Api(const UiOptions& opt, httplib::Server& svr, std::atomic<bool>& stopping);

 private:
  void page_routes(httplib::Server& svr);
  void run_routes(httplib::Server& svr);
  void dataset_routes(httplib::Server& svr);
  void info_routes(httplib::Server& svr);
  // Server-sent events of run `id`: "metrics" (new metrics.jsonl records from *offset) and
  // "status" (the run's detail), until the client leaves or the server stops.
  bool stream_events(const std::string& id, size_t* offset, httplib::DataSink& sink);

  const UiOptions& opt_;
  std::atomic<bool>& stopping_;
  RunStore runs_;
  std::filesystem::path data_dir_;
};

}  // namespace bp::ui
