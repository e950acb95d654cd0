// The state every interface shares (cli/command.h): the command registry, the global options and
// this invocation's settings. Apart from main.cpp so that the Python package (src/python/), which
// links the same interface code, sets the settings the commands' functions read.
#include "cli/command.h"

#include "cli/setting_flags.h"
#include "ops/cpu_kernels.h"

namespace bp::cli {

GlobalOptions& global_options() {
  static GlobalOptions g;
  return g;
}

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> r;
  return r;
}

Settings& mutable_settings() {
  static Settings s;
  return s;
}

std::vector<SettingOverride>& flag_overrides() {
  static std::vector<SettingOverride> v;
  return v;
}

const Settings& settings() {
  return mutable_settings();
}

void bind_settings(CLI::App& sub, std::initializer_list<std::string_view> keys) {
  bind_setting_flags(sub, flag_overrides(), keys);
}

void bind_settings_where(CLI::App& sub, const std::function<bool(const SettingSpec&)>& takes) {
  bind_setting_flags_where(sub, flag_overrides(), takes);
}

void apply_global_settings(const Settings& s, log::ConsoleHandler console_handler) {
  log::init_from_settings(s, std::move(console_handler));
  ops::select_cpu_kernels(s.get_string("runtime.cpu_kernels"));
  ops::select_cpu_gemm(s.get_string("runtime.cpu_gemm"));
}

void bind_global_settings(CLI::App& app) {
  for (std::string_view key : kGlobalSettingKeys) bind_setting_flags(app, flag_overrides(), {key});
}

}  // namespace bp::cli
