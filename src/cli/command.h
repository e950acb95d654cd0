// Subcommand registry. Each src/cli/cmd_<name>.cpp registers itself with BP_REGISTER_COMMAND;
// main.cpp builds the CLI11 app from the registry, so adding a command touches no other file.
//
// A command's setup function adds its options to `sub` and returns the function that runs it.
// Run functions return an exit code (0 ok, 3 partial success) and throw bp::Error for failures;
// main.cpp prints errors ([ERROR] [CODE] message / Run id / Suggestion, or a JSON envelope with
// --json) and maps them to exit codes (1 user error, 2 runtime error, 130 interrupted).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.h"
#include "core/settings.h"

namespace bp::cli {

// Options every command shares (set by main before the command runs).
struct GlobalOptions {
  bool json = false;        // --json: machine-readable output and error envelope
  std::string config_path;  // --config FILE (TOML)
};
GlobalOptions& global_options();

// The settings of this invocation, loaded by main after parsing (defaults < --config TOML <
// BACKPROPAGATE_* environment < flags). Valid inside run functions.
const Settings& settings();
// The same settings to replace (main after parsing; the Python package before it calls a
// command's function), and the values the bound flags collected (main passes them to Settings::load).
Settings& mutable_settings();
std::vector<SettingOverride>& flag_overrides();
// Adds flags for these settings to a subcommand (names, types and help come from the settings
// table): `bind_settings(sub, {"training.lr", "training.steps"})` gives --lr and --steps.
void bind_settings(CLI::App& sub, std::initializer_list<std::string_view> keys);
// Adds a flag for every setting (with a flag) for which `takes` is true: a command that takes whole
// sections binds them this way, so a new row needs no edit here.
void bind_settings_where(CLI::App& sub, const std::function<bool(const SettingSpec&)>& takes);

// The settings every command takes, bound on the app itself (`backprop --log-level debug train ...`).
inline constexpr std::string_view kGlobalSettingKeys[] = {"logging.level",       "logging.format",
                                                          "logging.file",        "security.redact_secrets",
                                                          "runtime.cpu_kernels", "runtime.cpu_gemm"};
void bind_global_settings(CLI::App& app);
// What those settings do for the whole process: logging (console records to `console_handler`
// when one is given: the Python package's `logging`), the CPU kernel variant and GEMM engine.
void apply_global_settings(const Settings& s, log::ConsoleHandler console_handler = {});

using RunFn = std::function<int()>;
using SetupFn = RunFn (*)(CLI::App& sub);

struct CommandSpec {
  const char* name;
  const char* help;
  SetupFn setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* help, SetupFn setup) {
    command_registry().push_back({name, help, setup});
  }
};

#define BP_REGISTER_COMMAND(name, help, setup) \
  static ::bp::cli::CommandRegistrar bp_command_registrar_##setup(name, help, setup)

}  // namespace bp::cli
