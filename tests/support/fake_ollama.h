// Ollama fakes shared by the tests (Ollama itself cannot be installed here).
//   FakeOllama       a cpp-httplib server on 127.0.0.1 (an ephemeral port) with the blob and create
//                    endpoints as Ollama's API documentation describes them: HEAD/POST
//                    /api/blobs/sha256:<digest> (201; 400 on a digest mismatch) and POST /api/create
//                    (400 when a blob named in "files" or "adapters" was never uploaded).
//   FakeOllamaStore  Ollama's store as `ollama pull` leaves it: manifests naming sha256 blobs.
#pragma once

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/sha256.h"
#include "support/test_util.h"

namespace bp::test {

class FakeOllama {
 public:
  FakeOllama() {
    srv_.Get(R"(/api/blobs/(sha256:[0-9a-f]+))", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> l(mu_);
      res.status = blobs.count(req.matches[1]) ? 200 : 404;
    });
    srv_.Post(R"(/api/blobs/(sha256:[0-9a-f]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if ("sha256:" + sha256_hex(req.body) != req.matches[1].str()) {
        res.status = 400;
        res.set_content(R"({"error":"digest mismatch"})", "application/json");
        return;
      }
      std::lock_guard<std::mutex> l(mu_);
      blobs[req.matches[1]] = req.body.size();
      res.status = 201;
    });
    srv_.Post("/api/create", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> l(mu_);
      const auto j = nlohmann::json::parse(req.body);
      for (const char* key : {"files", "adapters"}) {
        if (!j.contains(key)) continue;
        for (const auto& digest : j[key])
          if (!blobs.count(digest.get<std::string>())) {
            res.status = 400;
            res.set_content(R"({"error":"blob not found"})", "application/json");
            return;
          }
      }
      created.push_back(j);
      res.set_content(R"({"status":"success"})", "application/json");
    });
    port = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOllama() {
    srv_.stop();
    thread_.join();
  }
  int port = 0;
  std::map<std::string, size_t> blobs;
  std::vector<nlohmann::json> created;

 private:
  httplib::Server srv_;
  std::thread thread_;
  std::mutex mu_;
};

struct FakeOllamaStore {
  TempDir root;
  std::string add_blob(const std::string& bytes) {
    const std::string hex = sha256_hex(bytes);
    std::filesystem::create_directories(root.path + "/blobs");
    std::ofstream(root.path + "/blobs/sha256-" + hex, std::ios::binary) << bytes;
    return "sha256:" + hex;
  }
  // A model with a template, a system prompt (and parameters when `params_json` is not empty).
  void add_model(const std::string& path_name, const std::string& tag, const std::string& gguf_bytes,
                 const std::string& template_text = "{{ .Prompt }}", const std::string& system = "Be brief.",
                 const std::string& params_json = "") {
    nlohmann::json layers = nlohmann::json::array();
    layers.push_back({{"mediaType", "application/vnd.ollama.image.model"}, {"digest", add_blob(gguf_bytes)}});
    layers.push_back({{"mediaType", "application/vnd.ollama.image.template"}, {"digest", add_blob(template_text)}});
    layers.push_back({{"mediaType", "application/vnd.ollama.image.system"}, {"digest", add_blob(system)}});
    if (!params_json.empty())
      layers.push_back({{"mediaType", "application/vnd.ollama.image.params"}, {"digest", add_blob(params_json)}});
    layers.push_back(
        {{"mediaType", "application/vnd.ollama.image.license"}, {"digest", "sha256:" + std::string(64, 'f')}});
    const nlohmann::json manifest = {{"schemaVersion", 2}, {"layers", layers}};
    const std::filesystem::path m =
        std::filesystem::path(root.path) / "manifests" / "registry.ollama.ai" / path_name / tag;
    std::filesystem::create_directories(m.parent_path());
    std::ofstream(m) << manifest.dump();
  }
};

}  // namespace bp::test
