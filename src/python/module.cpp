// The Python package's extension module `backpropagate._core` (issue 39): pybind11 bindings over
// the same functions the CLI's subcommands call, with no logic of their own. The Python half
// (src/python/backpropagate/*.py) turns what these return into objects.
//
//   settings    kwargs -> the settings table's keys by each row's flag (`lora_r` = --lora-r), for
//               the settings the matching command binds; validated by Settings::load exactly as the
//               CLI's flags are (CONFIG_INVALID for an unknown name, CONFIG_INVALID_SETTING for a bad
//               value)
//   train       cli::train_options_with_preset + Trainer::run, the GIL released while it works; every
//               metrics.jsonl record goes to the Python callback with the GIL taken back; a pending
//               KeyboardInterrupt (PyErr_CheckSignals) or a callback's False stops the run through the
//               CLI's Ctrl-C path (core/interrupt.h: checkpoint, then RUNTIME_TRAINING_ABORTED)
//   errors      bp::Error -> an instance of the exception class the Python half made for its code
//               (backpropagate/errors.py, generated from the catalog this module lists)
//   the rest    cli::estimate_vram_report, cli::export_request + run_export, cli::validate_report,
//               cli::generate_report, doctor's
//               read_input/diagnose_input, list_runs / find_run
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "build_info.h"
#include "cli/command.h"
#include "cli/doctor.h"
#include "cli/estimate_vram.h"
#include "cli/export_request.h"
#include "cli/generate.h"
#include "cli/train_flags.h"
#include "cli/validate.h"
#include "core/collective.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "core/settings.h"
#include "core/uuid.h"
#include "export/exporter.h"
#include "train/run_history.h"
#include "train/train_options.h"
#include "train/trainer.h"

namespace py = pybind11;

namespace {

// The interfaces' shared state (cli::settings(), what the commands' functions read) belongs to
// one call at a time.
std::mutex g_interface_mu;

// Set by backpropagate/errors.py: a callable (dict) -> exception instance. Never destroyed (the
// interpreter may be gone by the time static destructors run).
py::object* g_error_factory = nullptr;

py::object json_to_py(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

// Raises the Python exception for `e` (GIL held), naming `run_id` ("" outside a training run: the
// process-wide id of core/log.h would name an earlier run). Without a factory yet: a RuntimeError.
void set_python_error(const bp::Error& e, const std::string& run_id = "") {
  nlohmann::json j = bp::render_error_json(e, run_id);
  j["category"] = e.info().category;
  if (g_error_factory == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, j.dump().c_str());
    return;
  }
  try {
    py::object exc = (*g_error_factory)(json_to_py(j));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& err) {
    err.restore();
  }
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const bp::Error& e) {
    set_python_error(e);
  } catch (const std::filesystem::filesystem_error& e) {
    set_python_error(bp::error_from_filesystem(e));
  } catch (const std::bad_alloc& e) {
    set_python_error(
        bp::Error(bp::ErrorCode::RUNTIME_OOM_ADJACENT, std::string("[python] std::bad_alloc: ") + e.what()));
  } catch (const py::error_already_set&) {
    throw;
  } catch (const py::builtin_exception&) {
    throw;
  } catch (const std::exception& e) {
    set_python_error(bp::Error(bp::ErrorCode::RUNTIME_INTERNAL, std::string("[python] ") + e.what()));
  }
}

// Python's logging level for spdlog's (trace 0 ... critical 5).
int python_level(int spd) {
  static const int kLevels[] = {5, 10, 20, 30, 40, 50, 50};
  return spd >= 0 && spd <= 6 ? kLevels[spd] : 20;
}

// Console records to logging.getLogger("backpropagate"), with the GIL (callers never hold the GIL
// while they log: every binding below releases it before calling the library).
void log_to_python(int level, const std::string& message) {
  if (!Py_IsInitialized()) {  // the interpreter is gone (a log line from a static destructor)
    std::fprintf(stderr, "%s\n", message.c_str());
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("logging").attr("getLogger")("backpropagate").attr("log")(python_level(level), message);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("backpropagate logging");
  }
}

// ---- settings ---------------------------------------------------------------------------------

// Which settings a Python call takes: the ones the matching command binds.
// Export and Generate: their own section (export.*, generate.*); Train: what `train` binds;
// Estimate: that and what `estimate-vram` binds (--vram-gb).
enum class Command { Train, Export, Generate, Estimate };

bool takes(Command c, const bp::SettingSpec& spec) {
  if (!spec.flag[0]) return false;
  const std::string_view key = spec.key;
  if (c == Command::Export) return key.substr(0, 7) == "export.";
  if (c == Command::Generate) return key.substr(0, 9) == "generate.";
  if (bp::train_takes_setting(key)) return true;
  if (c == Command::Estimate)
    for (std::string_view k : bp::cli::kEstimateVramSettingKeys)
      if (k == key) return true;
  for (std::string_view g : bp::cli::kGlobalSettingKeys)
    if (g == key) return true;
  return false;
}

// The Python name of a setting: its flag without "--", '-' as '_'.
std::string python_name(const bp::SettingSpec& spec) {
  std::string n = std::string(spec.flag).substr(2);
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

// A Python value as the text a flag would carry.
std::string setting_text(const std::string& name, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)) return py::str(v).cast<std::string>();
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::string out;
    for (const py::handle item : v) out += (out.empty() ? "" : ",") + setting_text(name, item);
    return out;
  }
  if (py::hasattr(v, "__fspath__")) return py::str(v.attr("__fspath__")()).cast<std::string>();
  throw bp::Error(bp::ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[python] setting {}: a {} cannot be a setting's value (bool, int, float, str or a list)",
                              name, py::str(v.attr("__class__").attr("__name__")).cast<std::string>()));
}

std::vector<bp::SettingOverride> overrides_from(Command c, const py::dict& kwargs) {
  std::vector<bp::SettingOverride> out;
  for (const auto& [k, v] : kwargs) {
    const std::string name = k.cast<std::string>();
    if (v.is_none()) continue;  // None: the setting as the other layers leave it
    const bp::SettingSpec* found = nullptr;
    for (const bp::SettingSpec& spec : bp::settings_registry())
      if (takes(c, spec) && python_name(spec) == name) found = &spec;
    if (found == nullptr)
      throw bp::Error(bp::ErrorCode::CONFIG_INVALID, fmt::format("[python] unknown setting '{}'", name))
          .with_suggestion(
              "Settings are the command line's flags with '_' for '-' (lora_r=16 for --lora-r 16); "
              "help(backpropagate.Trainer) and `backprop info --env-vars` list them.");
    out.push_back({found->key, setting_text(name, v)});
  }
  return out;
}

struct PySettings {
  bp::Settings settings;
};

PySettings load_settings(const std::string& config_path, const py::dict& kwargs, const std::string& command,
                         const PySettings* base) {
  const Command c = command == "export"     ? Command::Export
                    : command == "generate" ? Command::Generate
                    : command == "estimate" ? Command::Estimate
                                            : Command::Train;
  std::vector<bp::SettingOverride> flags = overrides_from(c, kwargs);
  py::gil_scoped_release nogil;
  PySettings out;
  if (base == nullptr) {
    out.settings = bp::Settings::load(config_path, bp::current_environment(), flags);
  } else {
    out.settings = base->settings;
    for (const auto& f : flags) out.settings.set(f.key, f.text);
  }
  return out;
}

py::list settings_table() {
  py::list rows;
  for (const bp::SettingSpec& spec : bp::settings_registry()) {
    py::dict r;
    r["key"] = spec.key;
    r["flag"] = spec.flag;
    r["name"] = spec.flag[0] ? py::object(py::str(python_name(spec))) : py::object(py::none());
    r["type"] = bp::setting_type_name(spec.type);
    r["default"] = spec.default_value;
    r["allowed"] = bp::setting_allowed_text(spec);
    r["help"] = spec.help;
    r["testing"] = bp::is_testing_setting(spec);
    r["train"] = takes(Command::Train, spec);
    r["export"] = takes(Command::Export, spec);
    r["env"] = bp::setting_env_var(spec);
    rows.append(r);
  }
  return rows;
}

py::list error_catalog() {
  py::list rows;
  for (const bp::ErrorInfo& e : bp::error_catalog()) {
    py::dict r;
    r["code"] = e.name;
    r["category"] = e.category;
    r["retryable"] = bp::retryable_name(e.retryable);
    r["trigger"] = e.trigger;
    r["suggestion"] = e.suggestion;
    rows.append(r);
  }
  return rows;
}

// ---- train ------------------------------------------------------------------------------------

// SIGINT/SIGTERM as they were before the trainer put in the CLI's handler (core/interrupt.h), put
// back when the run ends so Python's own Ctrl-C works again.
class SavedSignalHandlers {
 public:
  SavedSignalHandlers() {
    sigaction(SIGINT, nullptr, &int_);
    sigaction(SIGTERM, nullptr, &term_);
  }
  ~SavedSignalHandlers() {
    sigaction(SIGINT, &int_, nullptr);
    sigaction(SIGTERM, &term_, nullptr);
  }

 private:
  struct sigaction int_ {};
  struct sigaction term_ {};
};

// A fresh run id for a new run in this process (the id is process-wide in core/log.h; the first
// run would otherwise lend it to the next). Resumed runs adopt theirs in the trainer.
std::string begin_new_run() {
  const std::string id = bp::uuid4();
  bp::log::begin_run(id);
  return id;
}

// Trains with `settings`; `on_record(json_text, total_steps)` gets every metrics.jsonl record and
// may return False to stop. Returns the summary as JSON text, or {"stopped": ...} when the callback
// stopped the run; a KeyboardInterrupt becomes KeyboardInterrupt naming the run id.
std::string train(const PySettings& s, py::object on_record) {
  bp::TrainOptions o;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(g_interface_mu);
    bp::cli::apply_global_settings(s.settings, log_to_python);
    bp::cli::mutable_settings() = s.settings;
    o = bp::cli::train_options_with_preset(/*json=*/true);
    // nproc starts mpirun from the backprop command; a Python process cannot run itself again that
    // way. Under mpirun / srun the script's processes are the ranks (training.distributed auto).
    if (const int64_t nproc = s.settings.get_int("training.nproc");
        nproc > 1 && bp::launch_from_environment().launcher.empty())
      throw bp::Error(bp::ErrorCode::CONFIG_INVALID_SETTING,
                      fmt::format("[python] nproc={} starts mpirun from the backprop command, not from Python", nproc),
                      {{"key", "training.nproc"}, {"value", nproc}})
          .with_suggestion(fmt::format("Start the script itself as {} processes: mpirun -np {} python3 SCRIPT "
                                       "(each process trains its share), or run `backprop train --nproc {}`.",
                                       nproc, nproc, nproc));
  }
  o.quiet = true;  // the Python half draws the progress
  bool keyboard = false, stopped_by_callback = false;
  std::shared_ptr<py::error_already_set> callback_error;
  bp::TrainCallbacks cb;
  cb.on_record = [&](const nlohmann::json& record, int64_t total_steps) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {  // Python's handler ran: KeyboardInterrupt, or what a handler raised
      auto err = std::make_shared<py::error_already_set>();
      if (err->matches(PyExc_KeyboardInterrupt))
        keyboard = true;
      else if (!callback_error)
        callback_error = err;
      bp::request_interrupt(SIGINT);
      return;
    }
    if (on_record.is_none() || callback_error) return;
    try {
      const py::object r = on_record(record.dump(), total_steps);
      if (r.ptr() == Py_False) {
        stopped_by_callback = true;
        bp::request_interrupt(SIGINT);
      }
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_KeyboardInterrupt))
        keyboard = true;
      else
        callback_error = std::make_shared<py::error_already_set>(std::move(e));
      bp::request_interrupt(SIGINT);
    }
  };
  bp::TrainSummary sum;
  try {
    py::gil_scoped_release nogil;
    SavedSignalHandlers saved;
    // Afterwards the logger forgets the run folder's log file (the next call must not write there).
    struct ResetLog {
      const bp::Settings& st;
      ~ResetLog() {
        try {
          bp::log::init_from_settings(st, log_to_python);  // cpu kernels stay as chosen
        } catch (...) {                                    // the run's own outcome matters more
        }
      }
    } reset_log{s.settings};
    bp::Trainer trainer(std::move(o), std::move(cb));
    sum = trainer.run();
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::RUNTIME_TRAINING_ABORTED) {
      set_python_error(e, bp::log::run_id());
      throw py::error_already_set();
    }
    if (callback_error) throw *callback_error;
    const std::string run_id = bp::log::run_id();
    if (stopped_by_callback && !keyboard)
      return nlohmann::json{{"stopped", true}, {"run_id", run_id}, {"message", e.what()}}.dump();
    const std::string msg =
        fmt::format("{} (run id {}: continue with Trainer.train(data, resume=\"{}\"))", e.what(), run_id, run_id);
    PyErr_SetString(PyExc_KeyboardInterrupt, msg.c_str());
    throw py::error_already_set();
  }
  if (callback_error) throw *callback_error;
  return sum.to_json().dump();
}

// ---- the other commands -------------------------------------------------------------------------

std::string estimate_vram(const PySettings& s) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(g_interface_mu);
  bp::cli::apply_global_settings(s.settings, log_to_python);
  bp::cli::mutable_settings() = s.settings;
  return bp::cli::estimate_vram_report(s.settings).json.dump();
}

std::string export_run(const PySettings& s, const std::string& input) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(g_interface_mu);
  bp::cli::apply_global_settings(s.settings, log_to_python);
  bp::cli::mutable_settings() = s.settings;
  // push_to_hub="org/name" (export.push_to_hub) commits the export to the hub as `export
  // --push-to-hub` does; its result goes under "push".
  const std::string push_to = s.settings.get_string("export.push_to_hub");
  std::optional<bp::PushReport> pushed;
  if (!push_to.empty()) pushed = bp::run_push(bp::cli::push_request(s.settings, input, push_to));
  const bp::ExportReport r = pushed ? pushed->exported : bp::run_export(bp::cli::export_request(s.settings, input));
  nlohmann::json j = r.result;
  if (pushed) {
    j["push"] = pushed->result;
    j["push"].erase("export");
  }
  j["written"] = r.written;
  j["next"] = r.next;
  j["warnings"] = r.warnings;
  j["messages"] = r.messages;
  j["note"] = r.note;
  return j.dump();
}

std::string validate(const PySettings& s, const bp::cli::ValidateOptions& o) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(g_interface_mu);
  bp::cli::mutable_settings() = s.settings;
  const bp::cli::ValidateReport r = bp::cli::validate_report(o, s.settings);
  nlohmann::ordered_json j = r.json;
  j["text"] = r.text;
  return j.dump();
}

std::string generate(const PySettings& s, const bp::cli::GenerateArgs& a) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(g_interface_mu);
  bp::cli::apply_global_settings(s.settings, log_to_python);
  bp::cli::mutable_settings() = s.settings;
  return bp::cli::generate_report(a, s.settings).dump();
}

std::string doctor_text(const std::string& text) {
  py::gil_scoped_release nogil;
  bp::cli::doctor::DoctorInput in;
  in.text = text;
  in.total_bytes = text.size();
  return bp::cli::doctor::diagnose_input(in, "").dump();
}

std::string doctor_file(const std::string& path) {
  py::gil_scoped_release nogil;
  return bp::cli::doctor::diagnose_input(bp::cli::doctor::read_input(path), path).dump();
}

std::string runs(const std::string& folder) {
  py::gil_scoped_release nogil;
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : bp::list_runs(folder)) j.push_back(r.to_json());
  return j.dump();
}

std::string load_run(const std::string& folder, const std::string& ref) {
  py::gil_scoped_release nogil;
  const bp::RunRecord r = bp::find_run(folder, ref);
  nlohmann::json j = r.to_json();
  j["settings"] = r.settings;
  return j.dump();
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "backpropagate's C++ library (the same one the backprop CLI runs); use the package, not this module";
  py::register_exception_translator(translate);
  m.def("version", [] { return std::string(BP_VERSION); });
  m.def("set_error_factory", [](py::object f) {
    if (g_error_factory == nullptr) g_error_factory = new py::object();
    *g_error_factory = std::move(f);
  });
  m.def("settings_table", &settings_table);
  m.def("error_catalog", &error_catalog);
  py::class_<PySettings>(m, "Settings")
      .def("to_json", [](const PySettings& s) { return s.settings.to_json().dump(); })
      .def("text", [](const PySettings& s, const std::string& key) { return s.settings.text(key); });
  m.def("load_settings", &load_settings, py::arg("config_path"), py::arg("kwargs"), py::arg("command") = "train",
        py::arg("base") = nullptr);
  m.def("begin_new_run", &begin_new_run);
  m.def("train", &train, py::arg("settings"), py::arg("on_record") = py::none());
  m.def("estimate_vram", &estimate_vram);
  m.def("export_run", &export_run);
  py::class_<bp::cli::ValidateOptions>(m, "ValidateOptions")
      .def(py::init<>())
      .def_readwrite("file", &bp::cli::ValidateOptions::file)
      .def_readwrite("format", &bp::cli::ValidateOptions::format)
      .def_readwrite("max_errors", &bp::cli::ValidateOptions::max_errors)
      .def_readwrite("max_length", &bp::cli::ValidateOptions::max_length)
      .def_readwrite("model_dir", &bp::cli::ValidateOptions::model_dir)
      .def_readwrite("chat_template", &bp::cli::ValidateOptions::chat_template)
      .def_readwrite("show", &bp::cli::ValidateOptions::show);
  py::class_<bp::cli::GenerateArgs>(m, "GenerateArgs")
      .def(py::init<>())
      .def_readwrite("model_dir", &bp::cli::GenerateArgs::model_dir)
      .def_readwrite("adapter_dir", &bp::cli::GenerateArgs::adapter_dir)
      .def_readwrite("prompt", &bp::cli::GenerateArgs::prompt)
      .def_readwrite("system", &bp::cli::GenerateArgs::system)
      .def_readwrite("max_new_tokens", &bp::cli::GenerateArgs::max_new_tokens)
      .def_readwrite("temperature", &bp::cli::GenerateArgs::temperature)
      .def_readwrite("top_p", &bp::cli::GenerateArgs::top_p)
      .def_readwrite("top_k", &bp::cli::GenerateArgs::top_k)
      .def_readwrite("seed", &bp::cli::GenerateArgs::seed);
  m.def("validate", &validate);
  m.def("generate", &generate);
  m.def("doctor_text", &doctor_text);
  m.def("doctor_file", &doctor_file);
  m.def("runs", &runs);
  m.def("load_run", &load_run);
}
