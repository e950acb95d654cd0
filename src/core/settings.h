// The settings registry (DESIGN.md "Settings"): every setting backprop has, in one table
// (settings_registry.inc), with its type, default, allowed values and help text.
//
// Layering, lowest to highest: defaults < TOML file (--config) < environment variables
// BACKPROPAGATE_<SECTION>__<KEY> < command-line flags. Every value from every layer is parsed and
// checked against the table; an unknown key (TOML or a BACKPROPAGATE_* variable), a wrong type or a
// value out of range throws CONFIG_INVALID_SETTING naming the key, the value and what is allowed.
// Nothing is silently ignored.
//
// Commands never add a flag that is not a setting: cli/setting_flags.h derives `--lr` etc. from the
// table's flag column, so `--lr`, `[training] lr` and BACKPROPAGATE_TRAINING__LR are one key.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bp {

enum class SettingType { Bool, Int, Float, String, Enum };

// Extra rule for String settings.
enum class StringRule {
  Any,
  AutoOrPositiveInt,  // "auto" or an integer >= 1 (micro_batch_size)
  AutoOrBytes,        // "auto", "none" or a size: 123, 512K, 8M, 2G, 1T (powers of 1024)
  Device,             // auto | cpu | cuda | cuda:N
  UserPass,           // empty or "user:password"
  Bytes,              // a size: 123, 512K, 8M, 2G, 1T (powers of 1024)
  JsonObject,         // empty or a JSON object: {"enable_thinking": false}
};

struct SettingSpec {
  const char* key;  // "training.lr" (section.key)
  SettingType type;
  const char* default_value;  // text form, parsed with the same rules as every other layer
  double min, max;            // inclusive range for Int and Float (max >= 1.8e19: a uint64, see get_uint)
  const char* choices;        // Enum: "cosine|linear|constant"; unused otherwise
  StringRule rule;            // String only
  const char* flag;           // command-line flag ("--lr"), or "" for none
  bool secret;                // shown as *** and redacted from logs
  const char* help;
};

// The names the rows of settings_registry.inc are written with (each file that expands it uses them).
namespace setting_rows {
using T = SettingType;
using R = StringRule;
inline constexpr double kNoMin = 0, kNoMax = 0;
inline constexpr double kI64Max = 9.2e18;
inline constexpr double kU64Max = 18446744073709551615.0;  // an Int with this max is read as a uint64 (get_uint)
}  // namespace setting_rows

// The whole table, in section order.
std::span<const SettingSpec> settings_registry();
const SettingSpec* find_setting(std::string_view key);
// The sections, in order (settings_table.cpp's kSections).
// A test aid (fault injection, a fake /proc): its help starts with "Testing:". Its flag is hidden
// from --help and it is listed in the Testing section of docs/settings.md.
bool is_testing_setting(const SettingSpec& spec);
// Enum auto|true|false (training.gradient_checkpointing): also takes the boolean spellings.
bool is_auto_bool(const SettingSpec& spec);
std::span<const char* const> setting_sections();
// "BACKPROPAGATE_TRAINING__LR" for "training.lr".
std::string setting_env_var(const SettingSpec& spec);
const char* setting_type_name(SettingType t);
// Human description of the allowed values: "0 to 10", "one of cosine|linear|constant", ...
std::string setting_allowed_text(const SettingSpec& spec);

// Every setting as a Markdown page (docs/settings.md is this text).
std::string settings_markdown();

// Preset: a value a --preset applied over the default (train/presets.h); any other layer beats it.
enum class SettingSource { Default, Preset, Toml, Env, Flag };
const char* setting_source_name(SettingSource s);  // "default" / "preset" / "toml" / "env" / "flag"

// A value named by key, as given on a command line (text form).
struct SettingOverride {
  std::string key;
  std::string text;
};

// Environment variables as name -> value.
using Environment = std::map<std::string, std::string>;
Environment current_environment();

// Size text ("8G", "512M", "1024") to bytes; throws CONFIG_INVALID_SETTING naming `key` when malformed.
uint64_t parse_byte_size(std::string_view text, std::string_view key);

class Settings {
 public:
  // All defaults.
  Settings();
  // The full layering: defaults, then the TOML file (when config_path is not empty), then every
  // BACKPROPAGATE_* variable in env, then the command-line overrides in order.
  static Settings load(const std::string& config_path, const Environment& env,
                       const std::vector<SettingOverride>& flags);

  void apply_toml_file(const std::string& path);
  void apply_toml_string(std::string_view toml_text, const std::string& origin = "<string>");
  void apply_environment(const Environment& env);
  // Parse `text` with the key's rules and store it with the given source.
  void set(std::string_view key, std::string_view text, SettingSource source = SettingSource::Flag);

  bool get_bool(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  // An Int setting whose max is 2^64-1 (training.seed): the full uint64 range.
  uint64_t get_uint(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;  // String and Enum settings
  SettingSource source(std::string_view key) const;
  // The value in text form (secrets shown as "***" unless reveal_secrets).
  std::string text(std::string_view key, bool reveal_secrets = false) const;
  // {"training": {"lr": 0.0002, ...}, ...} with secrets masked.
  nlohmann::json to_json() const;

 private:
  struct Value {
    bool b = false;
    int64_t i = 0;
    double f = 0.0;
    std::string s;
    SettingSource source = SettingSource::Default;
  };
  const Value& value(std::string_view key, SettingType want) const;
  void store(const SettingSpec& spec, Value v);
  std::map<std::string, Value, std::less<>> values_;
};

// A comma-separated list setting ("q_proj, v_proj") as its items, blanks trimmed, empty items dropped.
std::vector<std::string> split_list(const std::string& s);
// Sets the process-wide file size caps (core/file_read.h) from the limits.* settings.
// Settings::load calls it (with the environment alone before reading --config, then with all layers).
void apply_file_read_limits(const Settings& s);

}  // namespace bp
