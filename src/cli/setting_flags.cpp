// CLI11 options from the settings table (cli/setting_flags.h): moved out of core/ so that only
// cli/ depends on CLI11.
#include "cli/setting_flags.h"

#include <fmt/format.h>

#include "core/error.h"

namespace bp {

namespace {

// A testing setting's option goes in the group "", which CLI11 leaves out of --help.
CLI::Option* placed(const SettingSpec* spec, CLI::Option* opt) {
  return is_testing_setting(*spec) ? opt->group("") : opt;
}

void bind_one(CLI::App& app, std::vector<SettingOverride>& out, const SettingSpec* spec) {
  {
    const std::string_view key = spec->key;
    std::string flag = spec->flag;
    std::string help =
        fmt::format("{} [{}; default: {}; {} / {}]", spec->help, setting_allowed_text(*spec),
                    spec->default_value[0] ? spec->default_value : "\"\"", spec->key, setting_env_var(*spec));
    std::string k(key);
    if (is_auto_bool(*spec)) {  // --x (= true), --x=auto|true|false, --no-x (= false)
      placed(spec, app.add_option_function<std::string>(
                       flag,
                       [&out, k](const std::string& v) {
                         out.push_back({k, v.empty() ? "true" : v});  // bare --x
                       },
                       help))
          ->expected(0, 1)
          ->type_name("[auto|true|false]");
      placed(spec, app.add_flag_function(
                       "--no-" + flag.substr(2),
                       [&out, k](int64_t) {
                         out.push_back({k, "false"});
                       },
                       fmt::format("Same as {}=false", flag)));
    } else if (spec->type == SettingType::Bool) {
      std::string names = flag + ",!--no-" + flag.substr(2);
      placed(spec, app.add_flag_function(
                       names,
                       [&out, k](int64_t n) {
                         out.push_back({k, n > 0 ? "true" : "false"});
                       },
                       help));
    } else {
      const char* type_name = spec->type == SettingType::Int     ? "INT"
                              : spec->type == SettingType::Float ? "FLOAT"
                              : spec->type == SettingType::Enum  ? "CHOICE"
                                                                 : "TEXT";
      placed(spec, app.add_option_function<std::string>(
                       flag,
                       [&out, k](const std::string& v) {
                         out.push_back({k, v});
                       },
                       help))
          ->type_name(type_name);
    }
  }
}

}  // namespace

void bind_setting_flags(CLI::App& app, std::vector<SettingOverride>& out,
                        std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) {
    const SettingSpec* spec = find_setting(key);
    BP_CHECK(spec, "[settings] bind_setting_flags: no setting named '{}'", key);
    BP_CHECK(spec->flag[0], "[settings] bind_setting_flags: {} has no flag", key);
    bind_one(app, out, spec);
  }
}

void bind_setting_flags_where(CLI::App& app, std::vector<SettingOverride>& out,
                              const std::function<bool(const SettingSpec&)>& takes) {
  for (const SettingSpec& spec : settings_registry())
    if (spec.flag[0] && takes(spec)) bind_one(app, out, &spec);
}

}  // namespace bp
