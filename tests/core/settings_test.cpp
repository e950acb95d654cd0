// Settings registry: every key is well-formed, layering defaults < TOML < env < flags, booleans,
// unknown keys, wrong types and ranges all fail with CONFIG_INVALID_SETTING naming key and value.
#include "core/settings.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "support/expect_error.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::expect_error;

TEST(SettingsRegistry, EveryKeyIsWellFormedAndItsDefaultIsValid) {
  std::set<std::string> sections(setting_sections().begin(), setting_sections().end());
  std::set<std::string> keys, seen_sections;
  for (const auto& s : settings_registry()) {
    std::string key = s.key;
    EXPECT_TRUE(keys.insert(key).second) << "duplicate " << key;
    size_t dot = key.find('.');
    ASSERT_NE(dot, std::string::npos) << key;
    EXPECT_TRUE(sections.count(key.substr(0, dot))) << key;
    seen_sections.insert(key.substr(0, dot));
    EXPECT_GT(std::string(s.help).size(), 10u) << key;
    if (s.flag[0]) {
      EXPECT_EQ(std::string(s.flag).rfind("--", 0), 0u) << key;
    }
    if (s.type == SettingType::Int || s.type == SettingType::Float) {
      EXPECT_LE(s.min, s.max) << key;
    }
    if (s.type == SettingType::Enum) {
      EXPECT_NE(std::string(s.choices).find('|'), std::string::npos) << key;
    }
  }
  EXPECT_EQ(seen_sections, sections);  // every section has keys
  Settings defaults;                   // parses every default with the normal rules: throws if one is bad
  EXPECT_EQ(defaults.get_int("lora.r"), 16);
  EXPECT_DOUBLE_EQ(defaults.get_float("lora.alpha"), 32.0);
  EXPECT_DOUBLE_EQ(defaults.get_float("lora.dropout"), 0.0);  // PEFT's LoraConfig default
  EXPECT_EQ(defaults.get_string("lora.target_modules"), "all-linear");
  EXPECT_EQ(defaults.get_int("training.nan_guard_max_consecutive"), 3);
  EXPECT_EQ(defaults.get_string("training.micro_batch_size"), "auto");
  EXPECT_TRUE(defaults.get_bool("training.oom_recovery"));
  EXPECT_EQ(defaults.source("training.lr"), SettingSource::Default);
}

TEST(SettingsRegistry, KeysLaterCommandsNeedExist) {
  for (const char* k : {"model.path",
                        "model.base_dtype",
                        "model.device",
                        "lora.use_rslora",
                        "training.mode",
                        "training.steps",
                        "training.epochs",
                        "training.batch_size",
                        "training.grad_accum",
                        "training.lr_scheduler",
                        "training.warmup_steps",
                        "training.weight_decay",
                        "training.max_grad_norm",
                        "training.max_seq_length",
                        "training.gradient_checkpointing",
                        "training.seed",
                        "training.eval_every",
                        "training.save_every",
                        "training.keep_checkpoints",
                        "training.output",
                        "training.resume",
                        "training.max_memory",
                        "training.threads",
                        "training.init_from_config",
                        "training.fault_inject_oom_step",
                        "training.fault_inject_nan_step",
                        "data.path",
                        "data.format",
                        "data.holdout",
                        "data.strict",
                        "data.train_on_all",
                        "data.max_errors",
                        "data.shuffle",
                        "export.format",
                        "export.quantization",
                        "export.output",
                        "export.ollama",
                        "export.ollama_name",
                        "export.ollama_host",
                        "security.redact_secrets",
                        "logging.level",
                        "logging.format",
                        "logging.file"})
    EXPECT_NE(find_setting(k), nullptr) << k;
  EXPECT_EQ(setting_env_var(*find_setting("training.oom_recovery")), "BACKPROPAGATE_TRAINING__OOM_RECOVERY");
}

TEST(Settings, LayersDefaultsThenTomlThenEnvThenFlags) {
  test::TempDir dir;
  std::string path = dir.path + "/c.toml";
  std::ofstream(path) << "[training]\nlr = 0.001\nsteps = 50\nseed = 7\n[lora]\nr = 8\n";
  Environment env = {{"BACKPROPAGATE_TRAINING__LR", "0.002"},
                     {"BACKPROPAGATE_TRAINING__STEPS", "60"},
                     {"PATH", "/usr/bin"},
                     {"BACKPROPAGATEX", "not ours"}};
  Settings s = Settings::load(path, env, {{"training.lr", "0.003"}});
  EXPECT_DOUBLE_EQ(s.get_float("training.lr"), 0.003);
  EXPECT_EQ(s.source("training.lr"), SettingSource::Flag);
  EXPECT_EQ(s.get_int("training.steps"), 60);
  EXPECT_EQ(s.source("training.steps"), SettingSource::Env);
  EXPECT_EQ(s.get_int("training.seed"), 7);
  EXPECT_EQ(s.source("training.seed"), SettingSource::Toml);
  EXPECT_EQ(s.get_int("lora.r"), 8);
  EXPECT_EQ(s.get_int("training.batch_size"), 8);
  EXPECT_EQ(s.source("training.batch_size"), SettingSource::Default);
}

TEST(Settings, BooleansAcceptTrueFalseOneZeroYesNo) {
  for (auto [text, want] : std::vector<std::pair<std::string, bool>>{
           {"true", true}, {"false", false}, {"1", true}, {"0", false}, {"yes", true}, {"no", false}, {"YES", true}}) {
    Settings s = Settings::load("", {{"BACKPROPAGATE_TRAINING__OOM_RECOVERY", text}}, {});
    EXPECT_EQ(s.get_bool("training.oom_recovery"), want) << text;
  }
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_TRAINING__OOM_RECOVERY", "maybe"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.oom_recovery", "maybe", "true|false|1|0|yes|no"});
  test::TempDir dir;
  std::ofstream(dir.path + "/b.toml") << "[data]\nstrict = true\nshuffle = \"no\"\n";
  Settings s = Settings::load(dir.path + "/b.toml", {}, {});
  EXPECT_TRUE(s.get_bool("data.strict"));
  EXPECT_FALSE(s.get_bool("data.shuffle"));
}

TEST(Settings, UnknownKeysFailEverywhere) {
  test::TempDir dir;
  std::ofstream(dir.path + "/u.toml") << "[training]\nlrr = 0.1\n";
  expect_error([&] { Settings::load(dir.path + "/u.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"training.lrr", "did you mean training.lr"});
  std::ofstream(dir.path + "/s.toml") << "[trainng]\nlr = 0.1\n";
  expect_error([&] { Settings::load(dir.path + "/s.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"trainng.lr"});
  std::ofstream(dir.path + "/top.toml") << "lr = 0.1\n";
  expect_error([&] { Settings::load(dir.path + "/top.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING, {"lr"});
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_TRAINING__NOPE", "1"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"BACKPROPAGATE_TRAINING__NOPE"});
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_DEBUG", "1"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"BACKPROPAGATE_DEBUG"});
  // single underscore between section and key is not the documented form
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_TRAINING_LR", "1"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"BACKPROPAGATE_TRAINING_LR"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.nope", "1"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.nope"});
}

TEST(Settings, WrongTypesAndRangesNameKeyValueAndAllowed) {
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_TRAINING__LR", "fast"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.lr", "'fast'", "BACKPROPAGATE_TRAINING__LR", "0 to 10"});
  expect_error(
      [] {
        Settings::load("", {}, {{"lora.r", "0"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"lora.r", "'0'", "1 to 4096"});
  expect_error(
      [] {
        Settings::load("", {}, {{"export.ollama_retries", "70000"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"export.ollama_retries", "70000", "0 to 20"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.steps", "12x"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.steps", "12x"});
  expect_error(
      [] {
        Settings::load("", {}, {{"lora.dropout", "nan"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"lora.dropout"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.lr_scheduler", "step"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.lr_scheduler", "cosine|linear|constant"});
  expect_error(
      [] {
        Settings::load("", {}, {{"export.quantization", "q3"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"q4_k_m"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.micro_batch_size", "0"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.micro_batch_size", "auto or an integer"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.max_memory", "8Q"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.max_memory", "8Q"});
  // A memory budget of 0 (or less) would refuse every allocation: refused here, with the range.
  for (const char* bad : {"0", "0G", "-1", "-8G"})
    expect_error(
        [&] {
          Settings::load("", {}, {{"training.max_memory", bad}});
        },
        ErrorCode::CONFIG_INVALID_SETTING, {"training.max_memory", "at least 1 byte"});
  EXPECT_EQ(Settings::load("", {}, {{"training.max_memory", "1"}}).get_string("training.max_memory"), "1");
  EXPECT_EQ(Settings::load("", {}, {{"monitor.memory_headroom", "0"}}).get_string("monitor.memory_headroom"), "0");
  expect_error(
      [] {
        Settings::load("", {}, {{"model.device", "tpu"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"model.device", "cuda:N"});
  // settings of features this version does not have are unknown, not silently ignored
  expect_error(
      [] {
        Settings::load("", {{"BACKPROPAGATE_CLOUD__REGION", "eu"}}, {});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"unknown setting 'cloud.region'", "BACKPROPAGATE_CLOUD__REGION"});
  test::TempDir dir;
  std::ofstream(dir.path + "/t.toml") << "[training]\nsteps = 1.5\n";
  expect_error([&] { Settings::load(dir.path + "/t.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"training.steps", "float"});
  std::ofstream(dir.path + "/m.toml") << "[model]\npath = 3\n";
  expect_error([&] { Settings::load(dir.path + "/m.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"model.path", "integer"});
  std::ofstream(dir.path + "/r.toml") << "[training]\nlr = 20.0\n";
  expect_error([&] { Settings::load(dir.path + "/r.toml", {}, {}); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"training.lr", "20", "r.toml"});
}

TEST(Settings, BadTomlAndMissingFileAreConfigInvalid) {
  test::TempDir dir;
  std::ofstream(dir.path + "/bad.toml") << "[training\nlr = 1\n";
  expect_error([&] { Settings::load(dir.path + "/bad.toml", {}, {}); }, ErrorCode::CONFIG_INVALID, {"bad.toml:1"});
  expect_error([&] { Settings::load(dir.path + "/missing.toml", {}, {}); }, ErrorCode::CONFIG_INVALID,
               {"missing.toml"});
}

// A folder given as --config was read as an empty file and silently ignored.
TEST(Settings, ConfigNamingAFolderIsConfigInvalid) {
  test::TempDir dir;
  expect_error([&] { Settings::load(dir.path, {}, {}); }, ErrorCode::INPUT_FILE_NOT_REGULAR, {dir.path, "directory"});
}

// training.seed spans the whole uint64 range (it was "not an integer" past 2^63-1).
TEST(Settings, SeedTakesTheFullUint64Range) {
  Settings s = Settings::load("", {{"BACKPROPAGATE_TRAINING__SEED", "18446744073709551615"}}, {});
  EXPECT_EQ(s.get_uint("training.seed"), UINT64_MAX);
  EXPECT_EQ(s.text("training.seed"), "18446744073709551615");
  EXPECT_EQ(s.to_json()["training"]["seed"].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(Settings::load("", {}, {{"training.seed", "9223372036854775808"}}).get_uint("training.seed"),
            9223372036854775808ull);
  expect_error(
      [] {
        Settings::load("", {}, {{"training.seed", "18446744073709551616"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"training.seed", "18446744073709551615"});
  expect_error(
      [] {
        Settings::load("", {}, {{"training.seed", "-1"}});
      },
      ErrorCode::CONFIG_INVALID_SETTING, {"out of range"});
  expect_error([&] { s.get_int("training.seed"); }, ErrorCode::RUNTIME_INTERNAL, {"get_uint"});
  EXPECT_EQ(Settings::load("", {}, {{"training.seed", "7"}}).get_int("training.seed"), 7);  // fits: int64 is fine
}

// A password inside a URL setting is masked when shown (info --env-vars) and in settings.json.
TEST(Settings, UrlCredentialsAreMaskedWhenShown) {
  Settings s = Settings::load("", {}, {{"export.ollama_host", "http://alice:s3cretpw@box:8080"}});
  EXPECT_EQ(s.get_string("export.ollama_host"), "http://alice:s3cretpw@box:8080");  // the value itself is intact
  EXPECT_EQ(s.text("export.ollama_host").find("s3cretpw"), std::string::npos) << s.text("export.ollama_host");
  EXPECT_NE(s.text("export.ollama_host").find("box:8080"), std::string::npos);
  EXPECT_EQ(s.to_json().dump().find("s3cretpw"), std::string::npos);
  EXPECT_EQ(s.text("export.ollama_host", /*reveal_secrets=*/true), "http://alice:s3cretpw@box:8080");
}

TEST(Settings, StringRulesAndTypedAccess) {
  Settings s = Settings::load(
      "", {}, {{"training.micro_batch_size", "4"}, {"training.max_memory", "8G"}, {"model.device", "cuda:1"}});
  EXPECT_EQ(s.get_string("training.micro_batch_size"), "4");
  EXPECT_EQ(parse_byte_size(s.get_string("training.max_memory"), "training.max_memory"), 8ull << 30);
  EXPECT_EQ(parse_byte_size("512M", "k"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("1.5K", "k"), 1536u);
  EXPECT_EQ(parse_byte_size("2GB", "k"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1000", "k"), 1000u);
  expect_error([] { parse_byte_size("lots", "training.max_memory"); }, ErrorCode::CONFIG_INVALID_SETTING,
               {"lots", "training.max_memory"});
  // reading with the wrong type is a programming error, reported as RUNTIME_INTERNAL
  expect_error([&] { s.get_int("training.lr"); }, ErrorCode::RUNTIME_INTERNAL, {"training.lr"});
  expect_error([&] { s.get_bool("no.such"); }, ErrorCode::RUNTIME_INTERNAL, {"no.such"});
  // a TOML integer is fine for a float setting and for "auto"|N strings
  test::TempDir dir;
  std::ofstream(dir.path + "/i.toml") << "[training]\nlr = 1\nmicro_batch_size = 2\nmax_memory = 1048576\n";
  Settings t = Settings::load(dir.path + "/i.toml", {}, {});
  EXPECT_DOUBLE_EQ(t.get_float("training.lr"), 1.0);
  EXPECT_EQ(t.get_string("training.micro_batch_size"), "2");
}

}  // namespace
}  // namespace bp
