// Command-line flags from the settings table (core/settings.h): `--lr` etc. come from the table's
// flag column, typed and documented from the row, so a flag, a TOML key and a BACKPROPAGATE_*
// variable are one setting. Lives in cli/: core parses and validates values, only cli/ knows CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "core/settings.h"

namespace bp {

// Adds one option to `app` per key. Values given on the command line are appended to `out` (text
// form) and take effect when passed to Settings::load. Bool settings accept `--flag`,
// `--flag=false` and `--no-flag`. A testing setting (is_testing_setting) gets a hidden flag: parsed,
// not listed in --help (docs/settings.md lists it under Testing).
// Throws RUNTIME_INTERNAL for a key that is not in the table or has no flag.
void bind_setting_flags(CLI::App& app, std::vector<SettingOverride>& out, std::initializer_list<std::string_view> keys);

// The same for every setting of the table that has a flag and for which `takes` is true.
void bind_setting_flags_where(CLI::App& app, std::vector<SettingOverride>& out,
                              const std::function<bool(const SettingSpec&)>& takes);

}  // namespace bp
