// Routes of `backprop ui` (api.h): the page and its assets, runs (list, detail, live metrics as
// server-sent events, log tail, start, stop, resume, export), datasets (list, upload, preview and
// validation report), the settings help, the memory plan and the system readings.
//
// Checks and plans come from the same code the command line uses, by running this executable
// (`backprop validate --json`, `backprop estimate-vram --json`): the page shows exactly what the
// commands say.
#include "ui/api.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <type_traits>

#include "core/file_read.h"
#include "core/nvml.h"
#include "core/settings.h"
#include "core/sysinfo.h"
#include "core/system_readings.h"
#include "train/preference.h"
#include "ui/assets.h"
#include "ui/dataset_upload.h"
#include "ui/process.h"

namespace bp::ui {

namespace fs = std::filesystem;
using httplib::Request;
using httplib::Response;
using nlohmann::json;

namespace {

// The settings the New-run form offers (help, defaults and ranges come from the settings table).
constexpr const char* kFormSettings[] = {"training.method",
                                         "training.steps",
                                         "training.epochs",
                                         "training.batch_size",
                                         "training.lr",
                                         "training.lr_scheduler",
                                         "training.warmup_steps",
                                         "training.max_seq_length",
                                         "training.mode",
                                         "lora.r",
                                         "lora.alpha",
                                         "lora.dropout",
                                         "training.eval_every",
                                         "training.save_every",
                                         "data.holdout",
                                         "training.max_memory",
                                         "training.beta",
                                         "training.dpo_loss",
                                         "training.label_smoothing",
                                         "training.orpo_lambda",
                                         "training.simpo_gamma",
                                         "training.kto_desirable_weight",
                                         "training.kto_undesirable_weight",
                                         "training.reference"};
// The run page's export form.
constexpr const char* kExportSettings[] = {"export.format", "export.quantization"};

template <size_t N>
json settings_json(const char* const (&keys)[N]) {
  json out = json::array();
  for (const char* key : keys) {
    const SettingSpec* s = find_setting(key);
    out.push_back({{"key", s->key},
                   {"flag", s->flag},
                   {"type", setting_type_name(s->type)},
                   {"default", s->default_value},
                   {"choices", s->choices},
                   {"allowed", setting_allowed_text(*s)},
                   {"help", s->help}});
    // A preference method's setting: the methods that read it (the page shows it for those only).
    json methods = json::array();
    for (TrainMethod m : {TrainMethod::Dpo, TrainMethod::Orpo, TrainMethod::Simpo, TrainMethod::Kto}) {
      const auto mine = method_setting_keys(m);
      if (std::find(mine.begin(), mine.end(), key) != mine.end()) methods.push_back(train_method_name(m));
    }
    if (!methods.empty()) out.back()["methods"] = methods;
  }
  return out;
}
// The ones estimate-vram takes (the rest do not change the memory plan).
constexpr const char* kPlanSettings[] = {"training.batch_size", "training.max_seq_length", "training.mode", "lora.r",
                                         "training.method"};

// Runs `fn`, answering what it throws: 400 for input and config errors, 507 for a full disk, else 500.
template <class Fn>
void answer_errors(Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string_view cat = e.info().category;
    const int status = (cat == "input" || cat == "config") ? 400 : e.code() == ErrorCode::STATE_DISK_FULL ? 507 : 500;
    send_error(res, status, e.code(), e.what(), e.suggestion());
  } catch (const std::exception& e) {
    send_error(res, 500, ErrorCode::RUNTIME_INTERNAL, std::string("[ui] ") + e.what());
  }
}

template <class Fn>
auto guarded(Fn fn) {
  return [fn](const Request& req, Response& res) { answer_errors(res, [&] { fn(req, res); }); };
}

void send_json(Response& res, const json& j) {
  res.set_content(j.dump(), "application/json");
}

json parse_body(const Request& req) {
  json j = parse_json_bounded(req.body, "the request body", "ui");  // INPUT_JSON_TOO_DEEP past 256 levels
  if (!j.is_object()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] the request body must be a JSON object");
  return j;
}

// The body's field `key` as T (std::string, bool or int64_t), `fallback` when absent or null; a value
// of another JSON type is INPUT_VALIDATION_FAILED naming the field (never a 500 from a JSON cast).
template <class T>
T field(const json& body, const std::string& key, T fallback) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  const char* want = std::is_same_v<T, std::string> ? "a string"
                     : std::is_same_v<T, bool>      ? "true or false"
                                                    : "an integer";
  const bool ok = std::is_same_v<T, std::string> ? it->is_string()
                  : std::is_same_v<T, bool>      ? it->is_boolean()
                                                 : it->is_number_integer();
  if (!ok)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[ui] field '{}' must be {}, not {} ({})", key, want, it->type_name(), it->dump()));
  return it->get<T>();
}

// {"training.steps": "20", ...} -> ["--steps=20", ...], each value checked against the settings
// table first (CONFIG_INVALID_SETTING names the key); only keys in `allowed` are accepted.
template <size_t N>
std::vector<std::string> setting_flags(const json& settings, const char* const (&allowed)[N]) {
  std::vector<std::string> out;
  if (settings.is_null()) return out;
  if (!settings.is_object()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] field 'settings' must be an object");
  Settings check;
  // The form holds every method's settings; only the chosen method's go to the command (which
  // refuses another method's setting rather than ignore it).
  const json method = settings.value("training.method", json("sft"));
  const std::vector<std::string> mine =
      method_setting_keys(parse_train_method(method.is_string() ? method.get<std::string>() : "sft"));
  const auto& preference = preference_setting_keys();
  for (const auto& item : settings.items()) {
    // Named copies, not a structured binding: clang 14 (the sanitizer build) cannot capture one.
    const std::string& key = item.key();
    const json& value = item.value();
    if (std::find_if(std::begin(allowed), std::end(allowed), [&](const char* k) { return key == k; }) ==
        std::end(allowed))
      continue;
    if (std::find(preference.begin(), preference.end(), key) != preference.end() &&
        std::find(mine.begin(), mine.end(), key) == mine.end())
      continue;
    if (!value.is_string() && !value.is_number() && !value.is_boolean())
      throw Error(
          ErrorCode::INPUT_VALIDATION_FAILED,
          fmt::format("[ui] field 'settings.{}' must be a string, number or boolean, not {}", key, value.type_name()));
    const std::string text = value.is_string() ? value.template get<std::string>() : value.dump();
    if (text.empty()) continue;
    check.set(key, text);
    out.push_back(fmt::format("{}={}", find_setting(key)->flag, text));
  }
  return out;
}

json run_json_command(const std::vector<std::string>& argv) {
  std::string out;
  run_capture(argv, &out);
  json j = json::parse(out, nullptr, false);
  if (!j.is_object())
    throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[ui] `{} {}` printed no JSON", argv[0], argv[1]));
  return j;
}

}  // namespace

Api::Api(const UiOptions& opt, httplib::Server& svr, std::atomic<bool>& stopping)
    : opt_(opt), stopping_(stopping), runs_(opt.runs_dir, self_exe()), data_dir_(fs::absolute(opt.data_dir)) {
  fs::create_directories(data_dir_);
  page_routes(svr);
  run_routes(svr);
  dataset_routes(svr);
  info_routes(svr);
}

void Api::page_routes(httplib::Server& svr) {
  svr.Get("/", [this](const Request&, Response& res) {
    const Asset* a = find_asset("index.html");
    std::string html(a->data);
    // Without auth there is no session to end: no "Log out" button.
    const auto form = html.find("<form method=\"post\" action=\"/logout\"");
    const auto end = html.find("</form>", form);
    if (!opt_.credentials.enabled() && form != std::string::npos && end != std::string::npos)
      html.erase(form, end + 7 - form);
    res.set_content(html, "text/html; charset=utf-8");
  });
  // Whether logins are on (the page script may ask; the page itself comes without Log out then).
  svr.Get("/api/session", [this](const Request&, Response& res) {
    send_json(res, {{"auth", opt_.credentials.enabled()}});
  });
  svr.Get(R"(/assets/([A-Za-z0-9_.-]+))", [](const Request& req, Response& res) {
    const Asset* a = find_asset(req.matches[1].str());
    if (a == nullptr || a->name == "login.html" || a->name == "index.html") {
      send_error(res, 404, ErrorCode::INPUT_VALIDATION_FAILED, "[ui] no such asset");
      return;
    }
    res.set_content(std::string(a->data), content_type_for(a->name));
  });
}

void Api::run_routes(httplib::Server& svr) {
  svr.Get("/api/runs", guarded([this](const Request&, Response& res) { send_json(res, runs_.list()); }));
  svr.Get(R"(/api/runs/([^/]+))",
          guarded([this](const Request& req, Response& res) { send_json(res, runs_.detail(req.matches[1])); }));
  svr.Get(R"(/api/runs/([^/]+)/log)", guarded([this](const Request& req, Response& res) {
            res.set_content(runs_.log_tail(req.matches[1], 64 << 10), "text/plain; charset=utf-8");
          }));
  svr.Get(R"(/api/runs/([^/]+)/events)", guarded([this](const Request& req, Response& res) {
            const std::string id = req.matches[1];
            runs_.detail(id);  // throws for a bad or unknown run before the stream starts
            // A reconnecting page continues from the last event id it saw (or ?from=).
            std::string from = req.get_header_value("Last-Event-ID");
            if (from.empty()) from = req.get_param_value("from");
            auto offset = std::make_shared<size_t>(0);
            if (!from.empty() && from.size() < 19 && from.find_first_not_of("0123456789") == std::string::npos)
              *offset = std::stoull(from);
            std::shared_ptr<void> slot = take_stream_slot(req.remote_addr, res);
            if (!slot) return;
            res.set_chunked_content_provider(
                "text/event-stream", [this, id, offset, slot](size_t, httplib::DataSink& sink) {
                  try {
                    return stream_events(id, offset.get(), sink);
                  } catch (const std::exception&) {  // the run folder went away: end the stream
                    sink.done();
                    return true;
                  }
                });
          }));
  svr.Post("/api/runs", guarded([this](const Request& req, Response& res) {
             const json body = parse_body(req);
             const std::string model = field<std::string>(body, "model", "");
             if (model.empty()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] choose a model folder");
             const fs::path data = resolve_inside(data_dir_, field<std::string>(body, "dataset", ""));
             std::vector<std::string> args = {"--model=" + model, "--data=" + data.string()};
             for (auto& f : setting_flags(body.value("settings", json()), kFormSettings)) args.push_back(f);
             send_json(res, {{"launch_id", runs_.start_train(args)}});
           }));
  svr.Post(R"(/api/runs/([^/]+)/stop)",
           guarded([this](const Request& req, Response& res) { send_json(res, runs_.stop(req.matches[1])); }));
  svr.Post(R"(/api/runs/([^/]+)/resume)", guarded([this](const Request& req, Response& res) {
             const json body = req.body.empty() ? json::object() : parse_body(req);
             send_json(res, {{"launch_id", runs_.resume(req.matches[1], field<int64_t>(body, "steps", 0))}});
           }));
  svr.Post(R"(/api/runs/([^/]+)/export)", guarded([this](const Request& req, Response& res) {
             const json body = parse_body(req);
             Settings check;  // format and quantization are checked against the settings table
             check.set("export.format", field<std::string>(body, "format", "lora"));
             check.set("export.quantization", field<std::string>(body, "quantization", "f16"));
             const bool ollama = field<bool>(body, "ollama", false);
             send_json(res, {{"launch_id", runs_.start_export(req.matches[1], check.get_string("export.format"),
                                                              check.get_string("export.quantization"), ollama)}});
           }));
  svr.Get(R"(/api/launches/([0-9a-f]+))",
          guarded([this](const Request& req, Response& res) { send_json(res, runs_.launch(req.matches[1])); }));
}

std::shared_ptr<void> Api::take_stream_slot(const std::string& client, Response& res) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  int& mine = streams_by_client_[client];
  if (mine >= kMaxStreamsPerClient || streams_total_ >= kMaxStreams) {
    const bool per_client = mine >= kMaxStreamsPerClient;
    if (mine == 0) streams_by_client_.erase(client);
    send_error(res, per_client ? 429 : 503, ErrorCode::INPUT_VALIDATION_FAILED,
               per_client ? fmt::format("[ui] this client already has {} live run streams open (the limit)",
                                        kMaxStreamsPerClient)
                          : fmt::format("[ui] the UI already serves {} live run streams (the limit)", kMaxStreams));
    res.set_header("Retry-After", "10");
    return nullptr;
  }
  ++mine;
  ++streams_total_;
  // Released when the response (and with it the stream's provider) is gone, however the stream ended.
  struct Slot {
    Api* api;
    std::string client;
    ~Slot() {
      std::lock_guard<std::mutex> lock(api->streams_mu_);
      --api->streams_total_;
      if (--api->streams_by_client_[client] <= 0) api->streams_by_client_.erase(client);
    }
  };
  return std::shared_ptr<Slot>(new Slot{this, client});
}

bool Api::stream_events(const std::string& id, size_t* offset, httplib::DataSink& sink) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(opt_.stream_lifetime_s);
  for (int idle = 0; !stopping_ && sink.is_writable() && std::chrono::steady_clock::now() < end; ++idle) {
    size_t next = 0;
    auto records = runs_.metrics_since(id, *offset, &next);
    *offset = next;
    if (!records.empty()) {
      const std::string msg = fmt::format("event: metrics\nid: {}\ndata: {}\n\n", next, json(records).dump());
      if (!sink.write(msg.data(), msg.size())) return false;
    }
    if (!records.empty() || idle % 8 == 0) {
      const std::string status = "event: status\ndata: " + runs_.detail(id).dump() + "\n\n";
      if (!sink.write(status.data(), status.size())) return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  sink.done();
  return true;
}

void Api::dataset_routes(httplib::Server& svr) {
  svr.Get("/api/datasets", guarded([this](const Request&, Response& res) {
            json out = json::array();
            std::error_code ec;
            for (const auto& e : fs::directory_iterator(data_dir_, ec))
              if (e.is_regular_file() && e.path().filename().string()[0] != '.')
                out.push_back({{"name", e.path().filename().string()}, {"bytes", e.file_size()}});
            send_json(res, out);
          }));
  svr.Put(R"(/api/datasets/([^/]+))", [this](const Request& req, Response& res, const httplib::ContentReader& reader) {
    answer_errors(res, [&] { upload_dataset(data_dir_, opt_.max_upload_bytes, req, res, reader); });
  });
  svr.Get(R"(/api/datasets/([^/]+)/preview)", guarded([this](const Request& req, Response& res) {
            const fs::path file = resolve_inside(data_dir_, req.matches[1]);
            if (!fs::is_regular_file(file))
              throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND, fmt::format("[ui] no dataset {}", file.string()));
            json rows = json::array();
            std::ifstream in(file);
            std::string line;
            while (rows.size() < 5 && std::getline(in, line))
              if (!line.empty()) rows.push_back(line.size() > 2000 ? line.substr(0, 2000) + " ..." : line);
            json report = run_json_command({self_exe(), "validate", file.string(), "--json", "--max-errors", "20"});
            send_json(res, {{"name", file.filename().string()}, {"rows", rows}, {"validate", report}});
          }));
}

void Api::info_routes(httplib::Server& svr) {
  svr.Get("/api/settings",
          guarded([](const Request&, Response& res) { send_json(res, settings_json(kFormSettings)); }));
  // The run page's export choices come from the same registry rows `backprop export` reads.
  svr.Get("/api/export-settings",
          guarded([](const Request&, Response& res) { send_json(res, settings_json(kExportSettings)); }));
  svr.Post("/api/estimate", guarded([](const Request& req, Response& res) {
             const json body = parse_body(req);
             const std::string model = field<std::string>(body, "model", "");
             if (model.empty()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[ui] choose a model folder");
             std::vector<std::string> argv = {self_exe(), "estimate-vram", "--json", "--model=" + model};
             const json settings = body.value("settings", json());
             for (auto& f : setting_flags(settings, kPlanSettings)) argv.push_back(f);
             // The run's memory budget is the plan's limit (estimate-vram takes it as --vram-gb).
             const std::string budget =
                 settings.is_object() ? field<std::string>(settings, "training.max_memory", "auto") : "auto";
             if (budget != "auto" && budget != "none" && !budget.empty())
               argv.push_back(fmt::format(
                   "--vram-gb={:.17g}",
                   static_cast<double>(parse_byte_size(budget, "training.max_memory")) / (1024.0 * 1024.0 * 1024.0)));
             json plan = run_json_command(argv);
             if (plan.contains("code")) res.status = 400;
             send_json(res, plan);
           }));
  // The same readings the safety monitor acts on (train/safety_monitor.h): MemAvailable and the
  // cgroup, hwmon / thermal-zone temperatures, NVML for GPUs; "not available" with the reason
  // where a reading does not exist, never a placeholder.
  svr.Get("/api/system", guarded([this](const Request&, Response& res) {
            const CpuInfo cpu = cpu_info();
            const MemInfo mem = mem_info();
            const CudaStatus cuda = cuda_status();
            Nvml nvml(opt_.nvml_library);
            const std::vector<GpuReading> readings = nvml.read();
            const MemoryReading mr = read_memory(opt_.system_root);
            json temps = json::array();
            for (const auto& t : read_cpu_temperatures(opt_.system_root))
              temps.push_back({{"sensor", t.sensor}, {"celsius", t.celsius}});
            json gpus = json::array();
            for (const auto& g : readings) {
              json gj = {{"index", g.index},
                         {"name", ""},
                         {"bytes_total", g.memory_total_bytes},
                         {"bytes_free", g.memory_total_bytes - std::min(g.memory_total_bytes, g.memory_used_bytes)},
                         {"temperature_c", g.celsius},
                         {"throttle", g.throttle_text()}};
              for (const auto& d : cuda.devices)
                if (d.index == static_cast<int>(g.index)) gj["name"] = d.name;
              gpus.push_back(gj);
            }
            if (gpus.empty())  // no NVML reading: what CUDA itself reports, without a temperature
              for (const auto& d : cuda.devices)
                gpus.push_back({{"index", d.index},
                                {"name", d.name},
                                {"bytes_total", d.bytes_total},
                                {"bytes_free", d.bytes_free},
                                {"temperature_c", nullptr}});
            std::string gpu_reason;
            if (gpus.empty())
              gpu_reason = nvml.status() == Nvml::Status::Broken ? "NVML failed: " + nvml.why()
                           : !cuda.why_unavailable.empty()       ? cuda.why_unavailable
                                                                 : "no GPU (" + nvml.why() + ")";
            send_json(
                res,
                {{"cpu",
                  {{"model", cpu.model}, {"logical_cores", cpu.logical_cores}, {"physical_cores", cpu.physical_cores}}},
                 {"ram", {{"bytes_total", mem.bytes_total}, {"bytes_available", mem.bytes_available}}},
                 {"cgroup", mr.cgroup_limited
                                ? json{{"bytes_max", mr.cgroup_max_bytes}, {"bytes_current", mr.cgroup_current_bytes}}
                                : json(nullptr)},
                 {"memory_limit", mr.limit_text()},  // the limit or "no limit", with where it was read
                 {"temperatures", temps},
                 {"gpus", gpus},
                 {"gpu_unavailable_reason", gpu_reason}});
          }));
}

}  // namespace bp::ui
